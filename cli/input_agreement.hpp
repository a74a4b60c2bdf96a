// The ranks' agreement on what each read from its own files, before the first exchange whose size
// the problem sets (the ring's warm-up, the ring): under mpirun every rank opens --q/--k/--v (and
// --do) itself, and the copies on two hosts may differ.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cli/options.hpp"
#include "comm/transport.hpp"
#include "runner/problem/problem.hpp"

namespace ringattn::cli {

// (flag, path) of the input files a run reads; empty paths are skipped.
using InputFiles = std::vector<std::pair<std::string, std::string>>;

// --q, --k, --v and, with --backward, --do of `o`.
InputFiles input_files_of(const RunOptions& o);

// Collective over `t`: the problem every rank built (shapes and dtype from its files' headers)
// agreed by agree_on_problem, then for each file a hash of its whole contents (file_hash)
// compared across the ranks (a sampled hash let files that differed between the pieces through). Throws
// CollectiveError on every rank alike, naming the ranks, the field or the flag and both values.
void agree_on_loaded_inputs(const GlobalProblem& p, const InputFiles& files, Transport& t);

// A 64-bit hash of every byte of `path` and its size; InvalidArgument naming the flag when the file
// cannot be read.
uint64_t file_hash(const std::string& flag, const std::string& path);

}  // namespace ringattn::cli
