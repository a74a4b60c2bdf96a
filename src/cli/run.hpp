// The subcommands. Each returns the process exit code: 0 ok, 1 bad input or an error, 2 a check
// over its tolerance (every rank's error counts).
#pragma once

#include "cli/options.hpp"
#include "cli/world.hpp"

namespace ringattn::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitCheckFailed = 2;

int run_command(const RunOptions& o, MpiSession& mpi);
// `run --dry-run` on a world already made (dry_run.cpp).
int dry_run_on(const RunOptions& o, World& w);
int bench_command(const BenchOptions& o, MpiSession& mpi);
// No MPI: prints the schedule of every rank of a ring of o.ranks.
int plan_command(const PlanOptions& o);

}  // namespace ringattn::cli
