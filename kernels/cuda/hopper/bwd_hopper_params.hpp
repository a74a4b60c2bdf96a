// The Hopper backward's launch description, visible to host code compiled by either compiler:
// the dispatch (kernels/cuda/flash_dispatch.cpp, hopper_plan.cpp) builds it once per call, tensor
// maps included, and bwd_hopper.cu launches it.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only)

#include "kernels/params.hpp"

namespace ringattn::cuda {
namespace hopper {

struct HopperBwdParams {
  // 4-d maps over (dim, len, heads, batch), boxes of 64 x 64 rows, the 128-byte swizzle.
  CUtensorMap tm_q, tm_k, tm_v, tm_do;
  CUtensorMap tm_dq;  // fused_dq: fp32 dq, boxes of 32 x 64, 128-byte swizzle (the reduce-add target)
  LseView lse;           // the forward's natural-log lse
  const float* delta;    // D = rowsum(dout * o), [batch][q_heads][q_len] (launch_backward_delta)
  TensorView dq, dk, dv;  // fp32
  int accumulate;         // GradMode::Accumulate: add into dq, dk, dv instead of writing them
  // dq by the key kernel (dS^T through shared memory, dQ = dS K per 64-column half on each
  // consumer, bulk reduce-adds into dq zeroed first in Write mode) instead of the query kernel.
  // Fast mode only; not bitwise reproducible.
  int fused_dq;
  int batch, q_heads, kv_heads, group;  // group = q_heads / kv_heads
  int q_len, kv_len;
  MaskSpec mask;
  float scale, scale_log2;
  int key_blocks, q_blocks;  // 128-key blocks (key kernel CTAs per (batch, kv head)), 128-row query blocks
  // Set at launch: the call's non-finite flag (launch_nonfinite_scan); both kernels return at once
  // where it is 1, and the exact SIMT backward takes the call (cuda_kernels.hpp BackwardGate).
  const int* nonfinite;
};

}  // namespace hopper

// One Hopper backward call, ready to launch (delta is set at launch).
struct HopperBwdLaunch {
  int head_dim = 0;
  DType dtype = DType::BF16;
  hopper::HopperBwdParams params{};
};

}  // namespace ringattn::cuda
