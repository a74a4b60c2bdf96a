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

// Scale factors of quantized inputs (an FP8 q, k or v holds its values divided by a factor, which
// the kernel multiplies back in): each a pointer to one fp32 factor in the backend's memory, null
// when the tensor has none. The place for them; no kernel takes them yet, so validate_flash and
// validate_backward refuse any that is set.
struct Descale {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  bool any() const { return q != nullptr || k != nullptr || v != nullptr; }
};

// What a flash call does with its result.
enum class StateMode : uint8_t {
  Write,  // state := this call's partial state (rows that see no key get the empty state)
  Fold,   // state := merge(state, this call's partial state)
};

// Attention of q [B, Hq, T, D] against k, v [B, Hkv, S, D], producing an fp32 (o, lse) state:
// o the normalized output, lse = ln(sum_j exp(scale * q.k_j)) over the visible keys (natural
// log, scale included); a row with no visible key has the empty state o = 0, lse = -inf.
// Query head h reads KV head h / (Hq / Hkv). Which keys a query row sees is `mask`
// (core/mask.hpp: full, or causal with q_offset = pos(q_0) - pos(k_0), and a window).
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
  // state and cast. The output dtype is out.dtype, apart from the inputs' (an fp8 q, k, v with a
  // bf16 output); today every kernel writes the input dtype, and validate_flash refuses another.
  TensorView out;
  Descale descale;  // last, so that the fields before it keep their offsets in the kernels' params
};

// state := merge(state, other), row by row. Shapes must match.
struct MergeParams {
  StateView state;
  StateView other;
};

// Split-KV decode: the keys are split into `splits` chunks, each chunk's partial state is
// computed separately and the partial states are merged. Same result as one flash call.
// On a GPU backend, flash.state.o may be null when flash.mode is StateMode::Write and flash.out is
// given: the split merge then writes out and the lse only, no fp32 o (the op's decode, which then
// needs no scratch; validate_flash's `o_optional`). Elsewhere the state's o is required.
struct DecodeParams {
  FlashParams flash;
  int splits = 0;  // 0 picks a default
};

// Casts the normalized fp32 state output into `out` (same shape, out.dtype).
struct FinalizeParams {
  StateView state;
  TensorView out;
};

// What a backward call does with its gradients.
enum class GradMode : uint8_t {
  Write,       // dq, dk, dv := this call's gradients (every element written)
  Accumulate,  // dq, dk, dv += this call's gradients (the ring backward sums over hops)
};

// The forward's log-sum-exp, fp32 [batch, heads, len], rows contiguous along len (like
// StateView::lse). Natural log, scale included; -inf for a row that sees no key.
struct LseView {
  const float* data = nullptr;
  int64_t batch = 0, heads = 0, len = 0;
  int64_t stride_b = 0, stride_h = 0;
  RA_HD const float* row(int64_t b, int64_t h) const { return data + b * stride_b + h * stride_h; }
};
inline LseView contiguous_lse(const float* data, int64_t b, int64_t h, int64_t t) {
  return LseView{data, b, h, t, h * t, t};
}

// Gradients of attention (the forward of FlashParams: same views, strides, GQA grouping and
// mask) for the loss whose gradient with respect to the output o is `dout`. Inputs q [B, Hq, T, D],
// k, v [B, Hkv, S, D], o and dout [B, Hq, T, D] (in the output dtype, o.dtype; today it must be
// q's), lse of the forward. Outputs
// fp32: dq [B, Hq, T, D], dk and dv [B, Hkv, S, D]; dk and dv are summed over the query heads of
// each group. The probabilities are recomputed from lse (P = exp(scale q.k - lse)), none stored;
// D = rowsum(dout * o) is computed once per row. A row with lse = -inf contributes nothing.
struct BackwardParams {
  TensorView q, k, v, o, dout;
  LseView lse;
  TensorView dq, dk, dv;  // dtype F32
  float scale = 0.f;
  MaskSpec mask;
  GradMode mode = GradMode::Write;
  // Bitwise reproducible results: dq accumulated in a fixed order (no atomics). The CPU engine is
  // deterministic either way; on a GPU the fast mode accumulates dq with atomics.
  bool deterministic = false;
  int tile_q = 0, tile_k = 0;  // CPU tile sizes; 0 picks the default. GPU kernels pick their own.
  Descale descale;  // of q, k and v (the forward's)
};

// Checks a flash call before any work. Throws InvalidArgument naming the offending value and
// what is allowed. `complete` asks that every query row sees at least one key (a complete
// attention); partial calls allow rows with no visible key. `o_optional`: state.o may be null in
// StateMode::Write when out is given (a GPU decode, DecodeParams).
void validate_flash(const FlashParams& p, bool complete, bool o_optional = false);

// Checks a backward call before any work, the same way: InvalidArgument naming the value and
// what is allowed.
void validate_backward(const BackwardParams& p);

}  // namespace ringattn
