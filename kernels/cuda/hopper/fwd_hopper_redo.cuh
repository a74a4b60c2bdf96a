// The Hopper forward's slow rows. A key the mask hides still enters its tile's P V with p = 0,
// and 0 times a NaN or inf value is NaN: a non-finite value in V would reach rows that cannot see
// it. The consumers list the rows whose result is not finite while their row sum is
// (row_needs_redo, list_redo_rows: hopper_softmax.cuh; in Fold they leave those rows' state as it
// was), and this kernel, launched after each Hopper forward on the same stream, recomputes them
// exactly over their visible keys (redo_row, kernels/cuda/exact_row.cuh) and writes or folds them.
// With nothing listed (finite inputs) every CTA reads one count and returns.
#pragma once

#include "kernels/cuda/exact_row.cuh"
#include "kernels/cuda/hopper/fwd_hopper_params.hpp"

namespace ringattn::cuda::hopper {

inline constexpr int kRedoThreads = 256;

// Row `row` of head h in batch b, recomputed and written or folded as store_state would have.
template <typename T, int D>
__device__ __forceinline__ void redo_state_row(const HopperParams& p, int b, int h, int row) {
  const StateView& sv = p.state;
  const int hk = h / p.group;
  T* out = p.out == nullptr ? nullptr
                            : static_cast<T*>(p.out) + b * p.out_stride_b + h * p.out_stride_h + (long long)row * p.out_stride_t;
  redo_row<T, D / 32, T>(static_cast<const T*>(p.q.data) + view_offset(p.q, b, h, row),
                         static_cast<const T*>(p.k.data) + view_offset(p.k, b, hk, 0), p.k.stride_t,
                         static_cast<const T*>(p.v.data) + view_offset(p.v, b, hk, 0), p.v.stride_t, D, p.scale,
                         visible_range(p.mask, row, p.kv_len), p.fold != 0,
                         sv.o + b * sv.o_stride_b + h * sv.o_stride_h + (long long)row * sv.o_stride_t,
                         sv.lse + b * sv.lse_stride_b + h * sv.lse_stride_h + row, out);
}

// One warp per listed entry (16 rows of one warp's tile), grid-stride; the last CTA to finish
// resets the list for the stream's next call.
template <typename T, int D>
__global__ void __launch_bounds__(kRedoThreads) hopper_redo_kernel(const __grid_constant__ HopperParams p) {
  pdl_wait_for_prior_grid();  // launched programmatically: the forward's list and state are complete
  const int listed = *static_cast<volatile int*>(p.redo);
  if (listed == 0) return;
  const int n = listed < p.redo_capacity ? listed : p.redo_capacity;  // the capacity holds every warp's tile
  const int warps = kRedoThreads / 32, warp = threadIdx.x / 32;
  for (int e = blockIdx.x * warps + warp; e < n; e += gridDim.x * warps) {
    const int4 en = reinterpret_cast<const int4*>(p.redo + 4)[e];
    for (unsigned rows = unsigned(en.w); rows != 0u; rows &= rows - 1u) {
      const int row = en.z + __ffs(rows) - 1;
      if (row >= 0 && row < p.q_len) redo_state_row<T, D>(p, en.x, en.y, row);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(p.redo + 1, 1) == int(gridDim.x) - 1) {
    atomicExch(p.redo, 0);
    atomicExch(p.redo + 1, 0);
  }
}

}  // namespace ringattn::cuda::hopper
