// The key kernel of the Hopper backward (dK, dV, and with fused_dq dQ): see bwd_hopper_common.cuh
// for the design.
#pragma once

#include "kernels/cuda/hopper/bwd_hopper_common.cuh"

namespace ringattn::cuda::hopper {

// ---------------- key kernel ----------------

template <typename C>
struct KeySmem {
  uint32_t base;
  __device__ __forceinline__ uint32_t k() const { return base + C::kKeyOffK; }
  __device__ __forceinline__ uint32_t v() const { return base + C::kKeyOffV; }
  __device__ __forceinline__ uint32_t q(int s) const { return base + C::kKeyOffQ + s * C::kTileBytes; }
  __device__ __forceinline__ uint32_t dout(int s) const { return base + C::kKeyOffDo + s * C::kTileBytes; }
  __device__ __forceinline__ uint32_t rows(int s) const { return base + C::kKeyOffRows + s * 2 * C::kTile * 4; }
  __device__ __forceinline__ uint32_t ds(int buf) const { return base + C::kKeyOffDs + buf * C::kDsBytes; }
  __device__ __forceinline__ uint32_t dq_part(int c, int buf) const {
    return base + C::kKeyOffDqPart + (2 * c + buf) * C::kDqPartBytes;
  }
  __device__ __forceinline__ uint32_t kv_full() const { return base + C::kKeyOffBar; }
  __device__ __forceinline__ uint32_t qd_full(int s) const { return base + C::kKeyOffBar + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t qd_empty(int s) const { return base + C::kKeyOffBar + 8 * (1 + C::kStages + s); }
};

// The work of one key-kernel CTA: keys [j0, j0 + keys) of (b, kv head hk), against the query
// tiles q_begin + 64 i (i < q_tiles) of each of the group's query heads: step s takes head
// hk * group + s / q_tiles, tile s % q_tiles.
struct KeyWork {
  int b, hk, j0, keys;
  int q_begin, q_tiles, steps;
  __device__ __forceinline__ int head(int s) const { return s / q_tiles; }  // within the group
  __device__ __forceinline__ int i0(int s) const { return q_begin + (s % q_tiles) * 64; }
};

template <typename C>
__device__ __forceinline__ KeyWork key_work(const HopperBwdParams& p) {
  KeyWork w;
  const int bh = p.batch * p.kv_heads;
  int kb = int(blockIdx.x) / bh;
  // Causal: the first key blocks see the most rows and go first; a lower edge alone makes the
  // last ones the heaviest.
  if (p.mask.windowed() && !p.mask.causal) kb = p.key_blocks - 1 - kb;
  w.b = (int(blockIdx.x) % bh) / p.kv_heads;
  w.hk = (int(blockIdx.x) % bh) % p.kv_heads;
  w.j0 = kb * C::kBlock;
  w.keys = min(C::kBlock, p.kv_len - w.j0);
  const KeyRange rows = visible_rows_of_keys(p.mask, w.j0, w.keys, p.q_len);
  w.q_begin = rows.empty() ? 0 : int(rows.begin);
  w.q_tiles = rows.empty() ? 0 : int((rows.end - rows.begin + C::kTile - 1) / C::kTile);
  w.steps = w.q_tiles * p.group;
  return w;
}

// The producer warp: K and V once, then per step the (Q, dout) tile by bulk copies (lane 0) and
// the tile's lse and D by plain loads (every lane).
template <typename C>
__device__ __forceinline__ void key_produce(const HopperBwdParams& p, const KeySmem<C>& sm, const KeyWork& w,
                                            int lane) {
  // A CTA with no step must not load: it would exit with its copies in flight.
  if (w.steps > 0 && lane == 0) {
    tma_prefetch_desc(&p.tm_q);
    tma_prefetch_desc(&p.tm_do);
    mbar_arrive_expect_tx(sm.kv_full(), 2 * C::kBlockBytes);
    for (int cb = 0; cb < C::kColBlocks; ++cb)
      for (int half = 0; half < C::kConsumers; ++half) {
        const uint32_t off = cb * C::kBlockColBytes + half * C::kTileColBytes;
        const int row = w.j0 + half * C::kTile;
        tma_load_4d(sm.k() + off, &p.tm_k, sm.kv_full(), cb * kSwizzleRowValues, row, w.hk, w.b);
        tma_load_4d(sm.v() + off, &p.tm_v, sm.kv_full(), cb * kSwizzleRowValues, row, w.hk, w.b);
      }
  }
  for (int s = 0; s < w.steps; ++s) {
    const int st = s % C::kStages, h = w.hk * p.group + w.head(s), i0 = w.i0(s);
    mbar_wait(sm.qd_empty(st), ((s / C::kStages) & 1) ^ 1);
    float* rows = reinterpret_cast<float*>(__cvta_shared_to_generic(sm.rows(st)));
    const float* lse_row = p.lse.row(w.b, h);
    const float* delta_row = p.delta + (int64_t(w.b) * p.q_heads + h) * p.q_len;
    for (int r = lane; r < C::kTile; r += 32) {
      const int i = i0 + r;
      rows[r] = lse_log2_of(lse_row, i, p.q_len);
      rows[C::kTile + r] = i < p.q_len ? delta_row[i] : 0.f;
    }
    // Every lane arrives after its own stores (the barrier counts the warp), lane 0 with the
    // bytes the copies will bring.
    if (lane != 0) {
      mbar_arrive(sm.qd_full(st));
    } else {
      mbar_arrive_expect_tx(sm.qd_full(st), 2 * C::kTileBytes);
      for (int cb = 0; cb < C::kColBlocks; ++cb) {
        tma_load_4d(sm.q(st) + cb * C::kTileColBytes, &p.tm_q, sm.qd_full(st), cb * kSwizzleRowValues, i0, h, w.b);
        tma_load_4d(sm.dout(st) + cb * C::kTileColBytes, &p.tm_do, sm.qd_full(st), cb * kSwizzleRowValues, i0, h,
                    w.b);
      }
    }
  }
}

// P^T of one tile, in place: s (S^T) becomes P^T. This thread's keys are rows g, g + 8; query
// column 8 n + 2 t + e of the tile is row i0 + that; key r sees query rows [vis_begin[r],
// vis_end[r]); lse: the tile's lse in log2 units.
__device__ __forceinline__ void key_probs(float (&s)[32], const float* lse, const int (&vis_begin)[2],
                                          const int (&vis_end)[2], int i0, int tq, float scale_log2) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const int c = 8 * n + 2 * tq;
    const float2 l = *reinterpret_cast<const float2*>(lse + c);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 4 * n + 2 * r + e, q = i0 + c + e;
        const float pr = fast_exp2(fmaf(s[i], scale_log2, -(e ? l.y : l.x)));
        s[i] = (q < vis_begin[r] || q >= vis_end[r]) ? 0.f : pr;
      }
  }
}

