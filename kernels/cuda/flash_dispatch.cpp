// The CUDA flash dispatch (flash_dispatch.hpp): device properties and options read once, then
// one decision per call.
#include "kernels/cuda/flash_dispatch.hpp"

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/hopper/hopper_launch.hpp"
#include "core/error.hpp"

namespace ringattn::cuda {
namespace {

// The grid's y and z dimensions hold at most 65535 blocks.
std::string grid_problem(const char* what, int64_t n) {
  if (n <= 65535) return {};
  return fmt::format("{} = {} exceeds the CUDA grid limit of 65535 for one launch", what, n);
}

// The head dims of the 16-bit forward (flash and decode): 64 and 128 on every tensor-core kernel,
// 256 on the Hopper forward and the decode kernel only (choose_tensor_core refuses it elsewhere).
bool forward_head_dim_supported(int64_t d) { return mma_head_dim_supported(d) || d == 256; }

// The tensor-core kernels' rules for their 16-bit inputs: a head dim they take (`forward`: the
// forward's, else the backward's 64 or 128), and views that cp.async can read.
std::string mma_views_problem(int64_t d, DType dt, std::initializer_list<std::pair<const char*, const TensorView*>> views,
                              bool forward = false) {
  if (forward && !forward_head_dim_supported(d))
    return fmt::format("head_dim={} is not supported by the CUDA {} kernels: allowed are 64, 128 and 256 (256: the "
                       "Hopper flash kernel and decode)",
                       d, dtype_name(dt));
  if (!forward && !mma_head_dim_supported(d))
    return fmt::format("head_dim={} is not supported by the CUDA {} kernels: allowed are 64 and 128", d, dtype_name(dt));
  // cp.async moves 16 bytes at a time.
  for (const auto& [name, t] : views) {
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0)
      return fmt::format("{} data at {} is not 16-byte aligned, as the CUDA {} kernels require", name, t->data,
                         dtype_name(t->dtype));
    const int64_t per16 = 16 / dtype_size(t->dtype);  // elements in 16 bytes
    if (t->stride_b % per16 != 0 || t->stride_h % per16 != 0 || t->stride_t % per16 != 0)
      return fmt::format("{} strides (b={}, h={}, t={}) must be multiples of {} elements (16 bytes) for the CUDA {} "
                         "kernels",
                         name, t->stride_b, t->stride_h, t->stride_t, per16, dtype_name(t->dtype));
  }
  return {};
}

std::string mma_layout_problem(const FlashParams& p) {
  return mma_views_problem(p.q.dim, p.q.dtype, {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}}, /*forward=*/true);
}

// The portable kernel's configuration: the one built to scale scores before their max for a
// zero or negative scale (legal, if unusual); else the requested one; else 32 rows per warp for
// long query blocks and 16 for short ones, so that small problems still spread over many CTAs.
MmaVariant pick_mma_variant(const FlashParams& p, const FlashKernelOptions& opt) {
  if (!(p.scale > 0.f)) return MmaVariant::ScaleFirst;
  switch (opt.mma_variant) {
    case 2: return MmaVariant::Rows32Keys64;
    case 3: return MmaVariant::Rows32Keys32;
    case 0: return p.q.len >= 512 ? MmaVariant::Rows32Keys64 : MmaVariant::Rows16Keys64;
    default: return MmaVariant::Rows16Keys64;
  }
}

// bf16/fp16 once the shared layout rules hold: the Hopper kernel where it may and does take the
// call, else the portable one, unless the Hopper kernel was required.
void choose_tensor_core(const DeviceCaps& dev, const FlashParams& p, const FlashKernelOptions& opt, FlashChoice& c) {
  const hopper_detail::HopperOptions hopt{opt.hopper_tile, opt.hopper_lazy};
  c.hopper_tile = hopper_tile_name(hopper_detail::pick_tile(p, hopt));
  const char* why = "it needs an sm_90 GPU and a build with sm_90a code";
  const bool hopper_device = dev.cc_major == 9 && dev.cc_minor == 0 && dev.hopper_image;
  if (opt.kernel != FlashKernel::Portable && hopper_device) {
    why = hopper_detail::plan(p, hopt, dev.smem_optin, dev.l2_bytes, &c.hopper);
    if (why == nullptr) {
      c.path = FlashPath::Hopper;
      return;
    }
  }
  if (opt.kernel == FlashKernel::Hopper) {
    c.reason = fmt::format("RINGATTN_FLASH_KERNEL=hopper, but the Hopper kernel does not take this call on GPU {} "
                           "(dtype {}, head_dim {}, scale {}): {}",
                           dev.device, dtype_name(p.q.dtype), p.q.dim, p.scale, why);
    return;
  }
  if (!mma_head_dim_supported(p.q.dim)) {
    const std::string hopper_no = opt.kernel == FlashKernel::Portable
                                      ? std::string("RINGATTN_FLASH_KERNEL=portable excludes it")
                                      : fmt::format("it does not take this call on GPU {}: {}", dev.device, why);
    c.reason = fmt::format("head_dim={} runs only on the Hopper flash kernel, and {}; the portable CUDA {} kernels "
                           "allow head_dim 64 and 128",
                           p.q.dim, hopper_no, dtype_name(p.q.dtype));
    return;
  }
  c.path = FlashPath::Portable;
  c.mma = pick_mma_variant(p, opt);
}

}  // namespace

