// The subcommands. Each returns the process exit code (cli/world.hpp kExitOk, kExitError,
// kExitCheckFailed; every rank's error counts).
#pragma once

#include "cli/options.hpp"
#include "cli/problem.hpp"
#include "cli/world.hpp"

namespace ringattn::cli {

int run_command(const CommandLine& cl, MpiSession& mpi);
// Everything `run` checks on this rank before it loads or computes, shared by the run, the
// backward and the dry run: the output paths (rank 0 only: it alone writes), the problem from the
// flags or the files' headers and its validation over the world's ranks, --shard auto, the
// backward's limits and its --do file, the world's fault plan (check_fault_plan: a plan that could
// not fire in this problem). Throws InvalidArgument; the callers agree on it.
ProblemSetup prepare_run(const RunOptions& o, const World& w);
// `run --dry-run` on a world already made (dry_run.cpp).
int dry_run_on(const CommandLine& cl, World& w);
int bench_command(const CommandLine& cl, MpiSession& mpi);
// No MPI: prints the schedule of every rank of a ring of o.ranks.
int plan_command(const PlanOptions& o);

}  // namespace ringattn::cli
