// The `ringattn` executable: parses the command line, starts MPI only when a launcher started
// this process, runs one subcommand and turns every error into one line on stderr and an exit
// code (1: bad input or an error, 2: a check over its tolerance).
#include <mpi.h>

#include <cstdlib>
#include <exception>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/options.hpp"
#include "cli/run.hpp"
#include "cli/world.hpp"
#include "ringattn/log.hpp"

namespace {

using namespace ringattn;
using namespace ringattn::cli;

int env_size() {
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
    if (const char* v = std::getenv(n); v && *v) return std::atoi(v);
  return 1;
}

#ifdef RINGATTN_HAVE_CUDA
constexpr bool kHaveCuda = true;
#else
constexpr bool kHaveCuda = false;
#endif
#ifdef RINGATTN_HAVE_NCCL
constexpr bool kHaveNccl = true;
#else
constexpr bool kHaveNccl = false;
#endif

// The embedded default: `ringattn` alone checks a modest causal GQA problem end to end.
constexpr const char* kDefaultArgs = "run --causal --check";

int dispatch(CLI::App& app, const CLI::App* run_cmd, const RunOptions& run, const BenchOptions& bench, MpiSession& mpi) {
  if (app.got_subcommand(run_cmd)) return run_command(run, mpi);
  return bench_command(bench, mpi);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringattn: ring attention over CPU ranks or GPUs (run `ringattn` alone for a checked default run)"};
  app.require_subcommand(0, 1);
  RunOptions run;
  BenchOptions bench;
  CLI::App* run_cmd = app.add_subcommand("run", "run one attention problem (random inputs or .npy files)");
  add_run_flags(*run_cmd, run);
  CLI::App* bench_cmd = app.add_subcommand("bench", "sweep sequence lengths and print a table (like nccl-tests)");
  add_bench_flags(*bench_cmd, bench);
  PlanOptions plan;
  CLI::App* plan_cmd = app.add_subcommand("plan", "print the ring schedule and load balance of a sharding (no run)");
  add_plan_flags(*plan_cmd, plan);
  bool show_version = false;
  app.add_flag("--version", show_version, "print what this build supports (cuda yes|no, nccl yes|no)");

  const int rank = env_rank();
  init_logging(rank, env_size(), "info");
  try {
    if (argc <= 1) {
      if (rank == 0) spdlog::info("no arguments: running the default problem, as `ringattn {}`", kDefaultArgs);
      app.parse(std::string(kDefaultArgs), false);
    } else {
      app.parse(argc, argv);
    }
    if (show_version) {
      if (rank == 0) fmt::print("ringattn (cuda {}, nccl {})\n", kHaveCuda ? "yes" : "no",
                                kHaveNccl ? "yes" : "no");
      return 0;
    }
    if (app.got_subcommand(plan_cmd)) {
      if (rank != 0) return 0;
      return plan_command(plan);
    }
    if (!app.got_subcommand(run_cmd) && !app.got_subcommand(bench_cmd))
      throw CLI::CallForHelp();
    const ProblemOptions& po = app.got_subcommand(run_cmd) ? run.problem : bench.problem;
    init_logging(rank, env_size(), resolve_log_level(po.log_level));
    validate_problem_options(po);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0 || dynamic_cast<const CLI::CallForHelp*>(&e) != nullptr) {
      if (rank == 0) app.exit(e);
      return 0;
    }
    if (rank == 0) spdlog::error("{} (see ringattn --help, ringattn run --help, ringattn bench --help)", e.what());
    return 1;
  } catch (const std::exception& e) {
    // Before MPI starts: every rank parsed the same flags, so every rank stops here alike.
    if (rank == 0) spdlog::error("{}", e.what());
    return 1;
  }

  std::unique_ptr<MpiSession> mpi;
  try {
    mpi = std::make_unique<MpiSession>();
    const int code = dispatch(app, run_cmd, run, bench, *mpi);
    mpi->finish();
    return code;
  } catch (const CollectiveError& e) {
    if (rank == 0) spdlog::error("{}", e.what());  // the same message on every rank: print it once
    if (mpi) mpi->finish();
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    spdlog::default_logger()->flush();
    int size = 1;
    if (mpi && mpi->active()) MPI_Comm_size(MPI_COMM_WORLD, &size);
    // Other ranks may be waiting for this one in a collective: end them all.
    if (size > 1) mpi->abort(1);
    if (mpi) mpi->finish();
    return 1;
  }
}
