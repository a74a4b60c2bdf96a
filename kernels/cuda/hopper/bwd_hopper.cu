// Host side of the Hopper flash backward that nvcc compiles: the kernel instantiations and their
// launch (bwd_hopper_keys.cuh, bwd_hopper_query.cuh). The call's checks and tensor maps are hopper_plan.cpp's
// plan_backward; D = rowsum(dout * o) comes from launch_backward_delta first.
#include <cuda_runtime.h>

#include <atomic>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/hopper/bwd_hopper_keys.cuh"
#include "kernels/cuda/hopper/bwd_hopper_query.cuh"
#include "kernels/cuda/hopper/hopper_launch.hpp"

namespace ringattn::cuda::hopper_detail {
namespace {

using hopper::BwdConfig;
using hopper::HopperBwdParams;

template <typename T, int D>
void launch_typed(const HopperBwdParams& hp, cudaStream_t stream) {
  using C = BwdConfig<D>;
  const unsigned key_ctas = unsigned(hp.key_blocks) * unsigned(hp.batch * hp.kv_heads);
  const unsigned dq_ctas = unsigned(hp.q_blocks) * unsigned(hp.batch * hp.q_heads);
  if (hp.fused_dq) {  // dq by the key kernel's reduce-adds
    if (!hp.accumulate) launch_zero_f32(hp.dq, stream);
    if (key_ctas == 0) return;
    auto keys = hopper::hopper_bwd_keys_kernel<T, C, true>;
    static std::atomic<uint64_t> fused_configured{0};
    set_dynamic_smem_once(keys, C::kKeySmem, fused_configured);
    keys<<<key_ctas, C::kThreads, C::kKeySmem, stream>>>(hp);
    RA_CHECK_CUDA_LAUNCH("hopper_bwd_keys_kernel (fused dq)");
    return;
  }
  if (key_ctas > 0) {
    auto keys = hopper::hopper_bwd_keys_kernel<T, C, false>;
    static std::atomic<uint64_t> keys_configured{0};
    set_dynamic_smem_once(keys, C::kKeySmem, keys_configured);
    keys<<<key_ctas, C::kThreads, C::kKeySmem, stream>>>(hp);
    RA_CHECK_CUDA_LAUNCH("hopper_bwd_keys_kernel");
  }
  if (dq_ctas == 0) return;
  auto dq = hopper::hopper_bwd_dq_kernel<T, C>;
  static std::atomic<uint64_t> dq_configured{0};
  set_dynamic_smem_once(dq, C::kDqSmem, dq_configured);
  dq<<<dq_ctas, C::kThreads, C::kDqSmem, stream>>>(hp);
  RA_CHECK_CUDA_LAUNCH("hopper_bwd_dq_kernel");
}

template <typename T>
void launch_dim(const HopperBwdParams& hp, int d, cudaStream_t stream) {
  switch (d) {
    case 64: return launch_typed<T, 64>(hp, stream);
    case 128: return launch_typed<T, 128>(hp, stream);
    default: fail_no_instance("hopper_bwd", "head_dim", d, "64 and 128");
  }
}

}  // namespace

int backward_smem_bytes(int d) {
  auto larger = [](int a, int b) { return a > b ? a : b; };
  switch (d) {
    case 64: return larger(BwdConfig<64>::kKeySmem, BwdConfig<64>::kDqSmem);
    case 128: return larger(BwdConfig<128>::kKeySmem, BwdConfig<128>::kDqSmem);
    default: return 0;
  }
}

void launch_backward(const HopperBwdLaunch& l, const float* delta, const int* nonfinite, cudaStream_t stream) {
  HopperBwdParams hp = l.params;
  hp.delta = delta;
  hp.nonfinite = nonfinite;
  switch (l.dtype) {
    case DType::BF16: return launch_dim<__nv_bfloat16>(hp, l.head_dim, stream);
    case DType::F16: return launch_dim<__half>(hp, l.head_dim, stream);
    default: fail_no_instance("hopper_bwd", "dtype", int(l.dtype), "bf16 and fp16");
  }
}

}  // namespace ringattn::cuda::hopper_detail
