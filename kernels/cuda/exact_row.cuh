// One query row of attention computed exactly by one warp: the row's q and accumulator spread
// over the lanes (head_dim / 32 values each), every key's score a warp-wide dot product, the
// online softmax one key at a time in natural units (expf/logf), and only the keys the caller
// names visited. It is the fp32 SIMT kernel's body (fwd_simt.cu), and the tensor-core kernels'
// slow path for rows whose fast result is not finite (`row_not_finite`): a key the mask hides is
// still multiplied in a tile's P V (p = 0 times a NaN or inf value is NaN), so a non-finite value
// at a masked key would reach rows that cannot see it. Such rows are recomputed here, over their
// visible keys only, which gives NaN exactly where a visible key or value is not finite; rows
// whose fast result is finite were never touched by a non-finite value and keep it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/device_common.cuh"

namespace ringattn::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void store_float(float* dst, float x) { *dst = x; }
__device__ __forceinline__ void store_float(__half* dst, float x) { *dst = __float2half_rn(x); }
__device__ __forceinline__ void store_float(__nv_bfloat16* dst, float x) { *dst = __float2bfloat16_rn(x); }

// Whether x is NaN or +-inf (true for a sum that overflowed: then the row is recomputed, which
// costs time, not accuracy).
__device__ __forceinline__ bool not_finite(float x) { return !(fabsf(x) <= 3.402823466e38f); }

// Whether a row's fast result is not finite, the same on the four lanes of its quad: this thread's
// accumulator columns of the row (half 0 or 1 of an m16n8 accumulator tile: acc[n][half * 2 + e]
// holds column n * 8 + 2 * (lane % 4) + e of row lane / 4 + 8 * half) and the row sum.
template <int kDT>
__device__ __forceinline__ bool quad_row_not_finite(const float (&acc)[kDT][4], int half, float sum) {
  float z = 0.f;
#pragma unroll
  for (int n = 0; n < kDT; ++n) z += acc[n][half * 2] + acc[n][half * 2 + 1];
  return not_finite(quad_sum(z)) || not_finite(sum);
}

// The m16 row tiles' rows r in [0, 16) (lane / 4 + 8 * half, one quad a row: the mma.sync and
// wgmma accumulator layouts) whose bad[half] is set on their quad, as a bit mask of the warp.
__device__ __forceinline__ unsigned redo_mask(const bool (&bad)[2]) {
  unsigned rows = 0u;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const unsigned lanes = __ballot_sync(0xffffffffu, bad[half]);
#pragma unroll
    for (int g = 0; g < 8; ++g)
      if (lanes & (1u << (4 * g))) rows |= 1u << (g + 8 * half);
  }
  return rows;
}

// The running state of one row over the lanes of a warp. kPer = ceil(head_dim / 32).
template <typename T, int kPer>
struct ExactRow {
  float q[kPer], acc[kPer];
  float m, l, scale;
  int lane, dim;

  __device__ __forceinline__ void start(const T* q_row, int head_dim, float softmax_scale) {
    lane = threadIdx.x % 32;
    dim = head_dim;
    scale = softmax_scale;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int d = lane + 32 * e;
      q[e] = d < dim ? to_float(q_row[d]) : 0.f;
      acc[e] = 0.f;
    }
    m = neg_inf();
    l = 0.f;
  }

  // Keys [keys.begin, keys.end) of k and v (rows stride_k / stride_v elements apart).
  __device__ __forceinline__ void add_keys(const T* k, int64_t stride_k, const T* v, int64_t stride_v, KeyRange keys) {
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      const T* kj = k + j * stride_k;
      const T* vj = v + j * stride_v;
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const int d = lane + 32 * e;
        if (d < dim) dot = fmaf(q[e], to_float(kj[d]), dot);
      }
      const float x = warp_sum(dot) * scale;
      const OnlineStep st = online_step(m, x, [](float y) { return expf(y); });
      const float pj = expf(x - st.base);
      l = l * st.alpha + pj;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const int d = lane + 32 * e;
        acc[e] = acc[e] * st.alpha + (d < dim ? pj * to_float(vj[d]) : 0.f);
      }
    }
  }

  // The row's lse (natural log, scale included; -inf when it saw no key, NaN when a non-finite
  // value reached it) and its normalized o in place of acc.
  __device__ __forceinline__ float finish() {
    const float inv = inv_sum(l);
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[e] *= inv;
    return lse_from_stats(m, l);
  }
};

// Writes (Write) or folds (Fold: state := merge(state, row)) a finished row into its state row
// o / lse, lanes over the head dims. With `out` set the row's final value (after the fold) goes
// there in out's dtype instead of into o (which Fold still reads). Rows that saw no key: Write
// stores the empty state, Fold leaves the state as it was (and casts it into out).
template <typename T, typename Out, int kPer>
__device__ __forceinline__ void store_exact_row(const ExactRow<T, kPer>& r, float lse_b, bool fold, float* o,
                                                float* lse, Out* out) {
  const float lse_a = fold ? *lse : neg_inf();
  __syncwarp();  // every lane has read lse before lane 0 writes it
  float wa = 0.f, wb = 1.f, merged = lse_b;
  const bool add = merge_weights(lse_a, lse_b, wa, wb, merged);  // false: the row saw no key
  if (!fold && !add) merged = lse_b;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int d = r.lane + 32 * e;
    if (d >= r.dim) continue;
    float x;
    if (!fold) x = r.acc[e];
    else if (!add) x = o[d];
    else x = lse_a == neg_inf() ? r.acc[e] : o[d] * wa + r.acc[e] * wb;
    if (out != nullptr) store_float(out + d, x);
    else o[d] = x;
  }
  if (r.lane == 0 && (add || !fold)) *lse = merged;
}

// The tensor-core kernels' slow path: recomputes one row (q_row) over `keys` of k and v exactly and
// stores it as store_exact_row does. Called by a whole warp; not inlined, so that the portable
// kernels' register allocation does not carry it. (In the persistent Hopper kernel either form
// spilled: its slow rows are recomputed by a kernel of their own, fwd_hopper_redo.cuh.)
template <typename T, int kPer, typename Out>
__device__ __noinline__ void redo_row(const T* q_row, const T* k, int64_t stride_k, const T* v, int64_t stride_v,
                                      int dim, float scale, KeyRange keys, bool fold, float* o, float* lse, Out* out) {
  ExactRow<T, kPer> r;
  r.start(q_row, dim, scale);
  r.add_keys(k, stride_k, v, stride_v, keys);
  const float lse_b = r.finish();
  store_exact_row(r, lse_b, fold, o, lse, out);
}

// The same over the keys the row sees (vis) of n tiles of tile_keys keys, the j-th starting at key
// first + j * step (a split-KV partial's keys), always written (Write): a partial that saw no key
// is the empty state.
template <typename T, int kPer>
__device__ __noinline__ void redo_row_tiles(const T* q_row, const T* k, int64_t stride_k, const T* v, int64_t stride_v,
                                            int dim, float scale, KeyRange vis, int64_t first, int64_t step,
                                            int tile_keys, int n, float* o, float* lse) {
  ExactRow<T, kPer> r;
  r.start(q_row, dim, scale);
  for (int j = 0; j < n; ++j) {
    const int64_t k0 = first + j * step, k1 = k0 + tile_keys;
    r.add_keys(k, stride_k, v, stride_v, KeyRange{k0 > vis.begin ? k0 : vis.begin, k1 < vis.end ? k1 : vis.end});
  }
  const float lse_b = r.finish();
  store_exact_row(r, lse_b, false, o, lse, static_cast<float*>(nullptr));
}

}  // namespace ringattn::cuda
