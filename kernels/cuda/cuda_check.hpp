// Error checks for the CUDA backend. Every runtime call and every kernel launch goes through one
// of these macros so that a failure names the call, the file and the line. Kept free of fmt so
// that nvcc never has to parse it; the throw lives in cuda_error.cpp.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace ringattn::cuda {

// Throws ringattn::RuntimeError "CUDA error <name> (<text>) in <call> at <file>:<line>".
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

// Throws ringattn::InvalidArgument "<launcher>: <what>=<value> has no kernel instantiation:
// allowed are <allowed>": the error default of every switch over head dim or dtype (the backend
// validates first, so reaching it is a bug, never a silent fallback to another instantiation).
[[noreturn]] void fail_no_instance(const char* launcher, const char* what, long long value, const char* allowed);

// Opts `kernel` in to `bytes` of dynamic shared memory (needed above 48 KiB) on the current
// device, once per device: the attribute belongs to the (function, device) pair. `done` is the
// kernel instantiation's set of configured devices (one bit per device id).
template <typename Kernel>
void set_dynamic_smem_once(Kernel kernel, int bytes, std::atomic<uint64_t>& done);

}  // namespace ringattn::cuda

#define RA_CUDA_CHECK(call)                                                               \
  do {                                                                                    \
    const cudaError_t ra_err_ = (call);                                                   \
    if (ra_err_ != cudaSuccess) ::ringattn::cuda::throw_cuda_error(ra_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: a bad configuration shows up in cudaGetLastError; `what` names the
// kernel in the message.
#define RA_CUDA_CHECK_LAUNCH(what)                                                        \
  do {                                                                                    \
    const cudaError_t ra_err_ = cudaGetLastError();                                       \
    if (ra_err_ != cudaSuccess) ::ringattn::cuda::throw_cuda_error(ra_err_, "launch of " what, __FILE__, __LINE__); \
  } while (0)

template <typename Kernel>
void ringattn::cuda::set_dynamic_smem_once(Kernel kernel, int bytes, std::atomic<uint64_t>& done) {
  int device = 0;
  RA_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t(1) << (device & 63);
  if (done.load() & bit) return;
  RA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit);
}