// dS^T = P^T (dP^T - D), in place in dp; delta: the tile's D.
__device__ __forceinline__ void key_grads(float (&dp)[32], const float (&pt)[32], const float* delta, int tq) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float2 d = *reinterpret_cast<const float2*>(delta + 8 * n + 2 * tq);
#pragma unroll
    for (int i = 4 * n; i < 4 * n + 4; ++i) dp[i] = pt[i] * (dp[i] - ((i & 1) ? d.y : d.x));
  }
}

// ---- the fused dq (HopperBwdParams::fused_dq) ----

// Stores this thread's dS^T (packed by scores_to_p: keys r0 + g (+8), queries 16 kk + 2 t (+8))
// into the block's dS^T tile: row = key of the block, 64 queries per 128-byte row, the 128-byte
// swizzle (16-byte chunk j of row r at chunk j ^ (r % 8)), so that wgmma reads it M-major.
__device__ __forceinline__ void store_ds(uint32_t tile, const uint32_t (&pds)[16], const BwdLane& ln) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    // pds[i]: accumulators 2i, 2i + 1 = row g + 8 ((2i >> 1) & 1), column 8 (2i >> 2) + 2 t.
    const int row = ln.r0 + ln.g + 8 * (i & 1), chunk = i >> 1;
    const uint32_t addr = tile + swizzled_chunk(row, chunk) + ln.tq * 4;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pds[i]) : "memory");
  }
}

// dQ part = dS K for this consumer's 64 columns of the head dim (column block c of K), over the
// block's 128 keys: A = the dS^T tile read M-major, B = K's column block read N-major.
template <typename T, typename C>
__device__ __forceinline__ void dq_part_product(float (&acc)[32], uint32_t ds_tile, uint32_t k_col_block) {
  const uint64_t da0 = smem_desc_sw128(ds_tile, C::kDsBytes, kSwizzleAtomBytes);
  const uint64_t db0 = smem_desc_sw128(k_col_block, C::kBlockColBytes, kSwizzleAtomBytes);
#pragma unroll
  for (int kk = 0; kk < C::kBlock / 16; ++kk) {
    const uint64_t da = desc_advance(da0, kk * 2 * kSwizzleAtomBytes);
    const uint64_t db = desc_advance(db0, kk * 2 * kSwizzleAtomBytes);
    Wgmma<T>::ss_tt_n64(acc, da, db, kk > 0 ? 1 : 0);
  }
}

