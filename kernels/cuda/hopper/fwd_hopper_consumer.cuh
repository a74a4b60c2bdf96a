// The consumer warpgroups of the Hopper flash kernel: wgmma issue for Q K^T and P V, and the two
// loops over the CTA's tiles.
//
//   consume_per_tile (one Q buffer): each tile is a pipeline of its own: S_0 alone, then
//     {S_j, P V_{j-1}} pairs, then the last P V alone, then the epilogue.
//   consume_streamed (two Q buffers): the key tiles of all the CTA's query tiles form one stream;
//     the first S of the next tile is issued together with the last P V of the current one, and
//     the epilogue of a tile runs while the other warpgroups' wgmmas occupy the tensor cores.
//
// Both take one issue turn (named barriers, round robin over the consumers) per key tile plus
// one at the end of each pipeline, the same count in every consumer of the CTA.
#pragma once

#include "kernels/cuda/hopper/hopper_config.cuh"
#include "kernels/cuda/hopper/hopper_ptx.cuh"
#include "kernels/cuda/hopper/hopper_softmax.cuh"
#include "kernels/cuda/hopper/hopper_wgmma.cuh"

namespace ringattn::cuda::hopper {

// This thread's place in its consumer warpgroup.
struct Lane {
  int cw, warp_in_wg, lane, g, tq, my_bar, next_bar;
  __device__ __forceinline__ Lane(int consumer, int consumers) {
    cw = warp_uniform(consumer);
    warp_in_wg = (threadIdx.x / 32) % 4;
    lane = threadIdx.x % 32;
    g = lane / 4;
    tq = lane % 4;
    my_bar = 1 + cw;
    next_bar = 1 + (cw + 1) % consumers;
  }
  // This thread's first row of a tile starting at m0.
  __device__ __forceinline__ int row0(int m0) const { return m0 + cw * kRowsPerConsumer + warp_in_wg * 16 + g; }
};

template <typename T, typename C>
struct Issue {
  static constexpr int D = C::kHeadDim, N = C::kBlockN;
  static constexpr int kS = N / 2;  // score accumulators per thread (64 rows x N over 128 threads)
  static constexpr int kP = N / 4;  // packed P registers
  // A key block of which a consumer sees only the first 64 keys (the causal diagonal's upper rows)
  // takes 64-key products: half the work (consume_per_tile). Not with three consumers: at their
  // 160 registers the extra issue paths leave the wgmma pipeline short (C7511: serialized).
  static constexpr bool kHalfBlocks = N >= 128 && C::kConsumers == 2;
  // A key block of which a consumer sees nothing is skipped (consume_per_tile). Only with three
  // consumers, where it happens on every causal tile (a 192-row tile's diagonal covers 192 keys:
  // the upper 64 rows never see the first block visited); a 64-row consumer of a 128-row tile
  // sees part of it unless an offset or a tail intervenes, and the extra paths cost the 128x176c2
  // kernel its wgmma pipeline (C7511: serialized).
  static constexpr bool kSkipBlocks = C::kConsumers == 3;
  using W = Wgmma<T>;

