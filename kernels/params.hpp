// One params struct per operation, shared by every backend (CPU and CUDA). Passed by value.
#pragma once

#include <cstdint>

#include "ringattn/types.hpp"

namespace ringattn {

// The largest CPU tile (FlashParams::tile_q, tile_k; the --tile-q and --tile-k flags): the CPU
// workspace holds a few tiles per thread, about 5 x tile x head_dim floats.
inline constexpr int kMaxTile = 4096;

// What a flash call does with its result.
enum class StateMode : uint8_t {
  Write,  // state := this call's partial state (rows that see no key get the empty state)
  Fold,   // state := merge(state, this call's partial state)
};

// Attention of q [B, Hq, T, D] against k, v [B, Hkv, S, D], producing an fp32 (o, lse) state:
// o the normalized output, lse = ln(sum_j exp(scale * q.k_j)) over the visible keys (natural
// log, scale included); a row with no visible key has the empty state o = 0, lse = -inf.
// Query head h reads KV head h / (Hq / Hkv). Causal: key j is visible to query i when
// j <= i + q_offset (indices within the views; q_offset = pos(q_0) - pos(k_0) for contiguous
// runs, and the schedule expresses strided shards in the same form).
struct FlashParams {
  TensorView q, k, v;
  StateView state;             // [B, Hq, T, D] and [B, Hq, T]
  float scale = 0.f;           // softmax scale, usually 1/sqrt(D)
  bool causal = false;
  int64_t q_offset = 0;
  StateMode mode = StateMode::Write;
  int tile_q = 0, tile_k = 0;  // CPU tile sizes; 0 picks the default. GPU kernels pick their own.
  // Optional: the final output [B, Hq, T, D] in out.dtype. When set, the call also writes the
  // normalized result (after the fold) into `out`, cast once, and state.o is unspecified
  // afterwards (a kernel may skip writing it); state.lse is written as always. This is how the
  // last call on a row skips a separate cast pass. Backends whose kernel cannot do it write the
  // state and cast.
  TensorView out;
};

// state := merge(state, other), row by row. Shapes must match.
struct MergeParams {
  StateView state;
  StateView other;
};

// Split-KV decode: the keys are split into `splits` chunks, each chunk's partial state is
// computed separately and the partial states are merged. Same result as one flash call.
struct DecodeParams {
  FlashParams flash;
  int splits = 0;  // 0 picks a default
};

// Casts the normalized fp32 state output into `out` (same shape, out.dtype).
struct FinalizeParams {
  StateView state;
  TensorView out;
};

// Checks a flash call before any work. Throws InvalidArgument naming the offending value and
// what is allowed. `complete` asks that every query row sees at least one key (a complete
// attention); partial calls allow rows with no visible key.
void validate_flash(const FlashParams& p, bool complete);

// The causal offset a kernel computes with: q_offset clamped to [-q_len, kv_len]. It selects
// exactly the same keys (from kv_len - 1 on every row sees every key, at -q_len and below no row
// sees any), and keeps every index sum such as row + offset + 1 far from int64 overflow, so an
// offset near the int64 limits gives the right answer. Every backend applies it on entry.
inline int64_t kernel_q_offset(int64_t q_offset, int64_t q_len, int64_t kv_len) {
  return q_offset < -q_len ? -q_len : q_offset > kv_len ? kv_len : q_offset;
}

// Number of keys visible to query row i (0 when none).
inline int64_t visible_keys(const FlashParams& p, int64_t i) {
  if (!p.causal) return p.k.len;
  // Decided before any sum, so that no offset overflows: row i sees nothing when
  // q_offset <= -(i + 1) and every key when q_offset >= kv_len - 1.
  if (p.q_offset < -i) return 0;
  if (p.q_offset >= p.k.len) return p.k.len;
  const int64_t last = i + p.q_offset;  // last visible key index
  if (last < 0) return 0;
  return last + 1 < p.k.len ? last + 1 : p.k.len;
}

}  // namespace ringattn
