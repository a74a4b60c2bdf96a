// `ringattn run`: one problem, once, on every rank of the world (a world of one without mpirun).
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/backward.hpp"
#include "cli/check.hpp"
#include "cli/finite.hpp"
#include "cli/gather.hpp"
#include "cli/outputs.hpp"
#include "cli/problem.hpp"
#include "cli/report.hpp"
#include "cli/run.hpp"
#include "core/timer.hpp"

namespace ringattn::cli {
namespace {

void print_run_report(std::FILE* f, const GlobalProblem& p, const World& w, const std::vector<RankReport>& all,
                      const Summary& s, bool checked) {
  fmt::print(f, "# ringattn run: {}\n", problem_line(p));
  fmt::print(f, "# world {}, transport {}\n", w.size, w.transport_name);
  fmt::print(f, "# {:>4}  {:<16} {:<18} {:>9} {:>11} {:>11} {:>8} {:>11} {:>11} {:>11}\n", "rank", "host", "device",
             "wall_ms", "compute_ms", "exposed_ms", "hidden%", "sent", "peak_rss", "workspace");
  for (const RankReport& r : all)
    fmt::print(f, "  {:>4}  {:<16} {:<18} {:>9.2f} {:>11.2f} {:>11.2f} {:>8} {:>11} {:>11} {:>11}\n", r.rank, r.host,
               r.device, r.wall_s * 1e3, r.compute_s * 1e3, r.exposed_comm_s * 1e3,
               r.hidden >= 0 ? fmt::format("{:.1f}", 100 * r.hidden) : std::string("n/a"), human_bytes(double(r.bytes_sent)),
               human_bytes(double(r.peak_rss)), human_bytes(double(r.workspace)));
  const double flops = attention_flops(p);
  fmt::print(f, "time     {:.3f} ms (slowest rank)\n", s.wall_s * 1e3);
  fmt::print(f, "rate     {} ({:.3f} GFLOP = 4 x batch x heads x dim x visible query-key pairs)\n",
             rate_string(flops, s.wall_s), flops / 1e9);
  fmt::print(f, "memory   peak rss {} (largest rank), workspace {} (largest rank, backend allocations)\n",
             human_bytes(double(s.peak_rss)), human_bytes(double(s.workspace)));
  if (checked) {
    const Tolerance t = tolerance_for(p.dtype);
    fmt::print(f, "check    {} of {} rows{}: max abs {:.3e}, max rel {:.3e}, max lse abs {:.3e}, non-finite {}, over "
               "tolerance {} -> {}\n",
               s.rows_checked, s.rows_total, s.rows_checked == s.rows_total ? " (all)" : " (seeded sample)", s.max_abs,
               s.max_rel, s.max_lse_abs, s.nan_count, s.violations,
               s.nan_count == 0 && s.violations == 0 ? "OK" : "FAILED");
    fmt::print(f, "         tolerance {}: |o - ref| <= {:.0e} + {:.0e} |ref| + {:.0e} |lse_ref|, |lse - ref| <= {:.0e} + "
               "{:.0e} |ref|\n", dtype_name(p.dtype), t.atol, t.rtol, t.score_rtol, t.lse_atol, t.lse_rtol);
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

namespace {

int run_on(const RunOptions& o, World& w) {
  Transport& t = *w.transport;

  // Local phase: every rank reads its files and fills its shard. Errors here may hit one rank
  // only (a missing file on one host), so they become an exit code all ranks agree on.
  ProblemSetup setup;
  LocalProblem local;
  int code = kExitOk;
  std::string error;
  try {
    if (w.rank == 0) check_run_outputs(o);  // only rank 0 writes; its verdict is shared below
    setup = setup_problem(o.problem);
    validate_problem(setup.problem, w.size);
    check_fault_for(setup.problem, w.size);
    if (w.rank == 0) spdlog::info("problem: {}; world {} over {}", problem_line(setup.problem), w.size, w.transport_name);
    local = load_local(setup.problem, *setup.source, *w.backend, w.rank, w.size);
    if (o.check_finite) {
      error = check_inputs_finite(setup.problem, local, *w.backend, w.rank, *setup.source);
      if (!error.empty()) code = kExitError;
    }
  } catch (const InvalidArgument& e) {
    error = e.what();
    code = kExitError;
  }
  if (agree_on_errors(t, code, error) != kExitOk) return kExitError;
  const GlobalProblem& p = setup.problem;

  ringattn::RunOptions ro;
  ro.tile_q = o.problem.tile_q;
  ro.tile_k = o.problem.tile_k;
  RankStats stats;
  t.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    stats = run_attention(p, local.views, *w.backend, t, ro);
    w.backend->synchronize();
  } catch (const InvalidArgument& e) {
    throw CollectiveError(e.what());  // the runtime validates identically on every rank
  }
  const double wall = seconds_since(t0);
  spdlog::debug("run finished in {:.3f} s on this rank", wall);

  const HostResult result = copy_result(p, local, *w.backend);
  RankReport mine = make_rank_report(w, stats, wall, w.counter->peak_bytes());
  CheckResult chk;
  if (o.check) {
    try {
      chk = check_rows(p, *setup.source, local, result, w.rank, w.size, o.problem.check_rows, o.problem.seed);
    } catch (const InvalidArgument& e) {
      spdlog::error("check: {}", e.what());
      code = kExitError;
    }
  } else {
    chk.nan_count = count_nonfinite(p, result, &chk.lse_nonfinite);
  }
  if (o.check_finite) {
    if (const std::string e = check_outputs_finite(p, local, result, w.rank); !e.empty()) {
      spdlog::error("{}", e);
      code = std::max(code, kExitCheckFailed);
    }
  }
  add_check(mine, chk);
  const auto all = gather_reports(t, mine);
  const Summary s = summarize(all);
  const bool check_ok = s.nan_count == 0 && s.violations == 0;
  if (o.check && !check_ok) code = std::max(code, kExitCheckFailed);
  if (!o.check && s.nan_count > 0) {
    if (w.rank == 0) spdlog::error("{}", nonfinite_message(s));
    code = std::max(code, kExitCheckFailed);
  }

  if (w.rank == 0) {
    // With --json - the record owns stdout; the table moves to stderr.
    print_run_report(o.json_file == "-" ? stderr : stdout, p, w, all, s, o.check);
    if (!o.json_file.empty()) {
      const double flops = attention_flops(p);
      nlohmann::json j = {{"command", "run"},
                          {"problem", problem_json(p)},
                          {"world", w.size},
                          {"transport", w.transport_name},
                          {"device", w.device_label},
                          {"inputs", o.problem.from_files() ? "files" : fmt::format("seed {}", o.problem.seed)},
                          {"wall_s", s.wall_s},
                          {"flops", flops},
                          {"gflops_per_s", s.wall_s > 0 ? flops / s.wall_s / 1e9 : 0.0},
                          {"peak_rss_bytes", s.peak_rss},
                          {"workspace_bytes", s.workspace},
                          {"bytes_sent", s.bytes_sent},
                          {"hidden_fraction", s.hidden},
                          {"ranks", ranks_json(all)}};
      if (o.check)
        j["check"] = {{"rows_checked", s.rows_checked}, {"rows_total", s.rows_total}, {"max_abs_error", s.max_abs},
                      {"max_rel_error", s.max_rel},       {"max_lse_abs_error", s.max_lse_abs},
                      {"nonfinite", s.nan_count},         {"violations", s.violations},
                      {"pass", check_ok}};
      try {
        write_json(o.json_file, j);
      } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        code = std::max(code, kExitError);
      }
    }
  }
  if (write_global_outputs(p, local, result, t, o.out_file, o.lse_file) != 0) code = std::max(code, kExitError);
  return agree_exit_code(t, code);
}

}  // namespace

int run_command(const RunOptions& o, MpiSession& mpi) {
  World w = make_world(o.problem, mpi);
  return run_guarded(w, [&] { return o.dry_run ? dry_run_on(o, w) : o.backward ? backward_on(o, w) : run_on(o, w); });
}

}  // namespace ringattn::cli