  __device__ __forceinline__ static void qk_step(float (&s)[kS], uint64_t da, uint64_t db, int scale_d) {
    if constexpr (N == 128)
      W::ss_n128(s, da, db, scale_d);
    else if constexpr (N == 80)
      W::ss_n80(s, da, db, scale_d);
    else
      W::ss_n176(s, da, db, scale_d);
  }
  // S = Q_wg K^T over D/16 k-steps. Within a 128-byte swizzle row a k-step of 16 values is 32
  // bytes further; every 4 k-steps move to the next column block. (K-major: the leading offset
  // is unused.)
  // K64: only the block's first 64 keys, into S's first 32 accumulators (the m64n64 layout is the
  // first 64 columns of the wider one); the other 32 are left as they are, and the caller masks
  // them to -inf. A compile-time choice: a run-time branch inside the issue stage makes ptxas
  // serialize every wgmma of the kernel (C7515).
  // The k-steps' descriptors are the first one's advanced by compile-time offsets (desc_advance).
  template <bool K64 = false>
  __device__ __forceinline__ static void qk(float (&s)[kS], uint32_t q_base, uint32_t k_base) {
    const uint64_t da0 = smem_desc_sw128(q_base, 16, kSwizzleAtomBytes);
    const uint64_t db0 = smem_desc_sw128(k_base, 16, kSwizzleAtomBytes);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t cb = kk / kKStepsPerSwizzleRow, within = (kk % kKStepsPerSwizzleRow) * kKStepBytes;
      const uint64_t da = desc_advance(da0, cb * C::kQColBlockBytes + within);
      const uint64_t db = desc_advance(db0, cb * C::kKVColBlockBytes + within);
      if constexpr (K64 && kHalfBlocks)
        W::ss_n64(*reinterpret_cast<float(*)[32]>(&s[0]), da, db, kk > 0 ? 1 : 0);
      else
        qk_step(s, da, db, kk > 0 ? 1 : 0);
    }
  }
  // O += P V over N keys: each k-step is 16 keys = two 8-row groups = 2048 bytes down V; the
  // leading offset steps between the 64-wide column blocks of the head dim.
  // accumulate = false starts O over (the first key tile of a query tile in the streamed loop).
  // K64: only the first 64 keys (the others' P is 0: they were masked).
  template <bool K64 = false>
  __device__ __forceinline__ static void pv(float (&o)[D / 2], const uint32_t (&p)[kP], uint32_t v_base,
                                            bool accumulate = true) {
    constexpr int kSteps = (K64 && kHalfBlocks) ? 4 : N / 16;
    const uint64_t db0 = smem_desc_sw128(v_base, C::kKVColBlockBytes, kSwizzleAtomBytes);
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const uint64_t db = desc_advance(db0, kk * 2 * kSwizzleAtomBytes);
      const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
      const int scale_d = (kk > 0 || accumulate) ? 1 : 0;
      if constexpr (D == 64)
        W::rs_n64(o, a, db, scale_d);
      else if constexpr (D == 128)
        W::rs_n128(o, a, db, scale_d);
      else
        W::rs_n256(o, a, db, scale_d);
    }
  }

  // The issue turns. Each waits for this consumer's turn, issues its wgmmas, passes the turn on
  // and waits for what the caller reads next.
  // S = Q K^T alone (the first key tile of a pipeline): returns with S landed.
  template <bool K64 = false>
  __device__ __forceinline__ static void turn_qk(const Lane& ln, const SmemPlan<C>& sm, float (&s)[kS], uint32_t q_base,
                                                 int k_stage) {
    named_sync(ln.my_bar, kIssueTurnThreads);
    wgmma_fence();
    qk<K64>(s, q_base, sm.k(k_stage));
    wgmma_commit();
    named_arrive(ln.next_bar, kIssueTurnThreads);
    wgmma_wait<0>();
    fence_regs(s);
  }
  // S_j = Q K_j^T, then O += P_{j-1} V_{j-1}: returns with S landed while P V still runs (the
  // caller waits for it with wgmma_wait<0> after the softmax). PV64: the P V is of 64 keys.
  template <bool PV64 = false>
  __device__ __forceinline__ static void turn_qk_pv(const Lane& ln, const SmemPlan<C>& sm, float (&s)[kS],
                                                    uint32_t q_base, int k_stage, float (&o)[D / 2],
                                                    const uint32_t (&p)[kP], int v_stage, bool accumulate) {
    named_sync(ln.my_bar, kIssueTurnThreads);
    wgmma_fence();
    qk(s, q_base, sm.k(k_stage));
    wgmma_commit();
    pv<PV64>(o, p, sm.v(v_stage), accumulate);
    wgmma_commit();
    named_arrive(ln.next_bar, kIssueTurnThreads);
    wgmma_wait<1>();
    fence_regs(s);
  }
  // A turn with nothing to issue (a key block none of this consumer's rows sees): the turn is
  // still taken and passed on, so every consumer takes the same number.
  __device__ __forceinline__ static void turn_idle(const Lane& ln) {
    named_sync(ln.my_bar, kIssueTurnThreads);
    named_arrive(ln.next_bar, kIssueTurnThreads);
  }
  // O += P V alone (the end of a pipeline): returns with O landed.
  template <bool K64 = false>
  __device__ __forceinline__ static void turn_pv(const Lane& ln, const SmemPlan<C>& sm, float (&o)[D / 2],
                                                 const uint32_t (&p)[kP], int v_stage, bool accumulate) {
    named_sync(ln.my_bar, kIssueTurnThreads);
    wgmma_fence();
    pv<K64>(o, p, sm.v(v_stage), accumulate);
    wgmma_commit();
    named_arrive(ln.next_bar, kIssueTurnThreads);
    wgmma_wait<0>();
    fence_regs(o);
  }
};

