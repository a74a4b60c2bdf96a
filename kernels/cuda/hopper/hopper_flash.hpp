// The Hopper (sm_90a) flash forward: wgmma, bulk tensor copies and warp specialization
// (kernels/cuda/hopper/hopper_flash_kernel.cuh). Same contract as the portable tensor-core kernel:
// bf16/fp16 q, k, v with head dim 64 or 128, GQA by index, causal with q_offset, an fp32 (o, lse)
// state written (StateMode::Write) or folded (StateMode::Fold).
#pragma once

#include <cuda_runtime.h>

#include "kernels/params.hpp"

namespace ringattn::cuda {

// True when `device` is an sm_90 GPU, this build carries sm_90a code, and p fits the kernel:
// bf16/fp16, head dim 64 or 128, positive scale, q/k/v base addresses 16-byte aligned with
// 16-byte multiple strides (what the bulk tensor copy engine needs), the state's o 8-byte
// aligned with even strides. Otherwise the caller uses the portable kernel.
// The first call per device reads a flag from the device (a synchronous copy): make one before
// capturing a CUDA graph.
bool hopper_flash_supported(const FlashParams& p, int device);

// The tile configuration the call would run with ("128x128", "128x176", "192x128", "128x128q2";
// chosen per head dim and row length, PERF.md). For logs and benchmarks. Two environment
// variables exist for benchmarking the alternatives with one build: RINGATTN_HOPPER_TILE=<name>
// forces a configuration where it exists for the head dim, RINGATTN_HOPPER_LAZY=0|1 turns the
// lazy rescaling of the running max off or on (default on).
const char* hopper_flash_config(const FlashParams& p);

// Queues the kernel on `stream`. Validates p (validate_flash with complete = false) and throws
// InvalidArgument when hopper_flash_supported(p, current device) is false.
void hopper_flash_forward(const FlashParams& p, cudaStream_t stream);

}  // namespace ringattn::cuda
