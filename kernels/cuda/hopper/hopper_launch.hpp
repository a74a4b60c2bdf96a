// Between hopper_flash.cpp (public API, errors) and hopper_flash.cu (tensor maps, launch).
#pragma once

#include <cuda_runtime.h>

#include "kernels/params.hpp"

namespace ringattn::cuda::hopper_detail {

// Throws RuntimeError naming the CUDA error, the call, file and line (hopper_flash.cpp: fmt is
// kept out of nvcc).
[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line);

// True when `device` is sm_90 and the sm_90a kernel image is loaded; *sms gets its SM count.
bool device_ready(int device, int* sms);
// Shapes, dtypes, alignment and the tensor maps (device independent).
bool fits(const FlashParams& p);
// The tile configuration a call would run with (for logs and benchmarks).
const char* config_name(const FlashParams& p);
// Launches on `stream` and returns true, or returns false without launching when !fits(p).
bool try_launch(const FlashParams& p, int sms, cudaStream_t stream);

}  // namespace ringattn::cuda::hopper_detail

#define RA_HOPPER_CHECK(call)                                                                      \
  do {                                                                                             \
    const cudaError_t ra_err_ = (call);                                                            \
    if (ra_err_ != cudaSuccess) ::ringattn::cuda::hopper_detail::throw_cuda(ra_err_, #call, __FILE__, __LINE__); \
  } while (0)
