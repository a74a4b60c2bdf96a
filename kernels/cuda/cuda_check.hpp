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

// Queues kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization
// on compute capability 9.0+ (an ordinary launch elsewhere): the kernel may be scheduled before
// the kernel ahead of it in the stream has finished, so its launch and prologue overlap that
// kernel's tail. The kernel must call pdl_wait_for_prior_grid (device_common.cuh) before it
// reads or writes global memory; then the launch orders memory exactly as an ordinary one.
// Returns the launch's error: callers check it with RA_CHECK_CUDA, which names their call.
template <typename... Params, typename... Args>
cudaError_t launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                Args&&... args);
// The same in clusters of cluster_x CTAs along x (grid.x a multiple of it; 1: no cluster).
template <typename... Params, typename... Args>
cudaError_t launch_programmatic_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                         cudaStream_t stream, unsigned cluster_x, Args&&... args);

}  // namespace ringattn::cuda

template <typename... Params, typename... Args>
cudaError_t ringattn::cuda::launch_programmatic_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                                         cudaStream_t stream, unsigned cluster_x, Args&&... args) {
  int device = 0, cc_major = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (const cudaError_t e = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device);
      e != cudaSuccess)
    return e;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (cc_major >= 9) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n++].val.clusterDim = {cluster_x, 1, 1};
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

template <typename... Params, typename... Args>
cudaError_t ringattn::cuda::launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                                cudaStream_t stream, Args&&... args) {
  return launch_programmatic_clusters(kernel, grid, block, smem, stream, 1u, static_cast<Args&&>(args)...);
}

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
