// The public API of the distributed runtime: the global problem every rank agrees on, how a
// sequence is sharded over ranks, the ring-attention runner and the KV-sharded distributed decode,
// and the per-rank statistics they return. Written once against Backend and Transport
// (DESIGN.md sections 1-3): nothing here knows CPU or GPU, MPI or NCCL.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/transport.hpp"
#include "kernels/backend.hpp"
#include "core/types.hpp"

namespace ringattn {

// ---------------------------------------------------------------------------------------------
// Sharding: which global tokens each rank holds.

enum class Sharding : uint8_t {
  Contiguous = 0,  // rank r holds tokens [r*N/P, (r+1)*N/P)
  Zigzag = 1,      // N in 2P chunks; rank r holds chunks r and 2P-1-r (balances causal work)
  Striped = 2,     // token t on rank t mod P
};

const char* sharding_name(Sharding s);  // "contiguous", "zigzag", "striped"
// Parses "contiguous|zigzag|striped"; throws InvalidArgument naming the allowed values.
Sharding parse_sharding(const std::string& name);

// An arithmetic run of global token positions: start, start + stride, ..., len of them.
struct Segment {
  int64_t start = 0;
  int64_t len = 0;
  int64_t stride = 1;
  int64_t position(int64_t i) const { return start + i * stride; }
};

// The tokens one rank holds, in local row order: the segments one after another (local row 0 is
// segments[0].start, and so on). Fill a local tensor segment by segment with
// fill_input(view.rows(row0, seg.len), seed, which, seg.start, seg.stride).
struct ShardLayout {
  std::vector<Segment> segments;
  int64_t tokens() const;                         // sum of segment lengths
  int64_t global_position(int64_t local_row) const;  // throws InvalidArgument when out of range
  int64_t first_row(size_t segment) const;        // local row where segments[segment] begins
};

// The smallest length unit a scheme can split across `world` ranks: P for contiguous and
// striped, 2P for zigzag. The ring needs seq_len to be a multiple of it.
int64_t required_multiple(Sharding s, int world);

// Throws InvalidArgument (the same message on every rank, before any communication) when
// `seq_len` cannot be split by `s` over `world` ranks; the message names the required multiple.
void check_shardable(Sharding s, int64_t seq_len, int world);

// The layout of `rank` out of `world` for a sequence of `seq_len` tokens. Calls check_shardable.
ShardLayout shard_layout(Sharding s, int64_t seq_len, int rank, int world);

// The contiguous KV split of distributed decode: rank r holds keys [r*S/P, (r+1)*S/P) (floor
// division, so any S works; a rank may hold none when S < P).
Segment kv_shard(int64_t kv_len, int rank, int world);

// ---------------------------------------------------------------------------------------------
// The global problem. Every rank passes the same one; agree_on_problem checks that they do.

inline constexpr uint32_t kProblemVersion = 1;

struct GlobalProblem {
  int64_t batch = 1;
  int64_t q_heads = 1;
  int64_t kv_heads = 1;        // q_heads must be a multiple (GQA; MQA when 1)
  int64_t q_len = 0;           // global query tokens (ring: = kv_len; decode: replicated on all ranks)
  int64_t kv_len = 0;          // global key/value tokens
  int64_t head_dim = 0;
  DType dtype = DType::F32;
  bool causal = false;
  // pos(q_0) - pos(k_0); unset: kv_len - q_len. The ring needs 0 (self-attention). Any int64 for
  // which the last query's position q_offset + q_len - 1 is an int64 (validate_problem).
  std::optional<int64_t> q_offset;
  Sharding sharding = Sharding::Contiguous;  // ring only; decode always splits KV contiguously
  float scale = 0.f;           // softmax scale; 0 means 1/sqrt(head_dim)

  int64_t resolved_q_offset() const { return q_offset.value_or(kv_len - q_len); }
  float resolved_scale() const;
  // The ring runs self-attention (q_len == kv_len, q_offset 0); anything else is a decode problem.
  bool is_ring() const { return q_len == kv_len && resolved_q_offset() == 0; }
};

// Checks shapes and values on this rank alone (no communication). Throws InvalidArgument.
void validate_problem(const GlobalProblem& p, int world);

// Allgathers a fixed-size description of `p` (shape, dtype, causal, sharding, q_offset, scale,
// operation, version, world size) and compares. When any rank differs, every rank throws
// InvalidArgument with the same message, naming the rank(s) that differ and the first field.
void agree_on_problem(const GlobalProblem& p, Transport& t);

// ---------------------------------------------------------------------------------------------
// Statistics one rank returns from a run. Times are seconds of wall clock on this rank.

struct HopStats {
  int hop = 0;
  int source_rank = 0;         // the rank the K/V block of this hop originated on
  int kernel_calls = 0;        // flash calls (visible segment pairs); 0 = forwarded only
  int64_t visible_pairs = 0;   // query-key pairs this hop computes (causal mask applied)
  double compute_s = 0;        // kernels of this hop, to completion
  double exposed_comm_s = 0;   // waiting for the exchange after the compute finished (this includes
                               // waiting for a slower neighbour: load imbalance shows up here)
  double transfer_s = -1;      // the exchange itself, post to completion (-1 when not measurable;
                               // the MPI helper thread measures it, the nonblocking mode cannot)
  uint64_t bytes_sent = 0;     // bytes this hop sent to the next rank
};

struct RankStats {
  int rank = 0, world = 1;
  double total_s = 0;          // the whole call, agreement included
  double agree_s = 0;          // problem agreement
  double setup_s = 0;          // packing K/V, emptying the state
  double compute_s = 0;        // sum over hops (decode: the local split-KV decode)
  double exposed_comm_s = 0;   // communication the compute did not hide (decode: the allgather)
  double transfer_s = -1;      // sum of measured exchange times (-1 when the transport cannot tell)
  double merge_s = 0;          // decode: merging the gathered states
  double finalize_s = 0;       // the cast to the output dtype
  uint64_t bytes_sent = 0;     // through Transport::start_exchange (decode: its allgather bytes)
  int64_t visible_pairs = 0;   // query-key pairs computed: the deterministic cost of this rank
  int kernel_calls = 0;
  std::vector<HopStats> hops;  // ring: one per hop (P of them); decode: empty

  // Fraction of the measured exchange time hidden behind compute: 1 - exposed / transfer,
  // clamped to [0, 1]; -1 when the transfer time is unknown or there was no exchange.
  double hidden_fraction() const;
};

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

// Bytes one rank sends through the ring exchange for `p` over `world` ranks: (P - 1) hops of one
// packed K and V block each.
uint64_t expected_ring_bytes(const GlobalProblem& p, int world);

}  // namespace ringattn
