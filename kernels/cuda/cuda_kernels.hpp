// Host-side entry points of the CUDA kernels (kernels/cuda/*.cu). The backend (cuda_backend.cpp)
// validates every call first; these functions only pick a kernel instantiation and launch it on
// `stream`. Each kernel receives one params struct by value.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/params.hpp"

namespace ringattn::cuda {

// Head dims that the tensor-core kernels (bf16/fp16) are instantiated for.
inline bool mma_head_dim_supported(int64_t d) { return d == 64 || d == 128; }
// The fp32 SIMT path keeps head_dim / 32 values per lane in registers.
inline constexpr int64_t kSimtMaxHeadDim = 256;

// Configurations of the portable tensor-core flash kernel (4 warps per CTA). Which one a call
// runs is decided by the dispatch (flash_dispatch.hpp).
enum class MmaVariant : uint8_t {
  ScaleFirst = 0,    // 16 rows per warp, 64-key tiles, scores scaled before their max: scale <= 0
  Rows16Keys64 = 1,  // 16 rows per warp, 64-key tiles (Q in registers): short query blocks
  Rows32Keys64 = 2,  // 32 rows per warp, 64-key tiles: each K/V fragment feeds two m16 tiles
  Rows32Keys32 = 3,  // 32 rows per warp, 32-key tiles (fewer live score registers)
};

// Flash forward on tensor cores (bf16/fp16 q, k, v; head dim 64 or 128) in configuration v.
// Writes or folds into p.state according to p.mode.
void launch_flash_mma(const FlashParams& p, MmaVariant v, cudaStream_t stream);

// Flash forward in true fp32 (fp32 q, k, v; head dim <= kSimtMaxHeadDim). Slow, for accuracy.
void launch_flash_simt(const FlashParams& p, cudaStream_t stream);

// Partial states of a split-KV decode: part p of state row r at o[(p * rows + r) * dim] and
// lse[p * rows + r], where r = (b * heads + h) * len + t enumerates the rows of the state.
struct SplitPartials {
  float* o = nullptr;
  float* lse = nullptr;
  int64_t parts = 0, rows = 0, dim = 0;
};

// How a decode is cut: the keys from `key0` (the first key that any query row sees) on are
// `tiles` tiles of `tile_keys` keys, dealt round robin to `splits` splits (split s takes
// tiles s, s + splits, ...).
struct DecodePlan {
  int64_t splits = 1, tiles = 1, row_blocks = 1;
  int64_t key0 = 0;
  int64_t parts = 1;  // partial states per row (one per split)
  bool wide = false;  // row blocks of 64 packed rows (a warp each) instead of 16
  int tile_keys = 64;  // keys per band tile: 128 for 16-row blocks at head dims 64 and 128, else 64
  int phased_bufs = 0;  // those 16-row blocks' half-tile buffers: 2 (long splits) or 3; else 0
};

// Plans a decode of f with the packed tensor-core kernel: enough CTAs to fill `sms`
// multiprocessors once. `splits_hint` > 0 asks for that many splits (fewer where a split would
// otherwise get no tile).
DecodePlan plan_decode_mma(const FlashParams& f, int splits_hint, int sms);

// Split-KV decode (bf16/fp16, head dims 64, 128 and 256): every CTA takes one (batch, KV head,
// split, block of 16 packed query rows, or 64 when plan.wide) and writes one partial state per row
// into `out`.
void launch_decode_mma(const FlashParams& f, const DecodePlan& plan, const SplitPartials& out, cudaStream_t stream);

// Merges all partials of each row and writes (StateMode::Write) or folds (Fold) into `state`;
// with `out` set, also casts the merged row into it (the finalize, fused: one launch fewer).
struct MergeSplitsParams {
  SplitPartials parts;
  StateView state;
  StateMode mode = StateMode::Write;
  TensorView out;  // optional: the final output in its dtype, shaped like the state
};
void launch_merge_splits(const MergeSplitsParams& p, cudaStream_t stream);

// Which of a backward call's two kernel sets runs, decided on the device without a host
// round trip: launch_nonfinite_scan sets *flag to 1 when q, k or v holds a NaN or an Inf, and
// launch_backward_delta when dout does (its D is then not finite).
// The tensor-core kernels run when it is 0 (then a masked pair's zero weight times a finite
// operand is 0, so nothing leaks), the exact SIMT kernels when it is 1 (they visit visible pairs
// only). flag == nullptr: the kernels run.
struct BackwardGate {
  const int* flag = nullptr;
  int runs_when = 0;
};

// The portable flash backward (bwd_simt.cu): SIMT, bf16/fp16/fp32 inputs, fp32 accumulation,
// head dim <= kBackwardMaxHeadDim. `delta` is scratch of batch * q_heads * q_len floats (the
// per-row D). atomic_dq: dq accumulated with fp32 atomics by the key kernel (fast; the order of
// the additions varies); else a separate dq pass in a fixed order (bitwise reproducible).
// gate.flag set: every kernel returns at once unless *gate.flag == gate.runs_when, and the grids
// are capped (grid-stride loops) so that a gated launch that does not run costs a few CTAs.
inline constexpr int64_t kBackwardMaxHeadDim = 256;
void launch_backward_simt(const BackwardParams& p, bool atomic_dq, float* delta, cudaStream_t stream,
                          BackwardGate gate = {});
// *flag := 1 if q, k or v (bf16/fp16, rows 16-byte aligned, head dim a multiple of 8, as the
// tensor-core paths require) holds a NaN or an Inf, else 0. dout is checked by the delta pass
// that follows (launch_backward_delta with the flag), which reads it anyway.
void launch_nonfinite_scan(const BackwardParams& p, int* flag, cudaStream_t stream);
// The tensor-core flash backward (bwd_mma.cu): bf16/fp16 inputs, head dim 64 or 128,
// mma.sync m16n8k16 (sm_80 and later), fp32 accumulation; q, k, v and dout 16-byte aligned with
// strides in multiples of 8 elements (cp.async). atomic_dq as launch_backward_simt's; `delta`
// holds D already (launch_backward_delta, queued before).
// gate: the key and dq kernels return at once unless *gate.flag == gate.runs_when.
void launch_backward_mma(const BackwardParams& p, bool atomic_dq, float* delta, cudaStream_t stream,
                         BackwardGate gate = {});
// The dynamic shared memory that launch_backward_mma's largest kernel asks for at head dim 64 or
// 128 (the dispatch compares it with the device's opt-in limit).
size_t backward_mma_smem_bytes(int64_t head_dim, bool atomic_dq);
// The backward's pre-pass alone: delta[(b * q_heads + h) * q_len + i] = dout_i . o_i in fp32
// (bwd_simt.cu; bf16/fp16 inputs of head dim 64 or 128, the tensor-core path's). nonfinite (the
// scan's flag, or null): set to 1 where a D is not finite (a NaN or an Inf in dout or o).
void launch_backward_delta(const BackwardParams& p, float* delta, cudaStream_t stream, int* nonfinite = nullptr);

void launch_merge(const MergeParams& p, cudaStream_t stream);
void launch_finalize(const FinalizeParams& p, cudaStream_t stream);
void launch_fill_empty(const StateView& s, cudaStream_t stream);
// fp32 views of any strides (Backend::zero_f32 / add_f32): x := 0; dst += src (same shape).
void launch_zero_f32(const TensorView& x, cudaStream_t stream);
void launch_add_f32(const TensorView& dst, const TensorView& src, cudaStream_t stream);

}  // namespace ringattn::cuda
