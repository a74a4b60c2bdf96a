// The end of a warp's key loop, shared by the flash and decode kernels: the quad-wide row sums,
// the normalization of the fp32 accumulator, the natural-log LSE, and the write or fold of
// 16 rows into (o, lse) state rows.
#pragma once

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/exact_row.cuh"

namespace ringattn::cuda {

struct RowPtr {
  float* o = nullptr;  // nullptr: the row does not exist (past the end); nothing is written
  float* lse = nullptr;
};

// acc[n][0..1] hold columns n*8 + 2*(lane%4) + {0,1} of row lane/4, acc[n][2..3] those of
// row lane/4 + 8 (the m16n8 accumulator layout). m is the running max in log2 units of the
// scaled scores and l the thread's partial sum of 2^(x - m). row_at(r) maps the warp's row
// r in [0, 16) to its state row. Write: rows that saw no key get the empty state (o = 0,
// lse = -inf). Fold: state := merge(state, this result), rows that saw no key stay unchanged.
// A row whose result is not finite is not stored: redo(r) recomputes it exactly (ExactRow,
// exact_row.cuh) and stores it, called by the whole warp.
template <int kDT, typename RowAt, typename Redo>
__device__ __forceinline__ void finish_rows(StateMode mode, int lane, const float (&acc)[kDT][4], const float (&m)[2],
                                            const float (&l)[2], RowAt row_at, Redo redo) {
  float inv[2], lse_new[2], lse_old[2] = {0.f, 0.f};
  RowPtr rp[2];
  bool bad[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float sum = quad_sum(l[half]);
    bad[half] = quad_row_not_finite(acc, half, sum);
    inv[half] = sum > 0.f ? 1.f / sum : 0.f;
    lse_new[half] = lse_from_stats_log2(m[half], sum);
    rp[half] = row_at((lane >> 2) + half * 8);
    if (mode == StateMode::Fold && rp[half].o != nullptr) lse_old[half] = *rp[half].lse;
  }
  const unsigned redo_rows = redo_mask(bad);
  if (redo_rows != 0u) {
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (bad[half]) rp[half].o = nullptr;
  }
  // The four lanes of a quad read the row's old lse before lane 0 of the quad overwrites it.
  __syncwarp();
  const int col = (lane & 3) * 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float* o = rp[half].o;
    if (o == nullptr) continue;
    if (mode == StateMode::Write) {
#pragma unroll
      for (int n = 0; n < kDT; ++n) {
        o[n * 8 + col] = acc[n][half * 2] * inv[half];
        o[n * 8 + col + 1] = acc[n][half * 2 + 1] * inv[half];
      }
      if ((lane & 3) == 0) *rp[half].lse = lse_new[half];
      continue;
    }
    float wa, wb, merged;
    if (!merge_weights(lse_old[half], lse_new[half], wa, wb, merged)) continue;
    wb *= inv[half];
    const bool old_empty = lse_old[half] == neg_inf();  // its o is not read: 0 * NaN is NaN
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float mine = acc[n][half * 2 + e] * wb;
        o[n * 8 + col + e] = old_empty ? mine : o[n * 8 + col + e] * wa + mine;
      }
    }
    if ((lane & 3) == 0) *rp[half].lse = merged;
  }
  for (unsigned rows = redo_rows; rows != 0u; rows &= rows - 1u) redo(__ffs(rows) - 1);
}

}  // namespace ringattn::cuda
