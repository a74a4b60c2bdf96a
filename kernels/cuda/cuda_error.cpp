// The throwing half of the CUDA error helpers (cuda_check.hpp), compiled by the host compiler.
#include "kernels/cuda/cuda_check.hpp"

#include "core/error.hpp"

namespace ringattn::cuda {

void fail_no_instance(const char* launcher, const char* what, long long value, const char* allowed) {
  fail_arg("{}: {}={} has no kernel instantiation: allowed are {}", launcher, what, value, allowed);
}

void fail_smem_too_large(int bytes, int device, int optin) {
  fail_arg("the kernel needs {} bytes of shared memory per block; GPU {} allows at most {} (this head dim or "
           "configuration needs a GPU with more shared memory)",
           bytes, device, optin);
}

}  // namespace ringattn::cuda