template <typename T, typename C>
__device__ __forceinline__ void consume_per_tile(const HopperParams& p, const SmemPlan<C>& sm, int consumer) {
  using I = Issue<T, C>;
  constexpr int D = C::kHeadDim, S = C::kStages;
  const Lane ln(consumer, C::kConsumers);
  // This warpgroup's rows in each column block; taken from lane 0 so that the compiler keeps it
  // (and the Q descriptors made from it) in uniform registers. Both this and Lane's cw come from
  // lane 0: without either, ptxas serializes the wgmmas of a 128x176 kernel (C7511).
  const uint32_t q_base = warp_uniform(sm.q(0) + ln.cw * kRowsPerConsumer * kSwizzleRowBytes);
  const bool lazy = p.lazy_rescale != 0;
  int it = 0, q_it = 0;
  TileFeed<C> feed;
  for (int ti = feed.next(sm); ti < p.num_tiles; ti = feed.next(sm)) {
    const Tile t = decode_tile(p, ti);
    const int row0 = ln.row0(t.m0);
    if (t.n_blocks == 0) {
      store_empty<T, D>(p, t.b, t.h, row0, ln.tq);
      continue;
    }
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    RowStats st{{neg_inf(), neg_inf()}, {0.f, 0.f}};
    float s[I::kS];
    uint32_t pf[I::kP];
    float corr[2];
    // The key blocks run from the last one down (Tile::block), so only block 0 can end inside
    // its first 64 keys for this consumer's rows (the causal diagonal's upper rows, or the kv_len
    // tail): then its Q K^T and P V are 64-key products, half the work. The ends grow with the
    // row, so the consumer's last row decides. Broadcast from lane 0 so that ptxas sees a uniform
    // branch around the issue stages (a divergent one serializes the wgmmas, C7520).
    // The same end may lie at or before the block's start: then this consumer's rows see none of
    // block 0 (on a 192x128 causal tile every tile's upper 64 rows, and on half of them the
    // middle 64 too), and it skips that block's products and softmax, taking its turns idle.
    const int last_row = min(t.m0 + (ln.cw + 1) * kRowsPerConsumer - 1, p.q_len - 1);
    const long long last_end = visible_range(p.mask, last_row, p.kv_len).end;
    const long long block0 = (long long)t.block(0) * C::kBlockN;
    const bool skip = I::kSkipBlocks && __shfl_sync(0xffffffffu, int(last_end <= block0), 0) != 0;
    const bool half = I::kHalfBlocks && !skip && __shfl_sync(0xffffffffu, int(last_end <= block0 + 64), 0) != 0;
    mbar_wait(sm.q_full(0), q_it & 1);
    ++q_it;
    // First key tile: S alone.
    int s_cur = it % S;
    mbar_wait(sm.full_k(s_cur), (it / S) & 1);
    if (skip) {
      I::turn_idle(ln);
    } else if (half) {
      I::template turn_qk<true>(ln, sm, s, q_base, s_cur);
#pragma unroll
      for (int i = 32; i < I::kS; ++i) s[i] = neg_inf();  // keys 64 on: not computed, not visible
    } else
      I::turn_qk(ln, sm, s, q_base, s_cur);
    if (ln.lane == 0) mbar_arrive(sm.empty_k(s_cur));
    if (!skip) {
      const int nb = t.block(0);
      if (block_needs_mask<C>(p, t, nb)) mask_scores(s, row0, nb * C::kBlockN + 2 * ln.tq, p.kv_len, p.mask);
      softmax_step(s, st, corr, p.scale_log2, lazy);
      scores_to_p<T>(s, pf);
    }
    int s_prev = s_cur, it_prev = it;
    ++it;
    for (int i = 1; i < t.n_blocks; ++i, ++it) {
      const int nb = t.block(i);
      s_cur = it % S;
      mbar_wait(sm.full_k(s_cur), (it / S) & 1);
      mbar_wait(sm.full_v(s_prev), (it_prev / S) & 1);
      if (i == 1 && skip)  // block 0 was skipped: no P V of it (S lands, as in turn_qk_pv)
        I::turn_qk(ln, sm, s, q_base, s_cur);
      else if (i == 1 && half)
        I::template turn_qk_pv<true>(ln, sm, s, q_base, s_cur, o, pf, s_prev, true);
      else
        I::turn_qk_pv(ln, sm, s, q_base, s_cur, o, pf, s_prev, true);
      if (ln.lane == 0) mbar_arrive(sm.empty_k(s_cur));
      if (block_needs_mask<C>(p, t, nb)) mask_scores(s, row0, nb * C::kBlockN + 2 * ln.tq, p.kv_len, p.mask);
      const bool moved = softmax_step(s, st, corr, p.scale_log2, lazy);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pf);
      if (ln.lane == 0) mbar_arrive(sm.empty_v(s_prev));
      if (moved) rescale_rows(o, corr);
      scores_to_p<T>(s, pf);
      s_prev = s_cur;
      it_prev = it;
    }
    // Every S of this tile is done: the producer may load the next tile's Q.
    if (ln.lane == 0) mbar_arrive(sm.q_empty(0));
    mbar_wait(sm.full_v(s_prev), (it_prev / S) & 1);
    if (skip && t.n_blocks == 1)  // this consumer's rows see no key of the tile
      I::turn_idle(ln);
    else if (half && t.n_blocks == 1)
      I::template turn_pv<true>(ln, sm, o, pf, s_prev, true);
    else
      I::turn_pv(ln, sm, o, pf, s_prev, true);
    if (ln.lane == 0) mbar_arrive(sm.empty_v(s_prev));
    if constexpr (C::kStagedOut) {
      if (p.staged_out) {
        store_output_staged<T, C>(p, sm, o, st, t, ln.cw, ln.warp_in_wg, ln.g, ln.tq);
        continue;
      }
    }
    store_state<T, D>(p, o, st, t.b, t.h, row0, ln.tq);
  }
  if constexpr (C::kStagedOut) {
    if (p.staged_out && threadIdx.x % kWarpgroupThreads == 0) bulk_wait<0>();  // before the CTA's shared memory goes
  }
}

