// The sm_90a flash forward kernel: a persistent, warp-specialized CTA of 1 + NC warpgroups
// (Config in hopper_config.cuh: NC = 2 or 3 consumers, key tile N, ring depth STAGES).
//
//   warpgroup 0 (producer, setmaxnreg down): one thread walks the same tile schedule as the
//     consumers and issues bulk tensor copies: Q once per tile, then K and V tile by tile into a
//     STAGES-deep ring. full_* barriers count the bytes in; empty_* barriers count the consumer
//     warps out.
//   warpgroups 1..NC (consumers, setmaxnreg up): 64 query rows each. Per key tile j:
//       issue S_j = Q K_j^T (wgmma, both from shared memory)
//       issue O += P_{j-1} V_{j-1} (wgmma, P from registers)
//       wait for S_j; softmax of S_j while P V_{j-1} still runs (intra-warpgroup overlap)
//       wait for P V_{j-1}; rescale O; P_j := bf16(S_j)
//     and the consumers take turns issuing their wgmmas (named barriers 1..NC, round robin), so
//     that one warpgroup's softmax runs while the others' matrix products occupy the tensor cores.
//
// Key tiles are visited from the last to the first: the tiles that need the causal or length
// mask come first, every later tile runs the unmasked path.
#pragma once

#include "kernels/cuda/hopper/hopper_config.cuh"
#include "kernels/cuda/hopper/hopper_ptx.cuh"
#include "kernels/cuda/hopper/hopper_softmax.cuh"
#include "kernels/cuda/hopper/hopper_wgmma.cuh"

namespace ringattn::cuda::hopper {

template <typename T>
struct WgmmaFor;
template <>
struct WgmmaFor<__nv_bfloat16> {
  using type = WgmmaBf16;
};
template <>
struct WgmmaFor<__half> {
  using type = WgmmaF16;
};

template <typename T, typename C>
struct Consumer {
  static constexpr int D = C::kHeadDim, N = C::kBlockN;
  static constexpr int kS = N / 2;  // score accumulators per thread (64 rows x N over 128 threads)
  static constexpr int kP = N / 4;  // packed P registers
  using W = typename WgmmaFor<T>::type;

  __device__ __forceinline__ static void qk_step(float (&s)[kS], uint64_t da, uint64_t db, int scale_d) {
    if constexpr (N == 128)
      W::ss_n128(s, da, db, scale_d);
    else
      W::ss_n176(s, da, db, scale_d);
  }
  // S = Q_wg K^T over D/16 k-steps. Within a 128-byte swizzle row a k-step of 16 values is 32
  // bytes further; every 4 k-steps move to the next column block.
  __device__ __forceinline__ static void issue_qk(float (&s)[kS], uint32_t q_base, uint32_t k_base) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t cb = kk / 4, within = (kk % 4) * 32;
      const uint64_t da = smem_desc_sw128(q_base + cb * C::kBlockM * 128 + within, 16, 1024);
      const uint64_t db = smem_desc_sw128(k_base + cb * C::kBlockN * 128 + within, 16, 1024);
      qk_step(s, da, db, kk > 0 ? 1 : 0);
    }
  }
  // O += P V over N keys: each k-step is 16 keys = two 8-row groups = 2048 bytes down V; the
  // leading offset steps between the 64-wide column blocks of the head dim.
  __device__ __forceinline__ static void issue_pv(float (&o)[D / 2], const uint32_t (&p)[kP], uint32_t v_base) {
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      const uint64_t db = smem_desc_sw128(v_base + kk * 2048, C::kBlockN * 128, 1024);
      const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
      if constexpr (D == 64)
        W::rs_n64(o, a, db);
      else
        W::rs_n128(o, a, db);
    }
  }
};