// Stages scale * acc (64 query rows x 64 columns, the accumulator layout) in fp32 as two boxes
// of 64 rows x 32 columns with the 128-byte swizzle (16-byte chunk j of row r at chunk j ^ (r % 8))
// and adds it into dq by two bulk reduce-adds, issued by the consumer's first thread. The stores
// are conflict-free: a half-warp's 64-bit stores cover rows g = 4k..4k+3 and two chunks each, and
// with every thread storing the same column group n they would land on four chunk positions twice
// (2-way, ncu: 4 wavefronts for 2); threads of odd g store group n ^ 2 in that turn instead (its
// values selected from registers), which puts the 16 stores on 8 distinct chunks. `named` is the consumer's own barrier. The buffer is one of two: the reduce-adds
// of two steps ago, which read it, must be done reading (the last step's may still run).
template <typename C>
__device__ __forceinline__ void dq_part_reduce(const HopperBwdParams& p, const float (&acc)[32], uint32_t part,
                                               const BwdLane& ln, int named, int col0, int i0, int h, int b) {
  constexpr int kBoxBytes = C::kTile * kSwizzleRowBytes;  // 64 rows x 32 fp32
  const bool leader = threadIdx.x % kWarpgroupThreads == 0;
  if (leader) bulk_wait_read<1>();
  named_sync(named, kWarpgroupThreads);
  const bool odd = (ln.g & 1) != 0;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // This thread's group this turn: m = n, or n ^ 2 for odd g (the same box: bit 2 is kept).
      // Columns 8 m + 2 t (+1): box m / 4, 16-byte chunk 2 (m % 4) + t / 2, bytes 8 (t % 2).
      const int m_lo = (n & 3) ^ (odd ? 2 : 0);
      const int row = ln.r0 - ln.cw * C::kTile + ln.g + 8 * r, chunk = 2 * m_lo + (ln.tq >> 1);
      const uint32_t addr = part + (n >> 2) * kBoxBytes + swizzled_chunk(row, chunk) + (ln.tq & 1) * 8;
      const int i = 4 * n + 2 * r, j = 4 * (n ^ 2) + 2 * r;
      const float x0 = odd ? acc[j] : acc[i], x1 = odd ? acc[j + 1] : acc[i + 1];
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x0 * p.scale), "f"(x1 * p.scale)
                   : "memory");
    }
  fence_proxy_async_smem();
  named_sync(named, kWarpgroupThreads);
  if (leader) {
    tma_reduce_add_4d(&p.tm_dq, part, col0, i0, h, b);
    tma_reduce_add_4d(&p.tm_dq, part + kBoxBytes, col0 + 32, i0, h, b);
    bulk_commit();
  }
}

