// One params struct per operation, shared by every backend (CPU and CUDA). Passed by value.
#pragma once

#include <cstdint>

#include "core/mask.hpp"
#include "core/state.hpp"
#include "core/types.hpp"

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
// Query head h reads KV head h / (Hq / Hkv). Which keys a query row sees is `mask`
// (core/mask.hpp: full, or causal with q_offset = pos(q_0) - pos(k_0)).
struct FlashParams {
  TensorView q, k, v;
  StateView state;             // [B, Hq, T, D] and [B, Hq, T]
  float scale = 0.f;           // softmax scale, usually 1/sqrt(D)
  MaskSpec mask;
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

}  // namespace ringattn
