// The `ringattn` executable: parses the command line, starts MPI only when a launcher started
// this process, runs one subcommand and turns every error into one line on stderr and an exit
// code (1: bad input or an error, 2: a check over its tolerance).
#include <mpi.h>

#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/command_agreement.hpp"
#include "cli/options.hpp"
#include "cli/run.hpp"
#include "cli/world.hpp"
#include "runner/faults/fault.hpp"
#include "runner/diagnostics/log.hpp"
#include "core/settings.hpp"

namespace {

using namespace ringattn;
using namespace ringattn::cli;

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

// An error before MPI starts (flags, environment). Alone, or when every rank parsed the same
// flags, every rank meets it alike; but ranks of one job may have been started with different
// flags (MPMD), so under a launcher of several ranks the error goes through the start-up
// agreement, which stops the other ranks too and names the ranks that failed.
int report_early_error(const CommandLine& cl, const std::string& error, int rank) {
  if (!launched_by_launcher() || launcher_world_size() <= 1) {
    if (rank == 0) spdlog::error("{}", error);
    return 1;
  }
  MpiSession mpi;
  double timeout = kDefaultTimeoutS;
  try {
    timeout = cl.env.timeout_s(cl.run.problem.timeout_s);  // the environment's bound, if it is well-formed
  } catch (const std::exception&) {
  }
  try {
    agree_on_command(cl, mpi, timeout, error);
  } catch (const CollectiveError& e) {
    if (rank == 0) spdlog::error("{}", e.what());
  } catch (const std::exception& e) {
    spdlog::error("{}; this rank's own error: {}", e.what(), error);
    spdlog::default_logger()->flush();
    mpi.abort(1);
  }
  mpi.finish();
  return 1;
}

// --help and --version: printed by rank 0. Under a launcher of several ranks they first join
// the start-up agreement as their own subcommand, so that ranks started with another command
// stop with the usual message naming the ranks instead of waiting for this one in MPI_Init.
int report_help_or_version(CommandLine& cl, const std::string& what, int rank, const std::function<void()>& print) {
  if (!launched_by_launcher() || launcher_world_size() <= 1) {
    if (rank == 0) print();
    return 0;
  }
  cl.command = what;
  MpiSession mpi;
  try {
    agree_on_command(cl, mpi, cl.env.timeout_s(std::nullopt));
  } catch (const CollectiveError& e) {
    if (rank == 0) spdlog::error("{}", e.what());
    mpi.finish();
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    spdlog::default_logger()->flush();
    mpi.abort(1);
  }
  if (rank == 0) print();
  mpi.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CommandLine cl;
  cl.env = settings();  // every RINGATTN_* variable, read once (core/settings.hpp)
  const std::unique_ptr<CLI::App> app = make_app(cl);
  const int rank = env_rank();
  init_logging(rank, launcher_world_size(), "info");
  std::string early_error;
  try {
    if (argc <= 1 && rank == 0)
      spdlog::info("no arguments: running the default problem, as `ringattn {}`", kDefaultArgs);
    parse_command_line(*app, cl, argc, argv);
    if (cl.show_version)
      return report_help_or_version(cl, "--version", rank, [] {
        fmt::print("ringattn (cuda {}, nccl {})\n", kHaveCuda ? "yes" : "no", kHaveNccl ? "yes" : "no");
      });
    if (cl.show_env)
      return report_help_or_version(cl, "--help-env", rank, [] { fmt::print("{}", environment_help()); });
    if (cl.command == "plan" && launcher_world_size() <= 1) return plan_command(cl.plan);
    const ProblemOptions& po = cl.command == "run" ? cl.run.problem : cl.bench.problem;
    if (cl.command != "plan") {
      init_logging(rank, launcher_world_size(), resolve_log_level(po.log_level, cl.env.log_level));
      parse_fault_plan(cl.env.fault.get());  // a malformed RINGATTN_FAULT stops every rank here, alike
    }
    cl.env.timeout_s(po.timeout_s);  // a malformed RINGATTN_MPI_TIMEOUT_S stops every rank here, alike
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0 || dynamic_cast<const CLI::CallForHelp*>(&e) != nullptr)
      return report_help_or_version(cl, "--help", rank, [&] { app->exit(e); });
    early_error = fmt::format("{} {}", e.what(), help_pointer(*app));
  } catch (const std::exception& e) {
    early_error = e.what();
  }
  if (!early_error.empty()) return report_early_error(cl, early_error, rank);

  std::unique_ptr<MpiSession> mpi;
  try {
    mpi = std::make_unique<MpiSession>();
    // The first collective: ranks started with different subcommands or flags stop here. `plan`
    // under a launcher joins it too (so that `run : plan` is a clear error, not a hang), then
    // prints on rank 0.
    const ProblemOptions& po = cl.command == "bench" ? cl.bench.problem : cl.run.problem;
    const std::string choice_error = cl.command == "plan" ? "" : world_choice_error(po, cl.env, *mpi);
    agree_on_command(cl, *mpi, cl.env.timeout_s(cl.command == "plan" ? std::nullopt : po.timeout_s), choice_error);
    int code = 0;
    if (cl.command == "plan")
      code = rank == 0 ? plan_command(cl.plan) : 0;
    else
      code = cl.command == "run" ? run_command(cl, *mpi) : bench_command(cl, *mpi);
    mpi->finish();
    return code;
  } catch (const CollectiveError& e) {
    if (rank == 0) spdlog::error("{}", e.what());  // the same message on every rank: print it once
    if (mpi) mpi->finish();
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    log_flight_recorder();
    spdlog::default_logger()->flush();
    int size = 1;
    if (mpi && mpi->active()) MPI_Comm_size(MPI_COMM_WORLD, &size);
    // Other ranks may be waiting for this one in a collective: end them all.
    if (size > 1) mpi->abort(1);
    if (mpi) mpi->finish();
    return 1;
  }
}
