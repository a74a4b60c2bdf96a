// The first collective of every ringattn process that a launcher started with others: one
// fixed-size record per rank, carrying the subcommand and, for every row of the flag table
// (cli/flags.hpp) that is not rank-local, its value (Agree::Value) or whether it was given
// (Agree::Given). Ranks started with different subcommands or flags
// (MPMD launches, edited scripts) stop here with one message naming the ranks and the field,
// before any collective whose size depends on the flags could truncate or hang.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cli/options.hpp"
#include "cli/world.hpp"

namespace ringattn::cli {

// The subcommand's fields as (name, value) text, in table order (derived from the flag table).
using CommandFields = std::vector<std::pair<std::string, std::string>>;
CommandFields command_fields(const CommandLine& cl);

// The verdict on every rank's (command, fields), identical on every rank: "" when all agree,
// else a message naming the ranks that differ from the majority and the first differing field.
// Pure, for tests; `all[r]` is rank r's.
struct CommandView {
  std::string command;
  CommandFields fields;
  std::string error;  // a rank that failed before MPI (its flags or environment): "" when none
};
std::string command_disagreement(const std::vector<CommandView>& all);

// Allgathers this rank's record over MPI_COMM_WORLD, waiting at most `timeout_s`. Does nothing
// in a world of one. Throws CollectiveError on disagreement or when some rank reports `error`
// (every rank alike) and RuntimeError when some rank did not join in time (this rank alone; the
// caller aborts the job). `error`: this rank's own failure before MPI (a bad flag), shared here
// so that ranks started with other flags stop too instead of waiting for this one.
void agree_on_command(const CommandLine& cl, const MpiSession& mpi, double timeout_s, const std::string& error = "");

}  // namespace ringattn::cli
