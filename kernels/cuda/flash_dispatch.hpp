// The one place where the CUDA backend picks a flash kernel for a call: the Hopper kernel (in
// one of its tile configurations), the portable mma.sync kernel (in one of its
// configurations), the fp32 SIMT kernel, or none, with the reason. It decides from the device
// (DeviceCaps, read once when the backend is made), the call's FlashParams and the options
// (FlashKernelOptions, from the caller's KernelChoices when the backend is made, core/settings.hpp;
// tests and benchmarks pass their own). The backend's flash(), the tests' and benchmarks' "would this
// kernel take the call" questions, and every "cannot run this call" message go through
// choose_flash_kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/settings.hpp"
#include "kernels/backend.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/hopper/hopper_launch.hpp"  // the Hopper kernels' launch descriptions and hopper_tile_name

namespace ringattn::cuda {

// The kernel choices (RINGATTN_FLASH_KERNEL, RINGATTN_BACKWARD_KERNEL, RINGATTN_BACKWARD_DQ) are
// core's (core/settings.hpp, which says what each value does).
using ringattn::BackwardDq;
using ringattn::BackwardKernel;
using ringattn::FlashKernel;
using ringattn::backward_kernel_name;
using ringattn::flash_kernel_name;

struct FlashKernelOptions {
  FlashKernel kernel = FlashKernel::Auto;  // RINGATTN_FLASH_KERNEL=auto|hopper|portable
  BackwardKernel backward_kernel = BackwardKernel::Auto;  // RINGATTN_BACKWARD_KERNEL=auto|hopper|mma|simt
  // How the tensor-core backwards form dq outside deterministic mode (RINGATTN_BACKWARD_DQ=
  // auto|separate|atomic). Separate: the query kernel, which is also the deterministic one.
  // Atomic: reductions from the key kernel (the Hopper kernels' bulk reduce-adds, the mma.sync
  // kernel's fp32 atomics). Auto, the default, takes what measured faster on the H200
  // (kernels/cuda/PERF.md): atomic on the Hopper kernels (1.05-1.15x at head dim 128, 1.15-1.26x
  // at 64), separate on the mma.sync one (1.2-1.6x). The SIMT kernels keep their atomics.
  BackwardDq backward_dq = BackwardDq::Auto;
  // The portable kernel's configuration (MmaVariant 1..3); 0 picks it by q_len. For tests and
  // benchmarks; no environment variable.
  int mma_variant = 0;
  // RINGATTN_HOPPER_TILE=<name> (hopper_tile_name): that tile configuration wherever it exists
  // for the head dim and takes the call (the c2 clusters: where tiles pair up, hopper_plan.cpp),
  // the measured default elsewhere. Empty: the default everywhere.
  std::string hopper_tile;
  bool hopper_lazy = true;  // RINGATTN_HOPPER_LAZY=0|1: lazy rescaling of the running max
};

// The options of the kernel choices `k` (core/settings.hpp: RINGATTN_FLASH_KERNEL,
// RINGATTN_BACKWARD_KERNEL, RINGATTN_BACKWARD_DQ, RINGATTN_HOPPER_TILE, RINGATTN_HOPPER_LAZY);
// mma_variant 0.
FlashKernelOptions flash_options(const KernelChoices& k);

// What the dispatch needs to know about a device, read once.
struct DeviceCaps {
  int device = -1;
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  int smem_optin = 0;         // dynamic shared memory a block may opt in to, in bytes
  int64_t l2_bytes = 0;       // the L2 cache (the Hopper tile order sizes its sections by it)
  bool hopper_image = false;  // this build's sm_90a code is what runs on the device
};
// Makes `device` current and reads its properties (a synchronous copy from the device: call it
// before capturing a CUDA graph).
DeviceCaps query_device(int device);

enum class FlashPath : uint8_t { None, Hopper, Portable, Simt };

// The decision for one call. Hopper carries the launch with its tensor maps already encoded;
// Portable its configuration; None the reason, a complete sentence for an InvalidArgument.
struct FlashChoice {
  FlashPath path = FlashPath::None;
  MmaVariant mma = MmaVariant::Rows32Keys64;
  HopperLaunch hopper;
  const char* hopper_tile = nullptr;  // bf16/fp16: the tile configuration the Hopper kernel would use
  std::string reason;
};

// p must have passed validate_flash (complete = false).
FlashChoice choose_flash_kernel(const DeviceCaps& dev, const FlashParams& p, const FlashKernelOptions& opt);

// Queues the chosen kernel on `stream` (and, on the portable and SIMT paths, the cast into p.out
// when p.out is set). Throws InvalidArgument with c.reason when c.path is None.
void launch_flash(const FlashChoice& c, const FlashParams& p, const DeviceCaps& dev, cudaStream_t stream);

// The layout rules that every CUDA kernel of a dtype has (head dims, 16-byte rows, grid limits):
// the reason p breaks one, or "" when it breaks none. choose_flash_kernel and the decode path
// share it.
std::string cuda_layout_problem(const FlashParams& p);

// The backward's decision for one call: the Hopper kernels (wgmma, sm_90a; dq by its own kernel,
// deterministic either way, or, by default outside deterministic mode, by the key kernel's
// reduce-adds at head dim 128), the tensor-core kernels (mma.sync, sm_80 and later) or
// the SIMT kernels, the last two with dq by atomics or, when p.deterministic, by a deterministic
// pass; or none with the reason. Under BackwardKernel::Auto a call goes to the first of them
// that takes it (the Hopper kernels need bf16/fp16, head dim 64 or 128 and views the bulk copy
// engine can read; the mma.sync ones the same with cp.async).
enum class BackwardPath : uint8_t { None, Simt, Mma, Hopper };
struct BackwardChoice {
  BackwardPath path = BackwardPath::None;
  bool atomic_dq = false;
  HopperBwdLaunch hopper;  // path Hopper: the planned launch (tensor maps encoded)
  std::string reason;
};
// p must have passed validate_backward.
BackwardChoice choose_backward_kernel(const DeviceCaps& dev, const BackwardParams& p,
                                      const FlashKernelOptions& opt = {});
// Why the tensor-core backward cannot take p on dev, or "" when it can; atomic_dq: dq by the key
// kernel's atomics (else the separate dq kernel).
std::string backward_mma_problem(const DeviceCaps& dev, const BackwardParams& p, bool atomic_dq);
// Why the Hopper backward cannot take p on dev, or "" when it can (then *out is its launch;
// fused_dq: dq by the key kernel's reduce-adds where it can run, see plan_backward).
std::string backward_hopper_problem(const DeviceCaps& dev, const BackwardParams& p, bool fused_dq,
                                    HopperBwdLaunch* out);
// Queues the chosen kernels on `stream`; `delta` as launch_backward_simt's. Throws
// InvalidArgument with c.reason when c.path is None.
// `nonfinite`: one device int of scratch (the tensor-core paths' non-finite flag; unused by SIMT).
void launch_backward(const BackwardChoice& c, const BackwardParams& p, float* delta, int* nonfinite,
                     cudaStream_t stream);

}  // namespace ringattn::cuda

namespace ringattn {
// The CUDA backend with explicit flash options (make_cuda_backend(device, KernelChoices) makes them
// with flash_options).
std::unique_ptr<Backend> make_cuda_backend(int device, const cuda::FlashKernelOptions& options);
}  // namespace ringattn