FlashKernelOptions flash_options(const KernelChoices& k) {
  FlashKernelOptions o;
  o.kernel = k.flash;
  o.backward_kernel = k.backward;
  o.backward_dq = k.backward_dq;
  o.hopper_tile = k.hopper_tile;
  o.hopper_lazy = k.hopper_lazy;
  return o;
}

DeviceCaps query_device(int device) {
  DeviceCaps d;
  d.device = device;
  RA_CHECK_CUDA(cudaSetDevice(device));
  RA_CHECK_CUDA(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  RA_CHECK_CUDA(cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  RA_CHECK_CUDA(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device));
  RA_CHECK_CUDA(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  int l2 = 0;
  RA_CHECK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  d.l2_bytes = l2;
  d.hopper_image = d.cc_major == 9 && d.cc_minor == 0 && hopper_detail::image_loaded(device);
  return d;
}

std::string cuda_layout_problem(const FlashParams& p) {
  std::string why;
  if (p.q.dtype == DType::F32) {
    if (p.q.dim > kSimtMaxHeadDim)
      return fmt::format("head_dim={} is not supported by the CUDA fp32 path: allowed are 1..{}", p.q.dim,
                         kSimtMaxHeadDim);
  } else if (why = mma_layout_problem(p); !why.empty()) {
    return why;
  }
  if (why = grid_problem("batch * q_heads", p.q.batch * p.q.heads); !why.empty()) return why;
  // Causal and windowed launches put the query tiles (of at least 64 rows) in the grid's y
  // dimension (heaviest tiles first, fwd_mma.cu).
  if ((p.mask.causal || p.mask.windowed()) && p.q.dtype != DType::F32)
    return grid_problem(p.mask.causal ? "causal query tiles ceil(q_len / 64)" : "windowed query tiles ceil(q_len / 64)",
                        (p.q.len + 63) / 64);
  return {};
}

FlashChoice choose_flash_kernel(const DeviceCaps& dev, const FlashParams& p, const FlashKernelOptions& opt) {
  FlashChoice c;
  c.reason = cuda_layout_problem(p);
  if (!c.reason.empty()) return c;
  if (p.q.dtype == DType::F32) c.path = FlashPath::Simt;
  else choose_tensor_core(dev, p, opt, c);
  return c;
}

void launch_flash(const FlashChoice& c, const FlashParams& p, const DeviceCaps& dev, cudaStream_t stream) {
  switch (c.path) {
    case FlashPath::Hopper: return hopper_detail::launch(c.hopper, dev.sms, stream);  // writes p.out itself
    case FlashPath::Portable: launch_flash_mma(p, c.mma, stream); break;
    case FlashPath::Simt: launch_flash_simt(p, stream); break;
    case FlashPath::None: fail_arg("{}", c.reason);
  }
  if (p.out.data != nullptr) launch_finalize(FinalizeParams{p.state, p.out}, stream);
}

std::string backward_mma_problem(const DeviceCaps& dev, const BackwardParams& p, bool atomic_dq) {
  if (p.q.dtype != DType::BF16 && p.q.dtype != DType::F16)
    return fmt::format("the tensor-core backward takes bf16 and fp16 inputs, not {}", dtype_name(p.q.dtype));
  if (dev.cc_major < 8)
    return fmt::format("the tensor-core backward needs compute capability 8.0 or later; GPU {} is {}.{}", dev.device,
                       dev.cc_major, dev.cc_minor);
  std::string why = mma_views_problem(p.q.dim, p.q.dtype, {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"dout", &p.dout}});
  if (!why.empty()) return why;
  const size_t smem = backward_mma_smem_bytes(p.q.dim, atomic_dq);
  if (smem > size_t(dev.smem_optin))
    return fmt::format("the tensor-core backward at head_dim {} needs {} bytes of shared memory per block; GPU {} "
                       "allows {}",
                       p.q.dim, smem, dev.device, dev.smem_optin);
  // The key kernel's key blocks and the separate dq kernel's query blocks (64 each) are the
  // grid's y dimension.
  if (why = grid_problem("key blocks ceil(kv_len / 64)", (p.k.len + 63) / 64); !why.empty()) return why;
  if (!atomic_dq) return grid_problem("query blocks ceil(q_len / 64)", (p.q.len + 63) / 64);
  return {};
}

std::string backward_hopper_problem(const DeviceCaps& dev, const BackwardParams& p, bool fused_dq,
                                    HopperBwdLaunch* out) {
  if (!dev.hopper_image)
    return fmt::format("the Hopper backward runs only on compute capability 9.0 with the sm_90a image loaded; GPU {} "
                       "is {}.{}",
                       dev.device, dev.cc_major, dev.cc_minor);
  if (const char* why = hopper_detail::plan_backward(p, dev.smem_optin, fused_dq, out)) return why;
  return {};
}

BackwardChoice choose_backward_kernel(const DeviceCaps& dev, const BackwardParams& p, const FlashKernelOptions& opt) {
  BackwardChoice c;
  if (p.q.dim > kBackwardMaxHeadDim) {
    c.reason = fmt::format("head_dim={} is not supported by the CUDA backward: allowed are 1..{}", p.q.dim,
                           kBackwardMaxHeadDim);
    return c;
  }
  if (c.reason = grid_problem("batch * q_heads", p.q.batch * p.q.heads); !c.reason.empty()) return c;
  if (c.reason = grid_problem("batch * kv_heads", p.k.batch * p.k.heads); !c.reason.empty()) return c;
  c.atomic_dq = !p.deterministic;
  if (opt.backward_kernel == BackwardKernel::Simt) {
    c.path = BackwardPath::Simt;
    return c;
  }
  if (opt.backward_kernel == BackwardKernel::Auto || opt.backward_kernel == BackwardKernel::Hopper) {
    const std::string why = backward_hopper_problem(dev, p, opt.backward_dq != BackwardDq::Separate, &c.hopper);
    if (why.empty()) {
      c.path = BackwardPath::Hopper;
      c.atomic_dq = c.hopper.params.fused_dq != 0;
      return c;
    }
    if (opt.backward_kernel == BackwardKernel::Hopper) {
      c.reason = fmt::format("RINGATTN_BACKWARD_KERNEL=hopper, but the Hopper backward does not take this call on GPU "
                             "{} (dtype {}, head_dim {}): {}",
                             dev.device, dtype_name(p.q.dtype), p.q.dim, why);
      return c;
    }
  }
  const bool mma_atomic = !p.deterministic && opt.backward_dq == BackwardDq::Atomic;
  const std::string why = backward_mma_problem(dev, p, mma_atomic);
  if (why.empty()) {
    c.path = BackwardPath::Mma;
    c.atomic_dq = mma_atomic;
  } else if (opt.backward_kernel == BackwardKernel::Mma) {
    c.reason = fmt::format("RINGATTN_BACKWARD_KERNEL=mma, but the tensor-core backward does not take this call on GPU "
                           "{} (dtype {}, head_dim {}): {}",
                           dev.device, dtype_name(p.q.dtype), p.q.dim, why);
  } else {
    c.path = BackwardPath::Simt;
  }
  return c;
}

// The tensor-core paths multiply whole tiles, so a masked pair's zero weight meets the other
// operand (dS K, dS^T Q, P^T dout): a NaN or Inf there would reach rows that cannot see it as
// 0 x NaN. The scan (q, k, v) and the delta pass (dout, which it reads anyway) set the call's
// flag when any input holds one; the tensor-core kernels then return at once and the exact SIMT
// kernels, which visit visible pairs only, take the call. All are queued; the device decides, so
// the host never waits.
void launch_backward(const BackwardChoice& c, const BackwardParams& p, float* delta, int* nonfinite,
                     cudaStream_t stream) {
  switch (c.path) {
    case BackwardPath::Hopper:
    case BackwardPath::Mma:
      launch_nonfinite_scan(p, nonfinite, stream);
      launch_backward_delta(p, delta, stream, nonfinite);
      if (c.path == BackwardPath::Hopper) {
        hopper_detail::launch_backward(c.hopper, delta, nonfinite, stream);
      } else {
        launch_backward_mma(p, c.atomic_dq, delta, stream, BackwardGate{nonfinite, 0});
      }
      return launch_backward_simt(p, c.atomic_dq, delta, stream, BackwardGate{nonfinite, 1});
    case BackwardPath::Simt: return launch_backward_simt(p, c.atomic_dq, delta, stream);
    case BackwardPath::None: fail_arg("{}", c.reason);
  }
  fail_arg("internal: unknown backward path {}", int(c.path));
}

}  // namespace ringattn::cuda
