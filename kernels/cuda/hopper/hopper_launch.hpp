// Between the dispatch (flash_dispatch.cpp, hopper_plan.cpp: host compiler) and fwd_hopper.cu
// (nvcc: the kernel instantiations and their launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/params.hpp"
#include "kernels/cuda/hopper/bwd_hopper_params.hpp"
#include "kernels/cuda/hopper/fwd_hopper_params.hpp"

namespace ringattn::cuda {
// The name of tile configuration t (what RINGATTN_HOPPER_TILE takes).
const char* hopper_tile_name(HopperTile t);
}  // namespace ringattn::cuda

namespace ringattn::cuda::hopper_detail {

// What the caller's options say to the Hopper forward (the dispatch fills it from its
// FlashKernelOptions): a tile configuration by name ("" for the measured default) and whether the
// running max is rescaled lazily.
struct HopperOptions {
  std::string tile;
  bool lazy = true;
};

// True when the sm_90a kernel image is what runs on `device` (the current device).
bool image_loaded(int device);
// Dynamic shared memory that configuration `tile` takes at head dim d (0 when not instantiated).
int smem_bytes(HopperTile tile, int d);
// True when configuration `tile` at head dim d stages the final output in shared memory for bulk
// tensor stores (Config::kStagedOut: the per-tile loop, with room beside the stages).
bool stages_output(HopperTile tile, int d);
// How many clusters of a clustered configuration (c2) fit on the current device at once; 0 for
// the others, and where none fits.
int cluster_slots(HopperTile tile, int d);
// Queues l on `stream` (a grid of min(num_tiles, sms) persistent CTAs; a clustered configuration:
// as many clusters as fit, up to num_tiles / 2). l must come from plan.
void launch(const HopperLaunch& l, int sms, cudaStream_t stream);

// The tile configuration a call would run with: the measured default per head dim and row
// length, or opt.tile where that configuration exists for the head dim.
HopperTile pick_tile(const FlashParams& p, const HopperOptions& opt);
// Fills *out for p (tensor maps encoded) and returns nullptr, or returns why the kernel cannot
// take p (a phrase: "it needs ..."). Device independent except for smem_optin and l2_bytes (the
// sections of the tile order, hopper_tiles.hpp).
const char* plan(const FlashParams& p, const HopperOptions& opt, int smem_optin, int64_t l2_bytes,
                 HopperLaunch* out);

// The backward (bwd_hopper.cu): the larger dynamic shared memory of its two kernels at head dim d
// (0 when not instantiated); plan_backward fills *out for p (tensor maps encoded) and returns
// nullptr, or returns why the kernels cannot take p ("it needs ..."); fused_dq asks for dq by
// the key kernel's reduce-adds (taken outside deterministic mode when dq's view
// allows; out->params.fused_dq says). launch_backward queues the key kernel (dk, dv, and the
// fused dq) and the query kernel (dq otherwise) on `stream`, with delta from
// launch_backward_delta.
int backward_smem_bytes(int d);
const char* plan_backward(const BackwardParams& p, int smem_optin, bool fused_dq, HopperBwdLaunch* out);
// nonfinite: the call's flag (launch_nonfinite_scan and launch_backward_delta), or nullptr; both kernels return at once
// where it is 1.
void launch_backward(const HopperBwdLaunch& l, const float* delta, const int* nonfinite, cudaStream_t stream);

}  // namespace ringattn::cuda::hopper_detail
