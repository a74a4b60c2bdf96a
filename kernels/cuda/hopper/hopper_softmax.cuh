// The consumer warpgroup's register math: online softmax on a 64 x N score tile held in wgmma
// accumulators, the P fragments for the next wgmma, and the epilogue that writes or folds the
// fp32 (o, lse) state.
//
// Accumulator layout of m64nNk16 (per warp: 16 rows): register i of a thread holds row
// g + 8 * ((i >> 1) & 1) and column 8 * (i >> 2) + 2 * t + (i & 1), where g = lane / 4 and
// t = lane % 4. Each row is spread over the 4 threads of a quad.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/exact_row.cuh"
#include "kernels/cuda/hopper/hopper_config.cuh"
#include "kernels/cuda/hopper/hopper_ptx.cuh"

namespace ringattn::cuda::hopper {

// Running statistics of this thread's two rows, in raw score units (max m) and exp2 units (sum
// l, a per-thread partial: every term of a row shares the quad's max, so the quad sum is taken
// once at the end).
struct RowStats {
  float m[2];
  float l[2];
};

// Sets invisible scores to -inf: keys at or past kv_len and keys the mask hides. row0 is this
// thread's first row (absolute; its second is row0 + 8), key0 its first key column (absolute).
// Each row's visible keys are one range [begin, end), found once; every score then costs two
// compares (begin is 0 without a window). One code path on purpose: a uniform branch between a
// one-compare and a two-compare copy made ptxas spill in the 192x128 and 128x176 kernels (56 and
// 92 bytes) and cost head dim 64 full ~3% (kernels/cuda/PERF.md, "Spills").
template <int NS>
__device__ __forceinline__ void mask_scores(float (&s)[NS], long long row0, int key0, int kv_len,
                                            const MaskSpec& mask) {
  const KeyRange r[2] = {visible_range(mask, row0, kv_len), visible_range(mask, row0 + 8, kv_len)};
  const int end[2] = {int(r[0].end), int(r[1].end)};
  const int begin[2] = {int(r[0].begin), int(r[1].begin)};
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int key = key0 + 8 * (i >> 2) + (i & 1), row = (i >> 1) & 1;
    if (key >= end[row] || key < begin[row]) s[i] = neg_inf();
  }
}

// One online-softmax step: folds the tile's scores into the stats, overwrites s with
// p = exp2(s * scale_log2 - m * scale_log2) and returns in corr the factor by which the output
// accumulated so far must be scaled. A row whose max is still -inf uses 0 as its base, so that
// no (-inf) - (-inf) is formed; its p and corr are then exactly 0.
//
// lazy: the max is only moved when some row of the warp grew by more than kLazyThreshold (8) in
// exp2 units. Otherwise the stale max stays the base: p <= 2^8, far inside fp32 and bf16/fp16 range, and l
// and o share that base, so o / l and m + ln(l) are unchanged; corr is 1 and the caller skips
// rescaling o. Returns whether the max moved (warp-uniform: the caller may branch on it).
template <int NS>
__device__ __forceinline__ bool softmax_step(float (&s)[NS], RowStats& st, float (&corr)[2], float scale_log2,
                                             bool lazy) {
  float mx[2] = {st.m[0], st.m[1]};
#pragma unroll
  for (int i = 0; i < NS; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
  mx[0] = quad_max(mx[0]);
  mx[1] = quad_max(mx[1]);
  bool update = true;
  if (lazy) {
    // (finite - (-inf)) is +inf: a row's first visible key always moves the max.
    const bool grow = (mx[0] - st.m[0]) * scale_log2 > kLazyThreshold || (mx[1] - st.m[1]) * scale_log2 > kLazyThreshold;
    update = __any_sync(0xffffffffu, grow);
  }
  float base[2], sum[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (update) {
      base[r] = exp_base(mx[r], scale_log2);
      corr[r] = fast_exp2(st.m[r] * scale_log2 - base[r]);
      st.m[r] = mx[r];
    } else {
      base[r] = exp_base(st.m[r], scale_log2);
      corr[r] = 1.f;
    }
  }
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int r = (i >> 1) & 1;
    s[i] = fast_exp2(fmaf(s[i], scale_log2, -base[r]));
    sum[r] += s[i];
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) st.l[r] = st.l[r] * corr[r] + sum[r];
  return update;
}

// P as the A operand of the P V wgmma: k-step kk (keys 16kk..16kk+15) takes accumulators
// 8kk..8kk+7, which are exactly the m16k16 A fragment (rows g, g+8; columns 2t, 2t+8).
template <typename T, int NS>
__device__ __forceinline__ void scores_to_p(const float (&s)[NS], uint32_t (&p)[NS / 2]) {
#pragma unroll
  for (int i = 0; i < NS / 2; ++i) p[i] = Half16<T>::pack(s[2 * i], s[2 * i + 1]);
}

