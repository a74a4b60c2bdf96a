// The sm_90a flash forward kernel: a persistent, warp-specialized CTA of 1 + NC warpgroups
// (Config in hopper_config.cuh: NC = 2 or 3 consumers, key tile N, ring depth STAGES).
//
//   warpgroup 0 (producer, setmaxnreg down): one thread takes the CTA's tiles from the dynamic
//     schedule (TileFeed, hopper_config.cuh), hands their indices to the consumers, and issues
//     bulk tensor copies: Q once per tile, then K and V tile by tile into a STAGES-deep ring.
//     full_* barriers count the bytes in; empty_* barriers count the consumer warps out.
//     In a cluster of two (Config CL = 2) each copy thread loads half of every K and V stage and
//     multicasts it into both CTAs, and the two copy threads agree on each stage's release
//     (wait_stage_free); rank 0's scheduling thread hands both CTAs their pair of tiles.
//   warpgroups 1..NC (consumers, setmaxnreg up): 64 query rows each. Per key tile j:
//       issue S_j = Q K_j^T (wgmma, both from shared memory)
//       issue O += P_{j-1} V_{j-1} (wgmma, P from registers)
//       wait for S_j; softmax of S_j while P V_{j-1} still runs (intra-warpgroup overlap)
//       wait for P V_{j-1}; rescale O (only when the running max moved: lazy rescaling,
//       hopper_softmax.cuh); P_j := bf16(S_j)
//     and the consumers take turns issuing their wgmmas (named barriers 1..NC, round robin), so
//     that one warpgroup's softmax runs while the others' matrix products occupy the tensor cores.
//
// Key tiles are visited from the last to the first (Tile::block): the tiles that need the causal
// or length mask come first, then the unmasked ones, and with a window the lowest tiles, on the
// window's lower edge, need the mask again; tiles below the window are never loaded. The consumer
// loops (per query tile, or streamed across query tiles with two Q buffers) are in
// fwd_hopper_consumer.cuh.
#pragma once

#include "kernels/cuda/hopper/hopper_config.cuh"
#include "kernels/cuda/hopper/fwd_hopper_consumer.cuh"
#include "kernels/cuda/hopper/hopper_ptx.cuh"

