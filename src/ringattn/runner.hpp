// The runs: ring attention and the KV-sharded distributed decode, written once against Backend
// and Transport (ARCHITECTURE.md, "Data flow"): nothing here knows CPU or GPU, MPI or NCCL.
#pragma once

#include <cstdint>

#include "comm/transport.hpp"
#include "core/types.hpp"
#include "kernels/backend.hpp"
#include "ringattn/problem.hpp"
#include "ringattn/stats.hpp"

namespace ringattn {

// ---------------------------------------------------------------------------------------------
// The runs. Tensors live in the backend's memory (Backend::device_memory), any strides.

struct LocalTensors {
  // Ring: q, k, v hold this rank's shard, rows in shard_layout order, len = layout.tokens().
  // Decode: q holds all q_len queries (replicated), k and v this rank's kv_shard rows.
  TensorView q, k, v;
  TensorView out;            // same shape as q, dtype of the problem; written once at the end
  float* lse = nullptr;      // optional fp32 [batch, q_heads, q rows] contiguous, backend memory
};

struct RunOptions {
  int tile_q = 0, tile_k = 0;  // CPU tile sizes: 0 (default) or 1..kMaxTile (kernels/params.hpp)
  int decode_splits = 0;       // split-KV chunks inside a rank for decode (0: default)
  bool check_agreement = true; // run agree_on_problem first (collective: all ranks or none)
};

// Throws InvalidArgument naming the flag (--tile-q, --tile-k) and the allowed range. The runs
// call it before allocating or communicating anything.
void validate_run_options(const RunOptions& opt);

// Ring attention of a self-attention problem (p.is_ring()). Collective over `t`.
RankStats run_ring_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                             const RunOptions& opt = {});

// KV-sharded decode / chunked prefill: every rank attends all queries to its KV shard, then the
// partial states are allgathered and merged in rank order (bitwise identical on every rank).
// Collective over `t`.
RankStats run_distributed_decode(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                                 const RunOptions& opt = {});

// run_ring_attention when p.is_ring(), run_distributed_decode otherwise.
RankStats run_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                        const RunOptions& opt = {});

// Bytes rank `rank` sends through the ring exchange for `p` over `world` ranks: P - 1 hops, hop s
// passing on the K and V of the tokens of rank (rank - s) mod P (shards may be uneven).
uint64_t expected_ring_bytes(const GlobalProblem& p, int rank, int world);

}  // namespace ringattn
