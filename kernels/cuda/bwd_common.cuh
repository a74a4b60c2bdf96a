// Device helpers shared by the CUDA backward paths (bwd_simt.cu, SIMT; bwd_mma.cu, mma.sync;
// hopper/bwd_hopper_{common,keys,query}.cuh, wgmma): fp32 gradient rows and the lse in exponent units.
#pragma once

#include "kernels/cuda/cuda_kernels.hpp"  // BackwardGate
#include "kernels/cuda/device_common.cuh"

namespace ringattn::cuda {

__device__ __forceinline__ float* grad_row(const TensorView& g, int64_t b, int64_t h, int64_t t) {
  return static_cast<float*>(g.data) + view_offset(g, b, h, t);
}

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// lse of row i in log2 units for the exponent, +inf where P must be 0 (past q_len, or a row that
// sees no key: lse = -inf, so that -inf - -inf never happens).
__device__ __forceinline__ float lse_log2_of(const float* lse_row, int64_t i, int64_t len) {
  if (i >= len) return pos_inf();
  const float l = lse_row[i];
  return l == neg_inf() ? pos_inf() : l * kLog2e;
}

// A gated kernel that must not run (cuda_kernels.hpp BackwardGate): every thread returns at once.
__device__ __forceinline__ bool gate_shut(const BackwardGate& g) {
  return g.flag != nullptr && *g.flag != g.runs_when;
}

}  // namespace ringattn::cuda
