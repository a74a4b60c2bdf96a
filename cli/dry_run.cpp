// `ringattn run --dry-run`: everything a run checks before its first kernel, and a report of
// where each rank runs, without the attention: the MPI world against the launcher, the
// transport, a per-rank host/device/version table, the problem's validation and shardability,
// the ranks' agreement on it, one small exchange around the ring, and the library versions
// every rank loaded. Exit 0 when all hold, non-zero (every rank alike) when one does not.
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/backward.hpp"
#include "cli/context_parallel.hpp"
#include "cli/flags.hpp"
#include "cli/gather.hpp"
#include "cli/input_agreement.hpp"
#include "cli/outputs.hpp"
#include "cli/problem.hpp"
#include "cli/report.hpp"
#include "cli/run.hpp"
#include "core/host.hpp"
#include "runner/diagnostics/log.hpp"
#ifdef RINGATTN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef RINGATTN_HAVE_NCCL
#include <nccl.h>
#endif

namespace ringattn::cli {
namespace {

// One rank's line of the table, fixed-size so that it travels in one allgather.
struct RankInfo {
  int rank = 0, local_rank = 0, cuda_runtime = 0, cuda_driver = 0, nccl = 0;
  char host[64] = {}, device[48] = {}, mpi[96] = {};
};

void copy_text(char* dst, size_t n, const std::string& s) { std::strncpy(dst, s.c_str(), n - 1); }

RankInfo my_info(const World& w) {
  RankInfo i;
  i.rank = w.rank;
  i.local_rank = env_local_rank();
  copy_text(i.host, sizeof(i.host), host_name());
  copy_text(i.device, sizeof(i.device), w.device_label);
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(version, &len);  // allowed before MPI_Init (a world of one)
  std::string lib(version, size_t(len));
  copy_text(i.mpi, sizeof(i.mpi), lib.substr(0, lib.find_first_of(",\n")));
#ifdef RINGATTN_HAVE_CUDA
  cudaRuntimeGetVersion(&i.cuda_runtime);
  cudaDriverGetVersion(&i.cuda_driver);
#endif
#ifdef RINGATTN_HAVE_NCCL
  ncclGetVersion(&i.nccl);
#endif
  return i;
}

std::string version_text(int v) { return v > 0 ? std::to_string(v) : std::string("-"); }

// The first rank whose loaded libraries differ from rank 0's; "" when all agree.
std::string version_mismatch(const std::vector<RankInfo>& all) {
  for (const RankInfo& i : all) {
    const RankInfo& z = all[0];
    if (std::strcmp(i.mpi, z.mpi) != 0 || i.cuda_runtime != z.cuda_runtime || i.nccl != z.nccl)
      return fmt::format("rank {} on {} loaded MPI '{}', CUDA runtime {}, NCCL {} but rank 0 on {} loaded '{}', {}, {}: "
                         "run every rank with the same build and libraries", i.rank, i.host, i.mpi,
                         version_text(i.cuda_runtime), version_text(i.nccl), z.host, z.mpi,
                         version_text(z.cuda_runtime), version_text(z.nccl));
  }
  return "";
}

// One exchange of each rank's number around the ring, through the transport and the backend's
// memory as a run would use them: proves the neighbours can reach each other.
std::string ring_exchange(World& w) {
  if (w.size == 1) return "";
  Backend& b = *w.backend;
  const bool device = b.device_memory() && w.transport->accepts_device_memory();
  const int64_t mine = w.rank;
  int64_t got = -1;
  DeviceBuffer send, recv;
  if (device) {
    send = DeviceBuffer(b, sizeof(int64_t));
    recv = DeviceBuffer(b, sizeof(int64_t));
    b.copy_from_host(send.get(), &mine, sizeof(mine));
    b.synchronize();
    if (b.stream() != nullptr) w.transport->set_stream(b.stream());
    w.transport->start_exchange(send.get(), sizeof(int64_t), recv.get(), sizeof(int64_t));
    w.transport->wait_exchange();
    b.copy_to_host(&got, recv.get(), sizeof(got));
    b.synchronize();
  } else {
    w.transport->start_exchange(&mine, sizeof(int64_t), &got, sizeof(int64_t));
    w.transport->wait_exchange();
  }
  const int prev = (w.rank + w.size - 1) % w.size;
  if (got != prev)
    return fmt::format("rank {}: the ring exchange delivered {} where rank {}'s number was expected", w.rank, got, prev);
  return "";
}

// --cp groups of U > 1 ranks: the split of the world into them, and one all-to-all of every
// rank's world rank inside each (host memory, as the run's).
std::string group_exchange(World& w, int U) {
  if (U <= 1) return "";
  const CpTransports cp = split_cp(*w.transport, U);
  const std::vector<int64_t> mine(size_t(U), w.rank);
  std::vector<int64_t> got(size_t(U), -1);
  const std::vector<size_t> n(size_t(U), sizeof(int64_t));
  cp.group->alltoall(mine.data(), n, got.data(), n);
  for (int u = 0; u < U; ++u)
    if (const int64_t want = w.rank - w.rank % U + u; got[size_t(u)] != want)
      return fmt::format("rank {}: the all-to-all of its group delivered {} where rank {}'s number was expected",
                         w.rank, got[size_t(u)], want);
  return "";
}

}  // namespace

int dry_run_on(const CommandLine& cl, World& w) {
  const RunOptions& o = cl.run;
  Transport& t = *w.transport;
  const RankInfo mine = my_info(w);
  std::vector<RankInfo> all(size_t(w.size));
  t.allgather(&mine, all.data(), sizeof(RankInfo));

  std::FILE* f = stdout;
  std::string launcher;
  const int announced = launcher_world_size(&launcher);
  if (w.rank == 0) {
    fmt::print(f, "# ringattn dry run: world {} over {} ({}); launcher {}; --timeout {:g} s (first hop {:g} s)\n",
               w.size, w.transport_name, t.name(), announced > 1 ? launcher : std::string("none (a world of one)"),
               w.timeout_s, 3 * w.timeout_s);
    fmt::print(f, "# {:>4}  {:<16} {:>5}  {:<18} {:<28} {:>8} {:>8} {:>6}\n", "rank", "host", "local", "device", "mpi",
               "cuda_rt", "driver", "nccl");
    for (const RankInfo& i : all)
      fmt::print(f, "  {:>4}  {:<16} {:>5}  {:<18} {:<28} {:>8} {:>8} {:>6}\n", i.rank, i.host, i.local_rank, i.device,
                 i.mpi, version_text(i.cuda_runtime), version_text(i.cuda_driver), version_text(i.nccl));
    std::fflush(f);
  }
  if (const std::string e = version_mismatch(all); !e.empty()) throw CollectiveError(e);  // all ranks see `all`

  // The problem: the same local validation a run does, then the ranks' agreement on it.
  ProblemSetup setup;
  const int code = agreed_step(t, [&] {
    setup = prepare_run(o, w);  // everything the run checks before it computes
    return o.check_finite ? check_finite_before_run(o, setup, w) : std::string();  // and --check-finite's verdict
  });
  if (code != kExitOk) return kExitError;
  const GlobalProblem& p = setup.problem;
  agree_on_loaded_inputs(p, input_files_of(o), t);
  const std::string ring_error = ring_exchange(w);
  if (agree_on_errors(t, ring_error.empty() ? kExitOk : kExitError, ring_error) != kExitOk) return kExitError;
  const std::string group_error = group_exchange(w, setup.cp_group);
  if (agree_on_errors(t, group_error.empty() ? kExitOk : kExitError, group_error) != kExitOk) return kExitError;

  if (w.rank == 0) {
    // Ranks' query tokens: the smallest and largest shard (uneven shards differ by a token or two).
    int64_t tmin = 0, tmax = 0;
    const std::vector<ShardLayout> layouts = all_layouts(p, ring_of(setup.ring), w.size, false, setup.cp_group);
    for (size_t r = 0; r < layouts.size(); ++r) {
      if (r == 0 || layouts[r].tokens() < tmin) tmin = layouts[r].tokens();
      if (r == 0 || layouts[r].tokens() > tmax) tmax = layouts[r].tokens();
    }
    fmt::print(f, "problem  ok: {}{}\n", problem_line(p), o.backward ? ", forward and backward" : "");
    fmt::print(f, "flags    ok: {}\n", given_flags_line(cl));
    const int U = setup.cp_group;
    fmt::print(f, "shards   ok: {} over {}, {} query tokens per rank\n",
               p.is_ring() ? fmt::format("{} sharding", sharding_name(p.sharding)) : std::string("decode KV split"),
               U > 1 ? fmt::format("{} groups of {} ranks (--cp {}: the all-to-all cuts a group's rows {} ways)",
                                   w.size / U, U, o.problem.cp, U)
                     : fmt::format("{} ranks", w.size),
               tmin == tmax ? std::to_string(tmin) : fmt::format("{} to {}", tmin, tmax));
    fmt::print(f, "agree    ok: every rank was started with the same flags, describes the same problem and loaded "
               "the same libraries\n");
    if (!o.out_file.empty() || !o.lse_file.empty() || !o.dq_file.empty() || !o.dk_file.empty() ||
        !o.dv_file.empty() || (!o.json_file.empty() && o.json_file != "-"))
      fmt::print(f, "outputs  ok: every output file can be created and names a file of its own\n");
    if (w.fault.active())
      fmt::print(f, "faults   ok: {} fires in the run, at a hop that carries a block (not in a dry run)\n",
                 w.fault.text());
    fmt::print(f, "ring     ok: {}\n", w.size > 1 ? fmt::format("one exchange around the ring of {} ranks", w.size)
                                               : std::string("a world of one (no exchange)"));
    if (U > 1)
      fmt::print(f, "groups   ok: one all-to-all inside each of the {} groups of {} consecutive ranks\n", w.size / U, U);
    fmt::print(f, "dry run: OK (no attention was computed)\n");
    std::fflush(f);
  }
  return agree_exit_code(t, kExitOk);
}

}  // namespace ringattn::cli
