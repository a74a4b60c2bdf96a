// The online-softmax update of one row of a score tile held in m16n8 accumulators, shared by the
// portable flash kernel (fwd_mma.cu) and the split-KV decode kernel (decode_mma.cu).
#pragma once

#include "kernels/cuda/device_common.cuh"

namespace ringattn::cuda {

// s[n][half * 2 + e] holds key n * 8 + 2 * (lane % 4) + e (within the tile) of the thread's row
// `half` (lane / 4 + 8 * half of the m16 tile). Masks the keys at or past key_end when need_mask
// (warp-uniform), and with kLower also those before key_begin (a window's lower edge; without it
// key_begin is not read, so the unwindowed instantiations keep one compare per score), folds the
// row's max into the running max m (log2 units), overwrites the
// scores with p = 2^(x - base) and adds their sum to the thread's partial row sum l. Returns the
// factor alpha by which the row's accumulator must be scaled (0 before the row's first key, 1
// once the max has settled).
//
// kPosScale (scale > 0): the scores stay raw through the max (max commutes with a positive scale)
// and the scale is folded into the exponent's FFMA; otherwise they are scaled first.
template <int kNT, bool kPosScale, bool kLower = false>
__device__ __forceinline__ float online_softmax_row(float (&s)[kNT][4], int half, int lane, bool need_mask,
                                                    int key_begin, int key_end, float scale_log2, float& m, float& l) {
  float mx = neg_inf();
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float x = kPosScale ? s[n][half * 2 + e] : s[n][half * 2 + e] * scale_log2;
      const int key = n * 8 + (lane & 3) * 2 + e;
      if (need_mask && (key >= key_end || (kLower && key < key_begin))) x = neg_inf();
      s[n][half * 2 + e] = x;
      mx = fmaxf(mx, x);
    }
  }
  mx = quad_max(mx);
  if (kPosScale) mx *= scale_log2;  // -inf stays -inf
  // A row that has seen only masked keys keeps m = -inf; its base is 0 then, not -inf.
  const OnlineStep st = online_step(m, mx, FastExp2{});
  float sum = 0.f;
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float x = s[n][half * 2 + e];
      const float pe = kPosScale ? fast_exp2(fmaf(x, scale_log2, -st.base)) : fast_exp2(x - st.base);
      s[n][half * 2 + e] = pe;
      sum += pe;
    }
  }
  l = l * st.alpha + sum;  // per-thread partial row sum; reduced at the end
  return st.alpha;
}

// A row's key bound (the begin or end of its visible_range, core/mask.hpp) as an index within a
// tile of `keys` keys that starts at key key0, clamped to [0, keys]: the key_begin / key_end of
// online_softmax_row.
__device__ __forceinline__ int tile_key_bound(int64_t bound, int64_t key0, int keys) {
  const int64_t e = bound - key0;
  return int(e < 0 ? 0 : (e > keys ? keys : e));
}

}  // namespace ringattn::cuda
