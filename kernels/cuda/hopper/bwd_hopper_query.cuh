// The query kernel of the Hopper backward (dQ in a fixed order): see bwd_hopper_common.cuh for
// the design.
#pragma once

#include "kernels/cuda/hopper/bwd_hopper_common.cuh"

namespace ringattn::cuda::hopper {

// ---------------- query kernel ----------------

template <typename C>
struct DqSmem {
  uint32_t base;
  __device__ __forceinline__ uint32_t q() const { return base + C::kDqOffQ; }
  __device__ __forceinline__ uint32_t dout() const { return base + C::kDqOffDo; }
  __device__ __forceinline__ uint32_t k(int s) const { return base + C::kDqOffK + s * C::kTileBytes; }
  __device__ __forceinline__ uint32_t v(int s) const { return base + C::kDqOffV + s * C::kTileBytes; }
  __device__ __forceinline__ uint32_t qo_full() const { return base + C::kDqOffBar; }
  __device__ __forceinline__ uint32_t kv_full(int s) const { return base + C::kDqOffBar + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t kv_empty(int s) const { return base + C::kDqOffBar + 8 * (1 + C::kStages + s); }
};

// The work of one query-kernel CTA: rows [m0, m0 + rows) of (b, query head h), against the key
// tiles n_begin .. n_begin + steps - 1 (64 keys each), in key order. Keys [full_begin, full_end)
// are visible to every row of the block (as the forward's decode_tile).
struct DqWork {
  int b, h, m0, rows;
  int n_begin, steps;
  int full_begin, full_end;
};

template <typename C>
__device__ __forceinline__ DqWork dq_work(const HopperBwdParams& p) {
  DqWork w;
  const int bh = p.batch * p.q_heads;
  int mb = int(blockIdx.x) / bh;
  // As the forward: causal makes the last query blocks the heaviest.
  if (p.mask.causal) mb = p.q_blocks - 1 - mb;
  w.b = (int(blockIdx.x) % bh) / p.q_heads;
  w.h = (int(blockIdx.x) % bh) % p.q_heads;
  w.m0 = mb * C::kBlock;
  w.rows = min(C::kBlock, p.q_len - w.m0);
  const KeyRange keys = visible_range_of_rows(p.mask, w.m0, w.rows, p.kv_len);
  w.n_begin = keys.empty() ? 0 : int(keys.begin / C::kTile);
  w.steps = keys.empty() ? 0 : int((keys.end + C::kTile - 1) / C::kTile) - w.n_begin;
  w.full_begin = int(visible_range(p.mask, w.m0 + w.rows - 1, p.kv_len).begin);
  w.full_end = int(visible_range(p.mask, w.m0, p.kv_len).end);
  return w;
}

template <typename C>
__device__ __forceinline__ void dq_produce(const HopperBwdParams& p, const DqSmem<C>& sm, const DqWork& w) {
  if (w.steps == 0) return;
  const int hk = w.h / p.group;
  tma_prefetch_desc(&p.tm_k);
  tma_prefetch_desc(&p.tm_v);
  mbar_arrive_expect_tx(sm.qo_full(), 2 * C::kBlockBytes);
  for (int cb = 0; cb < C::kColBlocks; ++cb)
    for (int half = 0; half < C::kConsumers; ++half) {
      const uint32_t off = cb * C::kBlockColBytes + half * C::kTileColBytes;
      const int row = w.m0 + half * C::kTile;
      tma_load_4d(sm.q() + off, &p.tm_q, sm.qo_full(), cb * kSwizzleRowValues, row, w.h, w.b);
      tma_load_4d(sm.dout() + off, &p.tm_do, sm.qo_full(), cb * kSwizzleRowValues, row, w.h, w.b);
    }
  for (int s = 0; s < w.steps; ++s) {
    const int st = s % C::kStages, j0 = (w.n_begin + s) * C::kTile;
    mbar_wait(sm.kv_empty(st), ((s / C::kStages) & 1) ^ 1);
    mbar_arrive_expect_tx(sm.kv_full(st), 2 * C::kTileBytes);
    for (int cb = 0; cb < C::kColBlocks; ++cb) {
      tma_load_4d(sm.k(st) + cb * C::kTileColBytes, &p.tm_k, sm.kv_full(st), cb * kSwizzleRowValues, j0, hk, w.b);
      tma_load_4d(sm.v(st) + cb * C::kTileColBytes, &p.tm_v, sm.kv_full(st), cb * kSwizzleRowValues, j0, hk, w.b);
    }
  }
}

template <typename T, typename C>
__device__ __forceinline__ void dq_consume(const HopperBwdParams& p, const DqSmem<C>& sm, const DqWork& w,
                                           int consumer) {
  constexpr int D = C::kHeadDim;
  using I = BwdIssue<T, D>;
  const BwdLane ln(consumer);
  const int row0 = w.m0 + ln.r0 + ln.g;  // this thread's rows: row0, row0 + 8
  float lse2[2], del[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + 8 * r;
    lse2[r] = lse_log2_of(p.lse.row(w.b, w.h), i, p.q_len);
    del[r] = i < p.q_len ? p.delta[(int64_t(w.b) * p.q_heads + w.h) * p.q_len + i] : 0.f;
  }
  // dq starts with the first product (scale_d = 0), not with zeros: a non-wgmma definition of an
  // accumulator that is in flight around the loop makes ptxas serialize the wgmmas.
  float dq[D / 2];
  const uint32_t q_base = warp_uniform(sm.q() + ln.cw * C::kTileColBytes);
  const uint32_t o_base = warp_uniform(sm.dout() + ln.cw * C::kTileColBytes);
  if (w.steps > 0) mbar_wait(sm.qo_full(), 0);
  // dQ += dS K of tile s stays in flight while tile s + 1's S and dP are issued; its K/V stage is
  // released once it has landed (with the next S).
  uint32_t pds[16];
  float sc[32], dp[32];
  int pending = -1;  // the stage of the dQ product in flight
  for (int s = 0; s < w.steps; ++s) {
    const int st = s % C::kStages, nb = w.n_begin + s;
    mbar_wait(sm.kv_full(st), (s / C::kStages) & 1);
    wgmma_fence();
    I::abt(sc, q_base, C::kBlockColBytes, sm.k(st), C::kTileColBytes);
    wgmma_commit();
    I::abt(dp, o_base, C::kBlockColBytes, sm.v(st), C::kTileColBytes);
    wgmma_commit();
    wgmma_wait<1>();  // the previous dQ product and S
    fence_regs(sc);
    if (pending >= 0) {
      fence_regs(dq);
      fence_regs(pds);
      if (ln.lane == 0) mbar_arrive(sm.kv_empty(pending));
    }
    // P and dS go to registers of their own: sc and dp stay defined by wgmma alone, or ptxas
    // serializes the wgmmas around the dQ product in flight.
    float pr[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) pr[i] = sc[i];
    if (nb * C::kTile < w.full_begin || (nb + 1) * C::kTile > w.full_end)
      mask_scores(pr, row0, nb * C::kTile + 2 * ln.tq, p.kv_len, p.mask);
#pragma unroll
    for (int i = 0; i < 32; ++i) pr[i] = fast_exp2(fmaf(pr[i], p.scale_log2, -lse2[(i >> 1) & 1]));
    wgmma_wait<0>();
    fence_regs(dp);
#pragma unroll
    for (int i = 0; i < 32; ++i) pr[i] *= dp[i] - del[(i >> 1) & 1];
    scores_to_p<T>(pr, pds);
    wgmma_fence();
    I::xb(dq, pds, sm.k(st), C::kTileColBytes, s > 0);
    wgmma_commit();
    pending = st;
  }
  wgmma_wait<0>();
  fence_regs(dq);
  fence_regs(pds);
  if (w.steps == 0) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dq[i] = 0.f;
  }
  store_grad_acc<D>(dq, p.scale, p.accumulate != 0, ln, [&](int r) -> float* {
    const int i = w.m0 + ln.r0 + r;
    return i < p.q_len ? grad_row(p.dq, w.b, w.h, i) : nullptr;
  });
}

template <typename T, typename C>
__global__ void __launch_bounds__(C::kThreads, 1) hopper_bwd_dq_kernel(const __grid_constant__ HopperBwdParams p) {
#if RA_HOPPER_WGMMA
  if (gate_shut(BackwardGate{p.nonfinite, 0})) return;  // the exact SIMT backward takes the call
  extern __shared__ uint8_t smem_raw[];
  const DqSmem<C> sm{(smem_addr(smem_raw) + uint32_t(kSwizzleAtomBytes - 1)) & ~uint32_t(kSwizzleAtomBytes - 1)};
  const int warp = threadIdx.x / 32, wg = warp / 4;
  if (threadIdx.x == 0) {
    mbar_init(sm.qo_full(), 1);
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(sm.kv_full(s), 1);
      mbar_init(sm.kv_empty(s), C::kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();
  const DqWork w = dq_work<C>(p);
  if (wg == 0) {
    regs_decrease<C::kProducerRegs>();
    if (threadIdx.x == 0) dq_produce<C>(p, sm, w);
    return;
  }
  regs_increase<C::kConsumerRegs>();
  dq_consume<T, C>(p, sm, w, wg - 1);
#else
  (void)p;
  __trap();
#endif
}

}  // namespace ringattn::cuda::hopper
