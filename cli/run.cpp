// `ringattn run`: one problem, once, on every rank of the world (a world of one without mpirun).
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/backward.hpp"
#include "cli/check.hpp"
#include "cli/context_parallel.hpp"
#include "cli/finite.hpp"
#include "cli/flags.hpp"
#include "cli/gather.hpp"
#include "cli/input_agreement.hpp"
#include "cli/outputs.hpp"
#include "cli/problem.hpp"
#include "cli/report.hpp"
#include "cli/run.hpp"
#include "core/timer.hpp"
#include "runner/faults/fault.hpp"
#include "runner/ring/warm_ring.hpp"

namespace ringattn::cli {
namespace {

void print_run_report(std::FILE* f, const CommandLine& cl, const GlobalProblem& p, const World& w, int cp_group,
                      const std::vector<RankReport>& all, const Summary& s, bool checked) {
  fmt::print(f, "# ringattn run: {}\n", problem_line(p));
  fmt::print(f, "# flags: {}\n", given_flags_line(cl));
  fmt::print(f, "# world {}, transport {}{}\n", w.size, w.transport_name, cp_suffix(cp_group, w.size));
  fmt::print(f, "# {:>4}  {:<16} {:<18} {:>9} {:>9} {:>11} {:>11} {:>8} {:>11} {:>11} {:>11}\n", "rank", "host", "device",
             "setup_ms", "wall_ms", "compute_ms", "exposed_ms", "hidden%", "sent", "peak_rss", "workspace");
  for (const RankReport& r : all)
    fmt::print(f, "  {:>4}  {:<16} {:<18} {:>9.2f} {:>9.2f} {:>11.2f} {:>11.2f} {:>8} {:>11} {:>11} {:>11}\n", r.rank,
               r.host, r.device, r.setup_s * 1e3, r.wall_s * 1e3, r.compute_s * 1e3, r.exposed_comm_s * 1e3,
               r.hidden >= 0 ? fmt::format("{:.1f}", 100 * r.hidden) : std::string("n/a"), human_bytes(double(r.bytes_sent)),
               human_bytes(double(r.peak_rss)), human_bytes(double(r.workspace)));
  const double flops = attention_flops(p);
  fmt::print(f, "time     {:.3f} ms (slowest rank, the attention alone)\n", s.wall_s * 1e3);
  fmt::print(f, "rate     {} ({:.3f} GFLOP = 4 x batch x heads x dim x visible query-key pairs)\n",
             rate_string(flops, s.wall_s), flops / 1e9);
  fmt::print(f, "setup    {:.3f} ms (slowest rank; not in the time above): world {:.3f} ms, inputs {:.3f} ms, ring "
             "warm-up {}\n", s.setup_s * 1e3, s.world_s * 1e3, s.inputs_s * 1e3,
             s.warm_s >= 0 ? fmt::format("{:.3f} ms", s.warm_s * 1e3) : std::string("none"));
  fmt::print(f, "memory   peak rss {} (largest rank), workspace {} (largest rank, backend allocations)\n",
             human_bytes(double(s.peak_rss)), human_bytes(double(s.workspace)));
  if (checked) {
    const Tolerance t = dtype_info(p.dtype).tolerance;
    fmt::print(f, "check    {} of {} rows{}: max abs {:.3e}, max rel {:.3e}, max lse abs {:.3e}, non-finite {}, over "
               "tolerance {} -> {}\n",
               s.rows_checked, s.rows_total, s.rows_checked == s.rows_total ? " (all)" : " (seeded sample)", s.max_abs,
               s.max_rel, s.max_lse_abs, s.nan_count, s.violations,
               s.nan_count == 0 && s.violations == 0 ? "OK" : "FAILED");
    fmt::print(f, "         tolerance {}: |o - ref| <= {:.0e} + {:.0e} |ref| + {:.0e} M, |lse - ref| <= {:.0e} + "
               "{:.0e} |ref| + dim 2^-24 M (M: the row's score magnitude, max(|lse_ref|, scale max_k sum |q k|))\n",
               dtype_name(p.dtype), t.atol, t.rtol, t.score_rtol, t.lse_atol, t.lse_rtol);
  }
  std::fflush(f);
}

// Which tensor holds the non-finite values: a NaN input leaves its rows at o = 0 and lse = -inf
// (the softmax of a row without a finite score), so the written output can be finite.
std::string nonfinite_message(const Summary& s) {
  return fmt::format("non-finite results: {} in the output, {} in the log-sum-exp (a NaN or Inf in q, k or v makes "
                     "the rows it reaches non-finite or o = 0 with lse = -inf; --check-finite names the first such "
                     "input)", s.nan_count - s.lse_nonfinite, s.lse_nonfinite);
}

}  // namespace

ProblemSetup prepare_run(const RunOptions& o, const World& w) {
  ProblemSetup setup = setup_problem(o.problem);
  validate_problem(setup.problem, w.size);
  const int U = setup.cp_group = cp_group_size(o.problem.cp, w.size);
  check_cp(o.problem.cp, setup.problem, U, w.backend->device_memory(), w.fault.active());
  if (U > 1)  // --shard auto resolves over the ring of the groups, which the hybrid run plans itself
    plan_ring(o.problem, setup.problem, w.size / U, w.rank / U);
  else
    setup.ring = plan_ring(o.problem, setup.problem, w.size, w.rank);
  if (o.backward) check_backward_setup(o, setup, w.size);
  check_fault_plan(w.fault, setup.problem, ring_of(setup.ring), w.size, o.backward);
  // Last: only rank 0 writes (the callers share its verdict), so a problem every rank meets is
  // what every rank reports first, one message, not rank 0's path beside the others' problem.
  if (w.rank == 0) check_run_outputs(o);
  return setup;
}

namespace {

// Warms the ring before the timed run: one untimed exchange of the real block size around it,
// through the same Transport, so that the transport's one-time set-up (NCCL builds a pair's peer
// connections at their first send/recv: about 200 ms on two H200s against 2.4 ms of attention at
// 16k tokens; MPI its shared-memory segments or queue pairs) lands in the setup and the printed
// rate is the attention's. Chosen over an untimed first run, which would also load the GPU
// kernels (their first launch stays in the timed run) but doubles the cost of every run (minutes
// for a long CPU run) and would run a faulty hop twice. Skipped (-1) where nothing
// connects: a world of one, a decode (no ring plan: its allgather runs over the collectives the
// agreement has already used), and under RINGATTN_FAULT, whose hop count starts at the run's
// first exchange. The block is the plan's (RingPlan::block_bytes: the ring's buffers).
double warm_up(const RingPlan* ring, World& w) {
  if (w.size <= 1 || ring == nullptr || w.fault.active()) return -1;
  const double s = warm_ring(*w.transport, *w.backend, ring->block_bytes());
  w.counter->reset_peak();  // the workspace reported is the run's
  return s;
}

// The warm-up of --cp's transports (as warm_up's, for the same reasons; skipped under a fault
// plan, which check_cp refuses anyway): one all-to-all of a few bytes inside the group, then one
// exchange around the ring across the groups of a K/V block of a group's rows (q_len / G, rounded
// up: every rank passes the same size) for this rank's heads.
double warm_cp(const GlobalProblem& p, const CpTransports& cp, World& w) {
  const auto t0 = std::chrono::steady_clock::now();
  const int U = cp.group_size;
  const std::vector<int64_t> mine(size_t(U), 0);
  std::vector<int64_t> got(size_t(U), 0);
  const std::vector<size_t> n(size_t(U), sizeof(int64_t));
  cp.group->alltoall(mine.data(), n, got.data(), n);
  if (cp.ring->size() > 1) {
    const int64_t G = cp.ring->size(), group_rows = (p.q_len + G - 1) / G;  // the same on every rank
    const size_t block = 2 * size_t(p.batch * (p.kv_heads / U) * group_rows * p.head_dim) * size_t(dtype_size(p.dtype));
    warm_ring(*cp.ring, *w.backend, std::max<size_t>(block, 1));
  }
  w.counter->reset_peak();
  return seconds_since(t0);
}

// The run's setup on this rank, apart from the attention: the world (MPI_Init, transport and
// NCCL communicator, backend and its device), the inputs (allocation and fill, the finite check)
// and the ring's warm-up (-1: none).
struct SetupTimes {
  double world_s = 0, inputs_s = 0, warm_s = -1;
  double total() const { return world_s + inputs_s + std::max(warm_s, 0.0); }
};

// Local phase: every rank reads its files and fills its shard. Errors here may hit one rank
// only (a missing file on one host), so they become an exit code all ranks agree on.
int load_phase(const RunOptions& o, World& w, ProblemSetup& setup, LocalProblem& local, SetupTimes& times) {
  const auto t0 = std::chrono::steady_clock::now();
  const int code = agreed_step(*w.transport, [&] {
    setup = prepare_run(o, w);
    if (w.rank == 0) spdlog::info("problem: {}; world {} over {}", problem_line(setup.problem), w.size, w.transport_name);
    local = load_local(setup.problem, ring_of(setup.ring), *setup.source, *w.backend, w.rank, w.size, setup.cp_group);
    return o.check_finite ? check_inputs_finite(setup.problem, local, *w.backend, w.rank, *setup.source) : std::string();
  });
  times.inputs_s = seconds_since(t0);
  return code;
}

nlohmann::json run_json(const CommandLine& cl, const GlobalProblem& p, const World& w,
                        const std::vector<RankReport>& all, const Summary& s, bool check_ok) {
  const RunOptions& o = cl.run;
  const double flops = attention_flops(p);
  nlohmann::json j = {{"command", "run"},
                      {"problem", problem_json(p)},
                      {"world", w.size},
                      {"transport", w.transport_name},
                      {"device", w.device_label},
                      {"inputs", o.problem.from_files() ? "files" : fmt::format("seed {}", o.problem.seed)},
                      {"wall_s", s.wall_s},
                      {"setup_s", s.setup_s},
                      {"flops", flops},
                      {"gflops_per_s", s.wall_s > 0 ? flops / s.wall_s / 1e9 : 0.0},
                      {"peak_rss_bytes", s.peak_rss},
                      {"workspace_bytes", s.workspace},
                      {"bytes_sent", s.bytes_sent},
                      {"hops", s.hops},
                      {"hidden_fraction", s.hidden},
                      {"ranks", ranks_json(all)},
                      {"flags", flags_json(cl)}};
  if (o.check)
    j["check"] = {{"rows_checked", s.rows_checked}, {"rows_total", s.rows_total}, {"max_abs_error", s.max_abs},
                  {"max_rel_error", s.max_rel},       {"max_lse_abs_error", s.max_lse_abs},
                  {"nonfinite", s.nan_count},         {"violations", s.violations},
                  {"pass", check_ok}};
  return j;
}

// The check (or the count of non-finite values) on this rank; raises `code` on an error.
CheckResult check_phase(const RunOptions& o, const GlobalProblem& p, ProblemSetup& setup, const LocalProblem& local,
                        const HostResult& result, int rank, int world, int& code) {
  CheckResult chk;
  if (o.check) {
    try {
      chk = check_rows(p, *setup.source, local, result, rank, world, o.problem.check_rows, o.problem.seed);
    } catch (const InvalidArgument& e) {
      spdlog::error("check: {}", e.what());
      code = kExitError;
    }
  } else {
    chk.nan_count = count_nonfinite(p, result, &chk.lse_nonfinite);
  }
  if (o.check_finite) {
    if (const std::string e = check_outputs_finite(p, local, result, rank); !e.empty()) {
      spdlog::error("{}", e);
      code = std::max(code, kExitCheckFailed);
    }
  }
  return chk;
}

int run_on(const CommandLine& cl, World& w, double world_s) {
  const RunOptions& o = cl.run;
  Transport& t = *w.transport;
  ProblemSetup setup;
  LocalProblem local;
  SetupTimes times;
  times.world_s = world_s;
  if (load_phase(o, w, setup, local, times) != kExitOk) return kExitError;
  const GlobalProblem& p = setup.problem;
  agree_on_loaded_inputs(p, input_files_of(o), t);  // before the warm-up, whose block size p sets
  times.warm_s = warm_up(local.ring, w);
  CpTransports cp;
  if (setup.cp_group > 1) {
    cp = split_cp(t, setup.cp_group);
    local.cp = &cp;
    times.warm_s = warm_cp(p, cp, w);
  }

  ringattn::RunOptions ro;
  ro.tile_q = o.problem.tile_q;
  ro.tile_k = o.problem.tile_k;
  RankStats stats;
  t.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    stats = run_forward(p, local, *w.backend, t, ro);
    w.backend->synchronize();
  } catch (const InvalidArgument& e) {
    throw CollectiveError(e.what());  // the runtime validates identically on every rank
  }
  const double wall = seconds_since(t0);
  spdlog::debug("run finished in {:.3f} s on this rank", wall);

