// --out and --lse: rank 0 writes the output and the LSE of the whole problem in global token
// order, so a run over P ranks is comparable with a single-process run, file for file.
#pragma once

#include <string>

#include "cli/check.hpp"
#include "cli/problem.hpp"

namespace ringattn::cli {

// Collective over `t`. Rank 0 opens the files first and every rank learns whether that worked
// (an unwritable path stops all ranks with exit code 1 instead of leaving them in a gather).
// Empty file names are skipped. Output is <f4 [batch, heads, q_len, dim], LSE <f4
// [batch, heads, q_len]; with `thd` (packed inputs, batch 1) the packed layout instead: output
// [q_len, heads, dim], LSE [q_len, heads], assembled in rank 0's memory first. Returns 0, or 1
// when rank 0 could not write (message logged).
int write_global_outputs(const GlobalProblem& p, const LocalProblem& l, const HostResult& r, Transport& t,
                         const std::string& out_file, const std::string& lse_file, bool thd = false);

}  // namespace ringattn::cli
