// Device helpers shared by the two CUDA backward paths (flash_bwd.cu, SIMT; flash_bwd_mma.cu,
// tensor cores): fp32 gradient rows and the query rows that may see a block of keys.
#pragma once

#include "kernels/cuda/device_common.cuh"

namespace ringattn::cuda {

__device__ __forceinline__ float* grad_row(const TensorView& g, int64_t b, int64_t h, int64_t t) {
  return static_cast<float*>(g.data) + view_offset(g, b, h, t);
}


}  // namespace ringattn::cuda
