// Hybrid context parallelism, CPU ranks first: U consecutive ranks form a group that exchanges
// heads all-to-all (Ulysses: each rank then holds the group's tokens for 1/U of the heads), and
// the G = P / U groups pass K/V around a ring, one ring per position inside a group. U = P is
// all-to-all only; U = 1 is the ring.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/transport.hpp"
#include "kernels/backend.hpp"
#include "runner/problem/problem.hpp"
#include "runner/problem/sharding.hpp"
#include "runner/ring/runner.hpp"
#include "runner/ring/stats.hpp"

namespace ringattn {

// The tokens rank `rank` of `world` holds with groups of `group_size` ranks: the ring shard of
// its group g = rank / U (p.sharding over the G = world / U groups, documents included), its rows
// cut into U contiguous pieces in the shard's row order, the piece u = rank % U. Throws
// InvalidArgument when U is not a divisor of world (the same on every rank).
ShardLayout hybrid_layout(const GlobalProblem& p, int group_size, int rank, int world);

// The bytes rank r of `world` sends under groups of `group_size` ranks (p.sharding over the
// groups): to the other ranks of its group through the all-to-alls, and across the groups through
// the ring of the group's heads block. Forward: run_hybrid_attention's two all-to-alls and ring;
// backward: run_hybrid_attention_backward's (the ring backward's K/V and dK/dV rings). What the
// runs count in RankStats::group_bytes_sent and bytes_sent (group + ring). One per rank; throws
// InvalidArgument as hybrid_layout, or when the heads do not divide by the group size.
struct HybridBytes {
  uint64_t group = 0, ring = 0;
  uint64_t total() const { return group + ring; }
};
std::vector<HybridBytes> hybrid_bytes(const GlobalProblem& p, int group_size, int world, bool backward);

// Attention of a self-attention problem (p.is_ring()) with x holding this rank's rows of
// hybrid_layout(p, group.size(), rank, P), all heads: an all-to-all over `group` gives every rank
// of a group the group's tokens for its block of q_heads / U query and kv_heads / U KV heads,
// run_ring_attention over `ring` (this rank's place among the groups: ring.rank() is the group)
// attends them, and a second all-to-all brings out and lse back to the rows x holds. `group` is
// this rank's group (group.rank() its place in it), `ring` the ranks at the same place in every
// group. q_heads and kv_heads must divide by the group size; host memory only (a backend with
// device memory is refused). Refusals are InvalidArgument, on every rank alike, before any
// exchange. Collective over both transports.
RankStats run_hybrid_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& group,
                               Transport& ring, const RunOptions& opt = {});

// The gradients of run_hybrid_attention for the loss whose gradient with respect to the output is
// g.dout, x.out and x.lse (required) holding its results for this rank's rows: an all-to-all over
// `group` gives every rank of a group the group's q, k, v, out, lse and dO of its block of heads,
// run_attention_backward over `ring` and `grad_ring` (a second transport over the ring's ranks,
// for the dK/dV accumulators) computes their gradients, and a second all-to-all brings dq, dk and
// dv (fp32, every element written) back to the rows x holds. The refusals of run_hybrid_attention
// and of run_attention_backward, on every rank alike, before any exchange. Collective over the
// three transports.
RankStats run_hybrid_attention_backward(const GlobalProblem& p, const LocalTensors& x, const BackwardTensors& g,
                                        Backend& b, Transport& group, Transport& ring, Transport& grad_ring,
                                        const RunOptions& opt = {});

}  // namespace ringattn
