// The output files of a command, checked before any compute (and by --dry-run): each one's
// directory exists and is writable, no two outputs name the same file, and no output names an
// input file (which the write would overwrite).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cli/options.hpp"

namespace ringattn::cli {

// (flag, path) pairs; empty paths and "-" (stdout) are skipped.
using NamedPaths = std::vector<std::pair<std::string, std::string>>;

// Throws InvalidArgument naming the flag, the path and the reason.
void check_output_paths(const NamedPaths& outputs, const NamedPaths& inputs);

// The outputs and inputs of `run` and of `bench`.
void check_run_outputs(const RunOptions& o);
void check_bench_outputs(const BenchOptions& o);

}  // namespace ringattn::cli