template <typename T, typename C, bool kFusedDq>
__device__ __forceinline__ void key_consume(const HopperBwdParams& p, const KeySmem<C>& sm, const KeyWork& w,
                                            int consumer) {
  constexpr int D = C::kHeadDim;
  using I = BwdIssue<T, D>;
  const BwdLane ln(consumer);
  int vis_begin[2], vis_end[2];  // 32-bit: the key kernel is at the register limit
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = w.j0 + ln.r0 + ln.g + 8 * r;
    const KeyRange rows = j < p.kv_len ? visible_rows(p.mask, j, p.q_len) : KeyRange{0, 0};
    vis_begin[r] = int(rows.begin);
    vis_end[r] = int(rows.end);
  }
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint32_t k_base = warp_uniform(sm.k() + ln.cw * C::kTileColBytes);
  const uint32_t v_base = warp_uniform(sm.v() + ln.cw * C::kTileColBytes);
  // The fused dq: at head dim 128 each consumer forms its 64 columns of dQ every step (B = its
  // column block of K); at 64 the consumers take turns, consumer s % 2 forming all 64 (B = the
  // only column block), so one's product runs on the tensor pipe while the other goes on to the
  // next tile's softmax; a consumer's staging buffers alternate over its own turns.
  constexpr bool kTakeTurns = D == 64;
  const uint32_t k_col_block = warp_uniform(sm.k() + (kTakeTurns ? 0 : ln.cw * C::kBlockColBytes));
  if (w.steps > 0) mbar_wait(sm.kv_full(), 0);
  float sc[32], dp[32];  // outside the loop, as the forward's S: no copies between the wgmmas
  for (int s = 0; s < w.steps; ++s) {
    const int st = s % C::kStages;
    mbar_wait(sm.qd_full(st), (s / C::kStages) & 1);
    // S^T and dP^T as two groups: P^T is formed while dP^T still runs. (Issuing dV += P^T dout
    // before dS^T is formed keeps P^T in both forms live beside dK, dV: ptxas spills.)
    wgmma_fence();
    I::abt(sc, k_base, C::kBlockColBytes, sm.q(st), C::kTileColBytes);
    wgmma_commit();
    I::abt(dp, v_base, C::kBlockColBytes, sm.dout(st), C::kTileColBytes);
    wgmma_commit();
    const float* rows = reinterpret_cast<const float*>(__cvta_shared_to_generic(sm.rows(st)));
    wgmma_wait<1>();
    fence_regs(sc);
    key_probs(sc, rows, vis_begin, vis_end, w.i0(s), ln.tq, p.scale_log2);
    wgmma_wait<0>();
    fence_regs(dp);
    key_grads(dp, sc, rows + C::kTile, ln.tq);
    uint32_t pp[16], pds[16];
    scores_to_p<T>(sc, pp);
    scores_to_p<T>(dp, pds);
    if constexpr (kFusedDq) {
      store_ds(sm.ds(s & 1), pds, ln);
      fence_proxy_async_smem();
    }
    wgmma_fence();
    I::xb(dv, pp, sm.dout(st), C::kTileColBytes);
    I::xb(dk, pds, sm.q(st), C::kTileColBytes);
    wgmma_commit();
    if constexpr (kFusedDq) {
      // Both consumers' halves of dS^T are stored (the tile is double-buffered: a consumer a
      // step ahead writes the other buffer, and cannot be two ahead past this barrier).
      named_sync(1, kWarpgroupThreads * C::kConsumers);
      if (!kTakeTurns || (s & 1) == ln.cw) {
        const int turn = kTakeTurns ? s >> 1 : s;
        float dqa[32];
        wgmma_fence();
        dq_part_product<T, C>(dqa, sm.ds(s & 1), k_col_block);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dqa);
        dq_part_reduce<C>(p, dqa, sm.dq_part(ln.cw, turn & 1), ln, 2 + ln.cw, kTakeTurns ? 0 : ln.cw * C::kTile,
                          w.i0(s), w.hk * p.group + w.head(s), w.b);
      } else {
        wgmma_wait<0>();
      }
    } else {
      wgmma_wait<0>();
    }
    fence_regs(dv);
    fence_regs(dk);
    fence_regs(pp);
    fence_regs(pds);
    mbar_arrive(sm.qd_empty(st));  // every consumer thread: each has read the tile's lse and D
  }
  auto key_row = [&](const TensorView& gv) {
    return [&gv, &w, &ln, &p](int r) -> float* {
      const int j = w.j0 + ln.r0 + r;
      return j < p.kv_len ? grad_row(gv, w.b, w.hk, j) : nullptr;
    };
  };
  store_grad_acc<D>(dk, p.scale, p.accumulate != 0, ln, key_row(p.dk));
  store_grad_acc<D>(dv, 1.f, p.accumulate != 0, ln, key_row(p.dv));
  // The last reduce-adds must have read their shared memory before the CTA exits.
  if (kFusedDq && threadIdx.x % kWarpgroupThreads == 0) bulk_wait<0>();
}

template <typename T, typename C, bool kFusedDq>
__global__ void __launch_bounds__(C::kThreads, 1) hopper_bwd_keys_kernel(const __grid_constant__ HopperBwdParams p) {
#if RA_HOPPER_WGMMA
  if (gate_shut(BackwardGate{p.nonfinite, 0})) return;  // the exact SIMT backward takes the call
  extern __shared__ uint8_t smem_raw[];
  const KeySmem<C> sm{(smem_addr(smem_raw) + uint32_t(kSwizzleAtomBytes - 1)) & ~uint32_t(kSwizzleAtomBytes - 1)};
  const int warp = threadIdx.x / 32, wg = warp / 4;
  if (threadIdx.x == 0) {
    mbar_init(sm.kv_full(), 1);
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(sm.qd_full(s), 32);                                 // the producer warp's lanes
      mbar_init(sm.qd_empty(s), kWarpgroupThreads * C::kConsumers);  // every consumer thread
    }
    mbar_fence_init();
  }
  __syncthreads();
  const KeyWork w = key_work<C>(p);
  if (wg == 0) {
    regs_decrease<C::kProducerRegs>();
    if (warp == 0) key_produce<C>(p, sm, w, threadIdx.x % 32);
    return;
  }
  regs_increase<C::kConsumerRegs>();
  key_consume<T, C, kFusedDq>(p, sm, w, wg - 1);
#else
  (void)p;
  __trap();
#endif
}

}  // namespace ringattn::cuda::hopper