namespace ringattn::cuda::hopper {

// One K or V stage: C::kColBlocks boxes of the key block's rows into this CTA; in a cluster this
// CTA's part of the rows (kKVPartRows, from rank x that) into the same place in every CTA.
template <typename C>
__device__ __forceinline__ void load_kv_stage(uint32_t dst, const CUtensorMap* tm, uint32_t full_bar, int key0, int kvh,
                                              int b, uint32_t rank) {
  for (int cb = 0; cb < C::kColBlocks; ++cb) {
    if constexpr (C::kCluster == 1)
      tma_load_4d(dst + cb * C::kKVColBlockBytes, tm, full_bar, cb * kSwizzleRowValues, key0, kvh, b);
    else
      tma_load_4d_multicast(dst + cb * C::kKVColBlockBytes + rank * C::kKVPartBytes, tm, full_bar,
                            cb * kSwizzleRowValues, key0 + int(rank) * C::kKVPartRows, kvh, b,
                            uint16_t((1u << C::kCluster) - 1));
  }
}

// The producer's copies for tile t: Q once (into Q buffer q_it % QSTAGES), then K and V key block
// by key block into the ring (step it onward). Advances q_it and it. Each CTA's full barrier
// expects the whole stage, also in a cluster (the other CTA's part arrives by its multicast).
template <typename C>
__device__ __forceinline__ void produce_tile(const HopperParams& p, const SmemPlan<C>& sm, const Tile& t, int& q_it,
                                             int& it, uint32_t rank) {
  const int kvh = t.h / p.group;
  const int qs = q_it % C::kQStages;
  mbar_wait(sm.q_empty(qs), ((q_it / C::kQStages) & 1) ^ 1);
  mbar_arrive_expect_tx(sm.q_full(qs), C::kQBytes);
  for (int cb = 0; cb < C::kColBlocks; ++cb)
    tma_load_4d(sm.q(qs) + cb * C::kQColBlockBytes, &p.tm_q, sm.q_full(qs), cb * kSwizzleRowValues, t.m0, t.h, t.b);
  ++q_it;
  for (int i = 0; i < t.n_blocks; ++i, ++it) {
    const int nb = t.block(i), s = it % C::kStages;
    wait_stage_free<C>(sm.empty_k(s), sm.peer_k(s), it);
    mbar_arrive_expect_tx(sm.full_k(s), C::kKVBytes);
    load_kv_stage<C>(sm.k(s), &p.tm_k, sm.full_k(s), nb * C::kBlockN, kvh, t.b, rank);
    wait_stage_free<C>(sm.empty_v(s), sm.peer_v(s), it);
    mbar_arrive_expect_tx(sm.full_v(s), C::kKVBytes);
    load_kv_stage<C>(sm.v(s), &p.tm_v, sm.full_v(s), nb * C::kBlockN, kvh, t.b, rank);
  }
}

// Warpgroup 0: the scheduling thread and the copy thread; the other threads have nothing to do.
template <typename C>
__device__ __forceinline__ void produce(const HopperParams& p, const SmemPlan<C>& sm, int warp, int lane) {
  const uint32_t rank = C::kCluster > 1 ? cluster_ctarank() : 0;
  if (C::kDynamicSchedule && warp == 1 && lane == 0) {  // the scheduling thread
    if (rank != 0) return;                              // in a cluster rank 0's schedules for both
    TileFeed<C> feed;
    for (int ti = blockIdx.x;; ti = fetch_tile<C>(p)) {
      feed.publish(sm, ti);
      if (ti >= p.num_tiles) break;
    }
    schedule_done<C>(p);
    return;
  }
  if (warp != 0 || lane != 0) return;
  tma_prefetch_desc(&p.tm_q);
  tma_prefetch_desc(&p.tm_k);
  tma_prefetch_desc(&p.tm_v);
  int it = 0, q_it = 0;
  TileFeed<C> feed;
  for (int ti = feed.next(sm); ti < p.num_tiles; ti = feed.next(sm)) {
    const Tile t = decode_tile(p, ti);
    if (t.n_blocks > 0) produce_tile<C>(p, sm, t, q_it, it, rank);
  }
}

// Warpgroups 1..NC: consumer cw = 0 .. NC-1.
template <typename T, typename C>
__device__ __forceinline__ void consume(const HopperParams& p, const SmemPlan<C>& sm, int cw) {
  regs_increase<C::kConsumerRegs>();
  // Round robin of the issue phases: consumer c waits on barrier 1 + c, then passes the turn to
  // consumer c + 1. Consumer 0 goes first: the last consumer pre-arrives on its barrier.
  if (cw == C::kConsumers - 1) named_arrive(1, kIssueTurnThreads);
  if constexpr (C::kQStages == 2)
    consume_streamed<T, C>(p, sm, cw);
  else
    consume_per_tile<T, C>(p, sm, cw);
  // The last consumer's final arrival on barrier 1 has no partner yet: consume it.
  if (cw == 0) named_sync(1, kIssueTurnThreads);
}

template <typename T, typename C>
__global__ void __launch_bounds__(C::kThreads, 1) hopper_flash_kernel(const __grid_constant__ HopperParams p) {
#if RA_HOPPER_WGMMA
  extern __shared__ uint8_t smem_raw[];
  const SmemPlan<C> sm{(smem_addr(smem_raw) + uint32_t(kSwizzleAtomBytes - 1)) & ~uint32_t(kSwizzleAtomBytes - 1)};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warp / 4;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(sm.full_k(s), 1);
      mbar_init(sm.full_v(s), 1);
      mbar_init(sm.empty_k(s), C::kConsumerWarps);
      mbar_init(sm.empty_v(s), C::kConsumerWarps);
      if constexpr (C::kCluster > 1) {  // the other CTA's copy thread
        mbar_init(sm.peer_k(s), 1);
        mbar_init(sm.peer_v(s), 1);
      }
    }
    for (int s = 0; s < C::kQStages; ++s) {
      mbar_init(sm.q_full(s), 1);
      mbar_init(sm.q_empty(s), C::kConsumerWarps);
    }
    for (int s = 0; s < C::kTileSlots; ++s) {
      mbar_init(sm.tile_full(s), 1);
      mbar_init(sm.tile_empty(s), TileFeed<C>::kReaders * C::kCluster);
    }
    mbar_fence_init();
  }
  // In a cluster, the other CTA's barriers are initialized before anything arrives on them or
  // copies into its shared memory.
  if constexpr (C::kCluster > 1)
    cluster_sync_all();
  else
    __syncthreads();
  // Launched programmatically (fwd_hopper.cu): the prologue above overlapped the kernel ahead
  // in the stream; nothing global (tensors, the tile counters) is touched before it has
  // completed. The next kernel may be scheduled at once: its CTAs find SMs as this grid's CTAs
  // exit, and wait for this grid in turn.
  pdl_wait_for_prior_grid();
  pdl_allow_dependent_launch();

  if (wg == 0) {
    // ---------------- producer ----------------
    regs_decrease<C::kProducerRegs>();
    produce<C>(p, sm, warp, lane);
  } else {
    consume<T, C>(p, sm, wg - 1);
  }
  // In a cluster no CTA exits while the other may still arrive on its barriers or copy into it.
  if constexpr (C::kCluster > 1) cluster_sync_all();
#else
  (void)p;
  __trap();
#endif
}

}  // namespace ringattn::cuda::hopper
