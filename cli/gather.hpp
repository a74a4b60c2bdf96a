// --out and --lse: rank 0 writes the output and the LSE of the whole problem in global token
// order, so a run over P ranks is comparable with a single-process run, file for file.
#pragma once

#include <string>
#include <vector>

#include "cli/check.hpp"
#include "cli/problem.hpp"
#include "runner/io/atomic_file.hpp"

namespace ringattn::cli {

// Collective over `t`. Rank 0 opens the files first and every rank learns whether that worked
// (an unwritable path stops all ranks with exit code 1 instead of leaving them in a gather).
// Empty file names are skipped. Output and LSE are <f4 in `layout` (cli/file_layout.hpp): bhsd
// [batch, heads, q_len, dim] and [batch, heads, q_len]; bshd [batch, q_len, heads, dim] and
// [batch, q_len, heads]; thd (packed inputs, batch 1) [q_len, heads, dim] and [q_len, heads]. The
// token-major layouts are assembled in rank 0's memory one batch at a time. The finished files
// go into rank 0's `staged`, which the caller moves into place with the run's other outputs.
// Returns 0, or 1 when rank 0 could not write (message logged).
int write_global_outputs(const GlobalProblem& p, const LocalProblem& l, const HostResult& r, Transport& t,
                         const std::string& out_file, const std::string& lse_file, FileLayout layout,
                         FileSet& staged);

// Moves every staged output into place (rank 0's files; nothing elsewhere). Returns 0, or 1 when
// a file could not be moved (message logged).
int commit_outputs(FileSet& staged);

// The global [bh, len, width] fp32 tensor on rank 0 (empty elsewhere) from every rank's local
// rows: `mine` is [bh, layouts[rank].tokens(), width], its rows in that layout's order (any
// layout: contiguous, zigzag, strided, doc-zigzag). One allgather of every rank's part, padded to
// the largest shard. Collective over `t`; layouts.size() == t.size().
std::vector<float> gather_rows(Transport& t, const std::vector<ShardLayout>& layouts, int64_t bh, int64_t len,
                               int64_t width, const float* mine);

// Every rank's q (kv: k/v) layout of `p` over `world` ranks: the ring plan's (`ring`) for a ring
// problem, else layouts_for's.
std::vector<ShardLayout> all_layouts(const GlobalProblem& p, const RingPlan* ring, int world, bool kv,
                                     int cp_group = 1);

}  // namespace ringattn::cli
