// A small driver of the ring runner under mpiexec, with deterministic inputs on CPU ranks:
//   * side-by-side timing of shardings in one run (what `ringattn bench` reports, before the CLI);
//   * the "every rank exits non-zero with a message" checks of tests/mpi/CMakeLists.txt.
// On an error every rank prints it and the job is ended with Transport::abort, so a rank that
// fails alone never leaves the others waiting.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include "runner/faults/fault_injection.hpp"
#include "runner/problem/inputs.hpp"
#include "comm/mpi_transport.hpp"
#include "runner/ring/ring.hpp"

namespace ringattn {
namespace {

struct DriverOptions {
  int64_t n = 4096, batch = 1, heads = 4, kv_heads = 0, dim = 64;  // kv_heads 0: = heads
  bool full = false;
  std::string shardings = "contiguous,zigzag", dtype = "fp32", progress = "auto";
  int repeat = 3, warmup = 1;
  int bad_n_rank = -1;  // this rank describes a different length (tests of disagreement)
  int64_t bad_n_delta = 1;
};

// One rank's stats, gathered to rank 0 as plain doubles.
constexpr int kFields = 8;
void pack(const RankStats& s, double cpu_s, double* f) {
  f[0] = s.total_s, f[1] = s.compute_s, f[2] = s.exposed_comm_s, f[3] = s.transfer_s;
  f[4] = double(s.visible_pairs), f[5] = double(s.bytes_sent), f[6] = s.hidden_fraction(), f[7] = cpu_s;
}

// CPU seconds of the calling thread. With OMP_NUM_THREADS=1 the rank computes on this thread, so
// this is its compute cost even when oversubscribed ranks wait for a core (the wall time is not).
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

int run(const DriverOptions& o, Transport& t, Backend& backend) {
  const int P = t.size(), r = t.rank();
  std::vector<std::string> names;
  std::stringstream ss(o.shardings);
  for (std::string s; std::getline(ss, s, ',');) names.push_back(s);
  if (r == 0)
    std::printf("# ring attention, CPU ranks: P=%d N=%lld B=%lld Hq=%lld Hkv=%lld D=%lld %s %s, transport %s, best of %d by wall time\n"
                "%-11s %9s %9s %9s %8s %9s %9s %8s %12s %9s %9s\n",
                P, (long long)o.n, (long long)o.batch, (long long)o.heads, (long long)(o.kv_heads > 0 ? o.kv_heads : o.heads), (long long)o.dim,
                o.full ? "full" : "causal", o.dtype.c_str(), t.name().c_str(), o.repeat, "sharding", "wall_s",
                "comp_min", "comp_max", "imbal", "pair_imb", "exposed", "hidden", "bytes/rank", "cpu_min", "cpu_max");
  for (const std::string& name : names) {
    GlobalProblem p;
    p.batch = o.batch, p.q_heads = o.heads, p.kv_heads = o.kv_heads > 0 ? o.kv_heads : o.heads, p.head_dim = o.dim;
    p.q_len = p.kv_len = o.n + (r == o.bad_n_rank ? o.bad_n_delta : 0);
    p.causal = !o.full;
    p.dtype = parse_dtype(o.dtype);
    p.sharding = parse_sharding(name);
    validate_problem(p, P);  // local: a length that cannot work stops here, before any communication
    const ShardLayout l = shard_layout(p.sharding, p.q_len, r, P);
    const int64_t T = l.tokens();
    const size_t es = size_t(dtype_size(p.dtype));
    std::vector<uint8_t> q(size_t(p.batch * p.q_heads * T * p.head_dim) * es), out(q.size()),
        k(size_t(p.batch * p.kv_heads * T * p.head_dim) * es), v(k.size());
    LocalTensors x{bhtd_view(q.data(), p.dtype, p.batch, p.q_heads, T, p.head_dim),
                   bhtd_view(k.data(), p.dtype, p.batch, p.kv_heads, T, p.head_dim),
                   bhtd_view(v.data(), p.dtype, p.batch, p.kv_heads, T, p.head_dim),
                   bhtd_view(out.data(), p.dtype, p.batch, p.q_heads, T, p.head_dim), nullptr};
    int64_t row = 0;
    for (const Segment& s : l.segments) {
      fill_input(x.q.rows(row, s.len), 1234, InputTensor::Q, s.start, s.stride);
      fill_input(x.k.rows(row, s.len), 1234, InputTensor::K, s.start, s.stride);
      fill_input(x.v.rows(row, s.len), 1234, InputTensor::V, s.start, s.stride);
      row += s.len;
    }
    for (int i = 0; i < o.warmup; ++i) run_ring_attention(p, x, backend, t);
    // Best of `repeat` by the slowest rank's total time (the job's wall time).
    std::vector<double> best(size_t(kFields * P), 0.0);
    double best_wall = 1e300;
    for (int i = 0; i < std::max(1, o.repeat); ++i) {
      t.barrier();  // start together: the wall time is the ring's, not a straggler's
      const double c0 = thread_cpu_s();
      const RankStats st = run_ring_attention(p, x, backend, t);
      double mine[kFields];
      pack(st, thread_cpu_s() - c0, mine);
      std::vector<double> all(size_t(kFields * P));
      t.allgather(mine, all.data(), sizeof(mine));
      double wall = 0;
      for (int q = 0; q < P; ++q) wall = std::max(wall, all[size_t(kFields * q)]);
      if (wall < best_wall) best_wall = wall, best = all;
    }
    if (r != 0) continue;
    double cmin = 1e300, cmax = 0, pmin = 1e300, pmax = 0, exposed = 0, hidden = 0, umin = 1e300, umax = 0;
    for (int q = 0; q < P; ++q) {
      const double* f = &best[size_t(kFields * q)];
      cmin = std::min(cmin, f[1]), cmax = std::max(cmax, f[1]);
      pmin = std::min(pmin, f[4]), pmax = std::max(pmax, f[4]);
      exposed = std::max(exposed, f[2]);
      umin = std::min(umin, f[7]), umax = std::max(umax, f[7]);
      hidden = f[6] < 0 || hidden < 0 ? -1.0 : hidden + f[6] / P;  // -1: some rank could not measure
    }
    char hidden_text[16] = "n/a";
    if (hidden >= 0) std::snprintf(hidden_text, sizeof(hidden_text), "%.2f", hidden);
    std::printf("%-11s %9.4f %9.4f %9.4f %8.3f %9.3f %9.4f %8s %12.0f %9.4f %9.4f\n", name.c_str(), best_wall, cmin,
                cmax, cmax / cmin, pmax / std::max(pmin, 1.0), exposed, hidden_text, best[5], umin, umax);
  }
  return 0;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  using namespace ringattn;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  DriverOptions o;
  CLI::App app{"ring attention driver on CPU ranks (tests and side-by-side timing)"};
  app.add_option("--n", o.n, "global sequence length");
  app.add_option("--batch", o.batch);
  app.add_option("--heads", o.heads);
  app.add_option("--kv-heads", o.kv_heads);
  app.add_option("--dim", o.dim);
  app.add_flag("--full", o.full, "non-causal attention (default causal)");
  app.add_option("--shardings", o.shardings, "comma-separated: contiguous,zigzag,striped");
  app.add_option("--dtype", o.dtype);
  app.add_option("--progress", o.progress, "MPI progress: auto, thread, nonblocking");
  app.add_option("--repeat", o.repeat);
  app.add_option("--warmup", o.warmup);
  app.add_option("--bad-n-rank", o.bad_n_rank, "this rank uses N + bad-n-delta (disagreement tests)");
  app.add_option("--bad-n-delta", o.bad_n_delta);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  std::unique_ptr<Transport> t;
  try {
    const MpiProgress mode = o.progress == "thread"        ? MpiProgress::HelperThread
                             : o.progress == "nonblocking" ? MpiProgress::Nonblocking
                                                           : MpiProgress::Auto;
    t = make_mpi_transport(MPI_COMM_WORLD, mode);
    std::unique_ptr<Backend> backend = make_cpu_backend();
    install_fault_injection(t, backend);  // RINGATTN_FAULT: the failure tests of tests/mpi/CMakeLists.txt
    run(o, *t, *backend);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringattn_ring_driver: rank %d: error: %s\n", rank, e.what());
    std::fflush(stderr);
    if (size > 1) {
      if (t) t->abort(3);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MPI_Finalize();
    return 3;
  }
  t.reset();
  MPI_Finalize();
  return 0;
}
