// Error checks for the CUDA backend. Every runtime call and every kernel launch goes through one
// of these macros so that a failure names the call, the file and the line. Kept free of fmt so
// that nvcc never has to parse it; the throw lives in cuda_error.cpp.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <utility>

namespace ringattn::cuda {

// Throws ringattn::RuntimeError "CUDA error <name> (<text>) in <call> at <file>:<line>".
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

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

namespace ringattn::cuda {

// Opts `kernel` in to `bytes` of dynamic shared memory (needed above 48 KiB) on the current
// device. The attribute belongs to the function on one device, so a process that uses two GPUs
// must set it on each: it is set once per (kernel, device) pair.
inline void set_max_dynamic_smem(const void* kernel, int bytes) {
  int device = 0;
  RA_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  const std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, device})) return;
  RA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.insert({kernel, device});
}

}  // namespace ringattn::cuda