template <typename T, typename C>
__global__ void __launch_bounds__(C::kThreads, 1) hopper_flash_kernel(const __grid_constant__ HopperParams p) {
#if RA_HOPPER_WGMMA
  constexpr int D = C::kHeadDim;
  using Co = Consumer<T, C>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sq = smem + C::kOffQ;
  auto sk = [&](int s) { return smem + C::kOffK + s * C::kKVBytes; };
  auto sv = [&](int s) { return smem + C::kOffV + s * C::kKVBytes; };
  const uint32_t bars = smem + C::kOffBar;
  constexpr int S = C::kStages;
  auto full_k = [&](int s) { return bars + 8 * s; };
  auto full_v = [&](int s) { return bars + 8 * (S + s); };
  auto empty_k = [&](int s) { return bars + 8 * (2 * S + s); };
  auto empty_v = [&](int s) { return bars + 8 * (3 * S + s); };
  const uint32_t q_full = bars + 8 * (4 * S), q_empty = bars + 8 * (4 * S + 1);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warp / 4;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), C::kConsumerWarps);
      mbar_init(empty_v(s), C::kConsumerWarps);
    }
    mbar_init(q_full, 1);
    mbar_init(q_empty, C::kConsumerWarps);
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer ----------------
    regs_decrease<C::kProducerRegs>();
    if (warp != 0 || lane != 0) return;
    tma_prefetch_desc(&p.tm_q);
    tma_prefetch_desc(&p.tm_k);
    tma_prefetch_desc(&p.tm_v);
    int it = 0, q_count = 0;
    for (int ti = blockIdx.x; ti < p.num_tiles; ti += gridDim.x) {
      const Tile t = decode_tile(p, ti);
      if (t.n_blocks == 0) continue;
      const int kvh = t.h / p.group;
      mbar_wait(q_empty, (q_count & 1) ^ 1);
      mbar_arrive_expect_tx(q_full, C::kQBytes);
      for (int cb = 0; cb < C::kColBlocks; ++cb)
        tma_load_4d(sq + cb * C::kBlockM * 128, &p.tm_q, q_full, cb * 64, t.m0, t.h, t.b);
      ++q_count;
      for (int i = 0; i < t.n_blocks; ++i, ++it) {
        const int nb = t.n_blocks - 1 - i, s = it % C::kStages;
        const uint32_t ph = (it / C::kStages) & 1;
        mbar_wait(empty_k(s), ph ^ 1);
        mbar_arrive_expect_tx(full_k(s), C::kKVBytes);
        for (int cb = 0; cb < C::kColBlocks; ++cb)
          tma_load_4d(sk(s) + cb * C::kBlockN * 128, &p.tm_k, full_k(s), cb * 64, nb * C::kBlockN, kvh, t.b);
        mbar_wait(empty_v(s), ph ^ 1);
        mbar_arrive_expect_tx(full_v(s), C::kKVBytes);
        for (int cb = 0; cb < C::kColBlocks; ++cb)
          tma_load_4d(sv(s) + cb * C::kBlockN * 128, &p.tm_v, full_v(s), cb * 64, nb * C::kBlockN, kvh, t.b);
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  regs_increase<C::kConsumerRegs>();
  const int cw = wg - 1;  // consumer index 0 .. NC-1
  const int warp_in_wg = warp % 4;
  const int g = lane / 4, tq = lane % 4;
  // Round robin of the issue phases: consumer c waits on barrier 1 + c, then passes the turn to
  // consumer c + 1. Consumer 0 goes first: the last consumer pre-arrives on its barrier.
  const int my_bar = 1 + cw, other_bar = 1 + (cw + 1) % C::kConsumers;
  if (cw == C::kConsumers - 1) named_arrive(1, 256);
  const uint32_t q_base = sq + cw * 64 * 128;  // this warpgroup's 64 rows in each column block

  int it = 0, q_count = 0;
  for (int ti = blockIdx.x; ti < p.num_tiles; ti += gridDim.x) {
    const Tile t = decode_tile(p, ti);
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    RowStats st{{neg_inf_f(), neg_inf_f()}, {0.f, 0.f}};
    const int row0 = t.m0 + cw * 64 + warp_in_wg * 16 + g;  // this thread's first row
    if (t.n_blocks > 0) {
      float s[Co::kS];
      uint32_t pf[Co::kP];
      float corr[2];
      mbar_wait(q_full, q_count & 1);
      ++q_count;
      // First key tile: S alone.
      int s_cur = it % C::kStages;
      mbar_wait(full_k(s_cur), (it / C::kStages) & 1);
      named_sync(my_bar, 256);
      wgmma_fence();
      Co::issue_qk(s, q_base, sk(s_cur));
      wgmma_commit();
      named_arrive(other_bar, 256);
      wgmma_wait<0>();
      fence_regs(s);
      if (lane == 0) mbar_arrive(empty_k(s_cur));
      {
        const int nb = t.n_blocks - 1;
        if (block_needs_mask(p, t, nb)) mask_scores(s, row0, nb * C::kBlockN + 2 * tq, p.kv_len, p.causal, p.q_offset);
        softmax_step(s, st, corr, p.scale_log2);
        scores_to_p<T>(s, pf);
      }
      int s_prev = s_cur, it_prev = it;
      ++it;
      for (int i = 1; i < t.n_blocks; ++i, ++it) {
        const int nb = t.n_blocks - 1 - i;
        s_cur = it % C::kStages;
        mbar_wait(full_k(s_cur), (it / C::kStages) & 1);
        mbar_wait(full_v(s_prev), (it_prev / C::kStages) & 1);
        named_sync(my_bar, 256);
        wgmma_fence();
        Co::issue_qk(s, q_base, sk(s_cur));
        wgmma_commit();
        Co::issue_pv(o, pf, sv(s_prev));
        wgmma_commit();
        named_arrive(other_bar, 256);
        wgmma_wait<1>();
        fence_regs(s);
        if (lane == 0) mbar_arrive(empty_k(s_cur));
        if (block_needs_mask(p, t, nb)) mask_scores(s, row0, nb * C::kBlockN + 2 * tq, p.kv_len, p.causal, p.q_offset);
        softmax_step(s, st, corr, p.scale_log2);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pf);
        if (lane == 0) mbar_arrive(empty_v(s_prev));
        rescale_rows(o, corr);
        scores_to_p<T>(s, pf);
        s_prev = s_cur;
        it_prev = it;
      }
      // Every S of this tile is done: the producer may load the next tile's Q.
      if (lane == 0) mbar_arrive(q_empty);
      mbar_wait(full_v(s_prev), (it_prev / C::kStages) & 1);
      named_sync(my_bar, 256);
      wgmma_fence();
      Co::issue_pv(o, pf, sv(s_prev));
      wgmma_commit();
      named_arrive(other_bar, 256);
      wgmma_wait<0>();
      fence_regs(o);
      if (lane == 0) mbar_arrive(empty_v(s_prev));
    }
    store_state<D>(p, o, st, t.b, t.h, row0, tq);
  }
  // The last consumer's final arrival on barrier 1 has no partner yet: consume it.
  if (cw == 0) named_sync(1, 256);
#else
  (void)p;
  __trap();
#endif
}

}  // namespace ringattn::cuda::hopper