// Walks the CTA's (query tile, key tile) stream in order, writing the empty state of query
// tiles that see no key on the way. Once next has returned false it must not be called again.
template <typename C>
struct BlockCursor {
  int i;  // key-tile step within the current tile
  Tile t;
  TileFeed<C> feed;
  __device__ __forceinline__ BlockCursor() : i(0), t{}, feed{} { t.n_blocks = 0; }
  template <typename T, int D>
  __device__ __forceinline__ bool next(const HopperParams& p, const SmemPlan<C>& sm, const Lane& ln) {
    if (++i < t.n_blocks) return true;
    for (int ti = feed.next(sm); ti < p.num_tiles; ti = feed.next(sm)) {
      t = decode_tile(p, ti);
      i = 0;
      if (t.n_blocks > 0) return true;
      store_empty<T, D>(p, t.b, t.h, ln.row0(t.m0), ln.tq);
    }
    return false;
  }
  __device__ __forceinline__ int nb() const { return t.block(i); }
};

template <typename T, typename C>
__device__ __forceinline__ void consume_streamed(const HopperParams& p, const SmemPlan<C>& sm, int consumer) {
  using I = Issue<T, C>;
  constexpr int D = C::kHeadDim, S = C::kStages, QS = C::kQStages;
  const Lane ln(consumer, C::kConsumers);
  const bool lazy = p.lazy_rescale != 0;
  BlockCursor<C> cur;
  if (!cur.template next<T, D>(p, sm, ln)) return;
  float o[D / 2];
  float s[I::kS];
  uint32_t pf[I::kP];
  float corr[2];
  RowStats st{{neg_inf(), neg_inf()}, {0.f, 0.f}};
  int it = 0, q_it = 0;
  // Prologue: the first key tile of the first query tile, S alone.
  mbar_wait(sm.q_full(0), 0);
  uint32_t q_base = sm.q(0) + ln.cw * kRowsPerConsumer * kSwizzleRowBytes;
  mbar_wait(sm.full_k(0), 0);
  I::turn_qk(ln, sm, s, q_base, 0);
  if (ln.lane == 0) {
    mbar_arrive(sm.empty_k(0));
    if (cur.t.n_blocks == 1) mbar_arrive(sm.q_empty(0));
  }
  if (block_needs_mask<C>(p, cur.t, cur.nb()))
    mask_scores(s, ln.row0(cur.t.m0), cur.nb() * C::kBlockN + 2 * ln.tq, p.kv_len, p.mask);
  softmax_step(s, st, corr, p.scale_log2, lazy);
  scores_to_p<T>(s, pf);
  Tile prev = cur.t;       // the query tile of the pending P V
  bool prev_first = true;  // the pending P V is its tile's first (starts O over)
  int s_prev = 0, it_prev = 0;
  ++it;
  while (cur.template next<T, D>(p, sm, ln)) {
    const int s_cur = it % S;
    const bool first = cur.i == 0;
    if (first) {  // a new query tile: its Q is in the next buffer
      ++q_it;
      mbar_wait(sm.q_full(q_it % QS), (q_it / QS) & 1);
      q_base = sm.q(q_it % QS) + ln.cw * kRowsPerConsumer * kSwizzleRowBytes;
    }
    mbar_wait(sm.full_k(s_cur), (it / S) & 1);
    mbar_wait(sm.full_v(s_prev), (it_prev / S) & 1);
    I::turn_qk_pv(ln, sm, s, q_base, s_cur, o, pf, s_prev, !prev_first);
    if (ln.lane == 0) {
      mbar_arrive(sm.empty_k(s_cur));
      if (cur.i == cur.t.n_blocks - 1) mbar_arrive(sm.q_empty(q_it % QS));  // every S of this tile is done
    }
    if (block_needs_mask<C>(p, cur.t, cur.nb()))
      mask_scores(s, ln.row0(cur.t.m0), cur.nb() * C::kBlockN + 2 * ln.tq, p.kv_len, p.mask);
    // A new query tile starts fresh statistics; the previous tile's are kept for its epilogue,
    // which runs once its last P V has landed.
    RowStats done = st;
    if (first) st = RowStats{{neg_inf(), neg_inf()}, {0.f, 0.f}};
    const bool moved = softmax_step(s, st, corr, p.scale_log2, lazy);
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pf);
    if (ln.lane == 0) mbar_arrive(sm.empty_v(s_prev));
    if (first)
      store_state<T, D>(p, o, done, prev.b, prev.h, ln.row0(prev.m0), ln.tq);
    else if (moved)
      rescale_rows(o, corr);
    scores_to_p<T>(s, pf);
    prev_first = first;
    prev = cur.t;
    s_prev = s_cur;
    it_prev = it;
    ++it;
  }
  // Drain: the last P V and the last epilogue.
  mbar_wait(sm.full_v(s_prev), (it_prev / S) & 1);
  I::turn_pv(ln, sm, o, pf, s_prev, !prev_first);
  if (ln.lane == 0) mbar_arrive(sm.empty_v(s_prev));
  store_state<T, D>(p, o, st, prev.b, prev.h, ln.row0(prev.m0), ln.tq);
}

}  // namespace ringattn::cuda::hopper
