// Public entry points of the Hopper flash forward: the support check and the checked launch.
#include "kernels/cuda/hopper/hopper_flash.hpp"

#include "kernels/cuda/hopper/hopper_launch.hpp"
#include "ringattn/error.hpp"

namespace ringattn::cuda {

namespace hopper_detail {
void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  fail_runtime("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), call, file, line);
}
}  // namespace hopper_detail

bool hopper_flash_supported(const FlashParams& p, int device) {
  return hopper_detail::device_ready(device, nullptr) && hopper_detail::fits(p);
}

const char* hopper_flash_config(const FlashParams& p) { return hopper_detail::config_name(p); }

void hopper_flash_forward(const FlashParams& p, cudaStream_t stream) {
  validate_flash(p, /*complete=*/false);
  int device = 0;
  RA_HOPPER_CHECK(cudaGetDevice(&device));
  int sms = 0;
  if (!hopper_detail::device_ready(device, &sms))
    fail_arg("hopper_flash_forward needs an sm_90 GPU and a build with sm_90a code; device {} is not one. Use the "
             "portable kernel (launch_flash_mma)", device);
  if (!hopper_detail::try_launch(p, sms, stream))
    fail_arg("hopper_flash_forward cannot run this call (dtype {}, head_dim {}, scale {}): it needs bf16 or fp16, "
             "head_dim 64 or 128, scale > 0, q/k/v base addresses 16-byte aligned with strides a multiple of 8 "
             "elements, and the state's o 8-byte aligned with even strides. Use the portable kernel",
             dtype_name(p.q.dtype), p.q.dim, p.scale);
}

}  // namespace ringattn::cuda
