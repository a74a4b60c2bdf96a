// The throwing half of the CUDA error macros (cuda_check.hpp), compiled by the host compiler.
#include "kernels/cuda/cuda_check.hpp"

#include "ringattn/error.hpp"

namespace ringattn::cuda {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // Clear a sticky launch error so that the next, unrelated call does not report it again.
  (void)cudaGetLastError();
  fail_runtime("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), call, file, line);
}

void fail_no_instance(const char* launcher, const char* what, long long value, const char* allowed) {
  fail_arg("{}: {}={} has no kernel instantiation: allowed are {}", launcher, what, value, allowed);
}

}  // namespace ringattn::cuda
