// Error helpers of the CUDA backend. Every runtime call and every kernel launch goes through
// RA_CHECK_CUDA / RA_CHECK_CUDA_LAUNCH (core/check.hpp) so that a failure names the call, the
// file, the line and the rank. Kept free of fmt so that nvcc can parse it; the throws live in
// core/check.cpp and cuda_error.cpp.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "core/check.hpp"

namespace ringattn::cuda {

// Throws ringattn::InvalidArgument "<launcher>: <what>=<value> has no kernel instantiation:
// allowed are <allowed>": the error default of every switch over head dim or dtype (the backend
// validates first, so reaching it is a bug, never a silent fallback to another instantiation).
[[noreturn]] void fail_no_instance(const char* launcher, const char* what, long long value, const char* allowed);

// Throws ringattn::InvalidArgument: a kernel needs `bytes` of shared memory per block, more than
// device `device` allows one block (`optin`).
[[noreturn]] void fail_smem_too_large(int bytes, int device, int optin);

// Opts `kernel` in to `bytes` of dynamic shared memory (needed above 48 KiB) on the current
// device, once per device: the attribute belongs to the (function, device) pair. `done` is the
// kernel instantiation's set of configured devices (one bit per device id).
template <typename Kernel>
void set_dynamic_smem_once(Kernel kernel, int bytes, std::atomic<uint64_t>& done);

}  // namespace ringattn::cuda

template <typename Kernel>
void ringattn::cuda::set_dynamic_smem_once(Kernel kernel, int bytes, std::atomic<uint64_t>& done) {
  int device = 0;
  RA_CHECK_CUDA(cudaGetDevice(&device));
  const uint64_t bit = uint64_t(1) << (device & 63);
  if (done.load() & bit) return;
  // Checked here so that the error names the limit (cudaFuncSetAttribute says only "invalid
  // argument"): e.g. decode at head dim 256 needs 136 KiB, sm_86 and sm_89 allow 99 KiB.
  int optin = 0;
  RA_CHECK_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > optin) fail_smem_too_large(bytes, device, optin);
  RA_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit);
}
