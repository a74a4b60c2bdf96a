// Helpers the ring and decode runners share: the start of a run (agreement and stats), timing, packing a K or V view into a block that
// travels in one piece, and the local checks of the tensors a rank passes in.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "kernels/backend.hpp"
#include "core/timer.hpp"
#include "runner/problem/agree.hpp"
#include "runner/ring/ring.hpp"

namespace ringattn {

// How a K or V view is laid out in its block: dense [B,H,T,D] and dense [B,T,H,D] travel as they
// are (one copy); anything else is packed into [B,H,T,D] row by row.
enum class BlockLayout : uint32_t { Bhtd = 0, Bthd = 1, Strided = 2 };

BlockLayout layout_of(const TensorView& x);

// Elements of one block of shape `x` (B * H * T * D).
inline int64_t block_elems(const TensorView& x) { return x.batch * x.heads * x.len * x.dim; }

// The view of a block at `data` holding a tensor shaped like `x` that was packed from layout `l`.
TensorView block_view(void* data, const TensorView& x, BlockLayout l);

// Copies view `x` into the block at `dst` (backend memory) in block layout `l` (the layout the
// ring's blocks travel in: the whole shard's, layout_of(k), which a part of its rows may not have).
void pack_block(Backend& b, void* dst, const TensorView& x, BlockLayout l);

// "" when `x` has the given shape and dtype, else a message naming `what` and both shapes.
std::string check_view(const char* what, const TensorView& x, int64_t batch, int64_t heads, int64_t len,
                       int64_t dim, DType dtype);

// The start of every run: the stats with rank and world filled in, after the agreement (timed
// into agree_s) when opt.check_agreement, else after throwing this rank's own local error.
RankStats begin_run(const GlobalProblem& p, const LocalVerdict& local, Transport& t, const RunOptions& opt);

}  // namespace ringattn