  int code = kExitOk;
  const HostResult result = copy_result(p, local, *w.backend);
  RankReport mine = make_rank_report(w, stats, wall, w.counter->peak_bytes());
  mine.setup_s = times.total();
  mine.world_s = times.world_s;
  mine.inputs_s = times.inputs_s;
  mine.warm_s = times.warm_s;
  add_check(mine, check_phase(o, p, setup, local, result, w.rank, w.size, code));
  std::vector<RankReport> all;
  wait_after_check(o.check, w.timeout_s, [&] { all = gather_reports(t, mine); });
  const Summary s = summarize(all);
  const bool check_ok = s.nan_count == 0 && s.violations == 0;
  if (o.check && !check_ok) code = std::max(code, kExitCheckFailed);
  if (!o.check && s.nan_count > 0) {
    if (w.rank == 0) spdlog::error("{}", nonfinite_message(s));
    code = std::max(code, kExitCheckFailed);
  }

  // Every output of the run (--json, --out, --lse) moves into place together, or none does.
  FileSet staged;
  bool write_failed = false;
  if (w.rank == 0) {
    // With --json - the record owns stdout; the table moves to stderr.
    print_run_report(o.json_file == "-" ? stderr : stdout, cl, p, w, setup.cp_group, all, s, o.check);
    if (!o.json_file.empty()) {
      try {
        stage_json(staged, o.json_file, run_json(cl, p, w, all, s, check_ok));
      } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        write_failed = true;
      }
    }
  }
  write_failed |= agree_exit_code(t, write_failed ? 1 : 0) != 0;
  if (!write_failed && write_global_outputs(p, local, result, t, o.out_file, o.lse_file, setup.layout, staged) != 0)
    write_failed = true;
  if (!write_failed) write_failed = commit_outputs(staged) != 0;
  if (write_failed) code = std::max(code, kExitError);
  return agree_exit_code(t, code);
}

}  // namespace

int run_command(const CommandLine& cl, MpiSession& mpi) {
  const RunOptions& o = cl.run;
  const auto t0 = std::chrono::steady_clock::now();
  World w = make_world(o.problem, cl.env, mpi, !o.dry_run);
  const double world_s = mpi.init_seconds() + seconds_since(t0);
  return run_guarded(w, [&] {
    return o.dry_run ? dry_run_on(cl, w) : o.backward ? backward_on(cl, w) : run_on(cl, w, world_s);
  });
}

}  // namespace ringattn::cli