template <int N>
__device__ __forceinline__ void rescale_rows(float (&o)[N], const float (&corr)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) o[i] *= corr[(i >> 1) & 1];
}

// Two adjacent output values (columns col, col + 1) of a row: into the fp32 state, or, when the
// call asked for the final output (p.out), cast to T straight into it (the state's o is then
// left unwritten; its lse is still written).
template <typename T>
__device__ __forceinline__ void put2(const HopperParams& p, float* orow, int b, int h, int row, int col, float2 v) {
  if (p.out != nullptr) {
    T* dst = static_cast<T*>(p.out) + b * p.out_stride_b + h * p.out_stride_h + (long long)row * p.out_stride_t + col;
    *reinterpret_cast<uint32_t*>(dst) = Half16<T>::pack(v.x, v.y);
  } else {
    *reinterpret_cast<float2*>(orow + col) = v;
  }
}

// Whether row r (0: row0, 1: row0 + 8) of this thread's quad needs the slow path: its accumulators
// (unnormalized) are not finite while its row sum l is, the same on the quad's four lanes. (A NaN
// l comes from a visible score only, masked scores being -inf: the fast result, NaN, is then the
// exact one. A non-finite value in V reaches o through P V even at a masked key, p = 0.)
template <int N>
__device__ __forceinline__ bool row_needs_redo(const float (&o)[N], int r, float l) {
  float z = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (((i >> 1) & 1) == r) z += o[i];
  const float zq = quad_sum(z);  // before any branch: the shuffle takes every lane of the warp
  return l == l && (not_finite(zq) || not_finite(l));
}

// Lists the warp's rows `rows` (bit r: row warp_row0 + r) for the redo kernel (fwd_hopper_redo.cuh).
__device__ __forceinline__ void list_redo_rows(const HopperParams& p, int b, int h, int warp_row0, unsigned rows) {
  if (threadIdx.x % 32 != 0) return;
  const int e = atomicAdd(p.redo, 1);
  if (e < p.redo_capacity) reinterpret_cast<int4*>(p.redo + 4)[e] = make_int4(b, h, warp_row0, int(rows));
}

// Writes (Write) or folds (Fold, the merge of kernels/cpu/merge.cpp merge_row) this thread's
// part of rows row0 and row0 + 8 of the tile. o holds D/2 accumulators (unnormalized).
template <typename T, int D>
__device__ __forceinline__ void store_state(const HopperParams& p, const float (&o)[D / 2], RowStats& st, int b, int h,
                                            int row0, int t) {
  const StateView& sv = p.state;
  float lse_new[2], inv[2], lse_old[2];
  bool in_range[2], redo[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(st.l[r]);
    in_range[r] = row0 + 8 * r >= 0 && row0 + 8 * r < p.q_len;  // a shifted first tile starts before row 0
    redo[r] = row_needs_redo(o, r, l) && in_range[r];  // every lane takes the quad's shuffles
    lse_new[r] = lse_from_stats(st.m[r] * p.scale, l);  // m is in raw score units
    inv[r] = l > 0.f ? 1.f / l : 0.f;
    lse_old[r] = 0.f;
    if (p.fold && in_range[r]) lse_old[r] = sv.lse[b * sv.lse_stride_b + h * sv.lse_stride_h + row0 + 8 * r];
  }
  const unsigned redo_rows = redo_mask(redo);
  if (redo_rows != 0u) list_redo_rows(p, b, h, row0 - (threadIdx.x % 32) / 4, redo_rows);
  // Every lane of the quad has read the old lse before lane 0 overwrites it.
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!in_range[r] || redo[r]) continue;  // a listed row's state stays as it was for the redo
    const int row = row0 + 8 * r;
    float* orow = sv.o + b * sv.o_stride_b + h * sv.o_stride_h + (long long)row * sv.o_stride_t;
    float* lse = sv.lse + b * sv.lse_stride_b + h * sv.lse_stride_h + row;
    float wa = 0.f, wb = inv[r], lse_out = lse_new[r];
    if (p.fold) {
      if (merge_weights(lse_old[r], lse_new[r], wa, wb, lse_out)) {
        wb *= inv[r];  // o is unnormalized
      } else {  // nothing seen: the state is unchanged
        if (p.out == nullptr) continue;
        wa = 1.f, wb = 0.f, lse_out = lse_old[r];  // the final output is the old state's, cast
      }
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = 8 * j + 2 * t;
      float2 v = make_float2(o[4 * j + 2 * r] * wb, o[4 * j + 2 * r + 1] * wb);
      if (wa != 0.f) {  // wa == 0 also when the old state was empty: its o is never read
        const float2 old = *reinterpret_cast<const float2*>(orow + col);
        v.x = fmaf(old.x, wa, v.x);
        v.y = fmaf(old.y, wa, v.y);
      }
      put2<T>(p, orow, b, h, row, col, v);
    }
    if (t == 0) *lse = lse_out;
  }
}

