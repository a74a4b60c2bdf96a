// Device helpers shared by the two CUDA backward paths (flash_bwd.cu, SIMT; flash_bwd_mma.cu,
// tensor cores): fp32 gradient rows and the query rows that may see a block of keys.
#pragma once

#include "kernels/cuda/device_common.cuh"

namespace ringattn::cuda {

__device__ __forceinline__ float* grad_row(const TensorView& g, int64_t b, int64_t h, int64_t t) {
  return static_cast<float*>(g.data) + view_offset(g, b, h, t);
}

// The query rows [begin, end) of [0, q_len) outside which no row sees any of the keys
// [j0, j0 + keys): a row i sees key j only when j <= i + q_offset (causal) and
// j >= i + q_offset - window (windowed), so rows before j0 - q_offset and after
// j0 + keys - 1 - q_offset + window see none. Only a bound for the loop: classify_block and
// is_visible still decide every tile and key. (The mask is clamp_offset'ed: no sum overflows.)
__device__ __forceinline__ KeyRange query_rows_of_keys(const MaskSpec& m, int64_t j0, int64_t keys, int64_t q_len) {
  int64_t begin = m.causal ? j0 - m.q_offset : 0;
  int64_t end = m.windowed() ? j0 + keys - m.q_offset + m.window : q_len;
  begin = begin < 0 ? 0 : (begin > q_len ? q_len : begin);
  end = end < begin ? begin : (end > q_len ? q_len : end);
  return {begin, end};
}

}  // namespace ringattn::cuda