// Write without Fold into the final output, through shared memory: this consumer's 64 rows,
// normalized and cast, go into its staging buffer (sm.out, the 128-byte swizzled layout of the
// tensor map's 64 x 64 boxes), then one thread stores them with bulk tensor copies, which drop
// the rows past q_len and run while the consumer goes on to its next tile. The lse is
// stored from registers. The buffer is rewritten only after the previous tile's copies have read
// it (bulk_wait_read), so each consumer has one store in flight at most; the caller waits for it
// (bulk_wait) before the CTA exits.
template <typename T, typename C>
__device__ __forceinline__ void store_output_staged(const HopperParams& p, const SmemPlan<C>& sm,
                                                    const float (&o)[C::kHeadDim / 2], const RowStats& st, const Tile& t,
                                                    int consumer, int warp_in_wg, int g, int tq) {
  constexpr int D = C::kHeadDim;
  const bool issuer = threadIdx.x % kWarpgroupThreads == 0;
  const int bar = kOutBarBase + consumer, row0 = t.m0 + consumer * kRowsPerConsumer + warp_in_wg * 16 + g;
  const uint32_t buf = sm.out(consumer);
  if (issuer) bulk_wait_read<0>();
  named_sync(bar, kWarpgroupThreads);  // the previous tile's copies are done reading the buffer
  float inv[2];
  bool redo[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(st.l[r]);
    inv[r] = l > 0.f ? 1.f / l : 0.f;
    const int row = row0 + 8 * r;
    redo[r] = row_needs_redo(o, r, l) && row >= 0 && row < p.q_len;  // every lane takes the quad's shuffles
    if (tq == 0 && row >= 0 && row < p.q_len)
      p.state.lse[t.b * p.state.lse_stride_b + t.h * p.state.lse_stride_h + row] = lse_from_stats(st.m[r] * p.scale, l);
  }
  // Listed rows are stored here all the same (Write, no fold): the redo kernel, after this one,
  // overwrites them.
  const unsigned redo_rows = redo_mask(redo);
  if (redo_rows != 0u) list_redo_rows(p, t.b, t.h, row0 - g, redo_rows);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int rr = warp_in_wg * 16 + g + 8 * r;  // the row within the consumer's 64
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      // Columns 8j + 2tq, +1: column block j / 8, 16-byte chunk j % 8 of the row, swizzled by the row.
      const uint32_t at = buf + (j / 8) * (kRowsPerConsumer * kSwizzleRowBytes) + swizzled_chunk(rr, j % 8) + tq * 4;
      const uint32_t v = Half16<T>::pack(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(v) : "memory");
    }
  }
  fence_proxy_async_smem();
  named_sync(bar, kWarpgroupThreads);  // every row is in the buffer
  // The consumer's rows lie wholly before row 0 (a shifted first tile: the staged configurations
  // shift by whole consumers, Config::kStagedOut) or wholly past q_len, and then nothing is
  // stored, or they start inside [0, q_len). (A bulk tensor store whose box started at a negative
  // row stopped the kernel with an illegal instruction on the H200, 2026-12-02.)
  const int first_row = t.m0 + consumer * kRowsPerConsumer;
  if (issuer && first_row >= 0 && first_row < p.q_len) {
#pragma unroll
    for (int cb = 0; cb < D / 64; ++cb)
      tma_store_4d(&p.tm_out, buf + cb * (kRowsPerConsumer * kSwizzleRowBytes), cb * 64,
                   t.m0 + consumer * kRowsPerConsumer, t.h, t.b);
    bulk_commit();
  }
}

// A tile with no visible key: Write stores the empty state (o = 0, lse = -inf) in this thread's
// part of rows row0 and row0 + 8; Fold leaves the state unchanged (and, when the call asked for
// the final output, casts the old state's o into it).
template <typename T, int D>
__device__ __forceinline__ void store_empty(const HopperParams& p, int b, int h, int row0, int t) {
  if (p.fold && p.out == nullptr) return;
  const StateView& sv = p.state;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row < 0 || row >= p.q_len) continue;
    float* orow = sv.o + b * sv.o_stride_b + h * sv.o_stride_h + (long long)row * sv.o_stride_t;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = 8 * j + 2 * t;
      const float2 v = p.fold ? *reinterpret_cast<const float2*>(orow + col) : make_float2(0.f, 0.f);
      put2<T>(p, orow, b, h, row, col, v);
    }
    if (t == 0 && !p.fold) sv.lse[b * sv.lse_stride_b + h * sv.lse_stride_h + row] = neg_inf();
  }
}

}  // namespace ringattn::cuda::hopper
