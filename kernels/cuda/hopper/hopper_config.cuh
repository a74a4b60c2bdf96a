// Tile shapes, shared-memory plan, kernel params and the tile schedule of the Hopper flash kernel.
// Shared by the producer and consumer code, which must agree on every one of these.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/hopper/fwd_hopper_params.hpp"
#include "kernels/cuda/hopper/hopper_ptx.cuh"
#include "kernels/cuda/hopper/hopper_tiles.hpp"

namespace ringattn::cuda::hopper {

// The kernels' 16-bit values: bf16 or fp16, one size in the dtype table (core/dtype.hpp), so one
// tile layout serves both.
inline constexpr int kValueBytes = dtype_size(DType::BF16);
static_assert(dtype_size(DType::F16) == kValueBytes, "bf16 and fp16 tiles share one layout");

// The 128-byte swizzle: a box row of 128 bytes holds 64 16-bit values, and the pattern repeats
// every 8 rows (1024 bytes, the stride between 8-row groups in a wgmma descriptor).
inline constexpr int kSwizzleRowBytes = 128;
inline constexpr int kSwizzleRowValues = kSwizzleRowBytes / kValueBytes;
inline constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 128-byte swizzled box: the chunk
// moves to chunk ^ (row % 8), so 8 rows' same chunk fall in 8 different bank groups (the layout
// the copy engine's 128-byte swizzle and wgmma's descriptors use).
__host__ __device__ __forceinline__ constexpr uint32_t swizzled_chunk(int row, int chunk) {
  return uint32_t(row * kSwizzleRowBytes + ((chunk ^ (row & 7)) << 4));
}
// One wgmma k-step reads 16 values (32 bytes) of each row: 4 k-steps per swizzled row.
inline constexpr int kKStepBytes = 16 * kValueBytes;
inline constexpr int kKStepsPerSwizzleRow = kSwizzleRowBytes / kKStepBytes;
inline constexpr int kWarpgroupThreads = 128;
// A consumer warpgroup owns 64 query rows of the tile (the M of wgmma m64nNk16).
inline constexpr int kRowsPerConsumer = 64;
// An issue turn's named barrier counts two warpgroups: the consumer that waits for its turn and
// the one that passes it on (bar.arrive).
inline constexpr int kIssueTurnThreads = 2 * kWarpgroupThreads;
// Named barrier kOutBarBase + c: consumer c's own warpgroup around its staged output (0 is
// __syncthreads, 1..3 the issue turns).
inline constexpr int kOutBarBase = 4;
// Lazy rescaling (softmax_step): the running max moves only when a row's max grew by more than
// this, in exp2 units, so p stays <= 2^8.
inline constexpr float kLazyThreshold = 8.f;

// One CTA: warpgroup 0 produces (one thread issues the bulk copies), warpgroups 1..NC consume,
// each owning 64 of the tile's 64 * NC query rows. Keys stream in tiles of N through a ring of
// STAGES stages (K and V each); Q through a ring of QSTAGES tiles. With QSTAGES = 2 the
// consumers run the streamed loop (fwd_hopper_consumer.cuh): the next tile's first Q K^T is issued
// with the current tile's last P V, and the epilogue overlaps the other warpgroups' wgmmas.
// CL = 2: clusters of two CTAs that run tiles 2i and 2i + 1 of decode_tile's order side by side,
// which the plan allows only where both read one KV head and visit the same key blocks
// (hopper_plan.cpp, TileInfo::takes: two query blocks of one head under a full mask, one query
// block of two q heads of one KV head under a causal or windowed one); each CTA's copy thread loads half of every K and V stage and
// multicasts it into both CTAs, so each key block leaves the L2 once per cluster instead of once
// per CTA. A stage is refilled only once the consumers of both CTAs have released it
// (wait_stage_free), and the tile schedule hands out pairs.
template <int D, int N, int NC, int STAGES, int QSTAGES = 1, int CL = 1>
struct Config {
  static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
  static_assert(N % 16 == 0 && N <= 256, "key tile: a multiple of 16, at most 256 (one TMA box)");
  static_assert(NC == 2 || NC == 3, "2 or 3 consumer warpgroups");
  static constexpr int kHeadDim = D;
  static constexpr int kBlockM = kRowsPerConsumer * NC;
  static constexpr int kBlockN = N;
  static constexpr int kStages = STAGES;
  static constexpr int kQStages = QSTAGES;
  static_assert(QSTAGES == 1 || QSTAGES == 2, "1 or 2 Q buffers");
  static constexpr int kConsumers = NC;
  static constexpr int kCluster = CL;
  static_assert(CL == 1 || (CL == 2 && QSTAGES == 1), "clusters of 2, with the per-tile loop");
  static_assert(N % (8 * CL) == 0, "each CTA's part of a key block: whole 8-row swizzle atoms");
  static constexpr int kThreads = kWarpgroupThreads * (NC + 1);
  static constexpr int kConsumerWarps = 4 * NC;
  // A 128-byte swizzled box holds 64 16-bit values per row, so rows of D values are stored as
  // D/64 column blocks of [rows][64], each block contiguous (the layout wgmma reads K-major).
  static constexpr int kColBlocks = D / kSwizzleRowValues;
  static constexpr int kQColBlockBytes = kBlockM * kSwizzleRowBytes;
  static constexpr int kKVColBlockBytes = kBlockN * kSwizzleRowBytes;
  static constexpr int kQBytes = kColBlocks * kQColBlockBytes;
  static constexpr int kKVBytes = kColBlocks * kKVColBlockBytes;  // one K or V stage
  // The rows of a key block that one CTA of a cluster loads (and multicasts), and their bytes
  // within each column block.
  static constexpr int kKVPartRows = N / CL;
  static constexpr int kKVPartBytes = kKVPartRows * kSwizzleRowBytes;
  static_assert(kQColBlockBytes % kSwizzleAtomBytes == 0 && kKVColBlockBytes % kSwizzleAtomBytes == 0,
                "column blocks on 1024-byte boundaries");
  // Barriers: full_k[S], full_v[S], empty_k[S], empty_v[S], q_full[QS], q_empty[QS],
  // tile_full[TS], tile_empty[TS], in a cluster peer_k[S], peer_v[S] (wait_stage_free); then the
  // TS tile-index slots of the dynamic schedule.
  static constexpr int kTileSlots = 2;
  static constexpr int kNumBars = 4 * kStages + 2 * kQStages + 2 * kTileSlots + (CL > 1 ? 2 * kStages : 0);
  // +1024: the dynamic buffer is realigned to 1024 bytes, where the 128-byte swizzle repeats.
  static constexpr int kTailBytes = kNumBars * 8 + kTileSlots * 4 + kSwizzleAtomBytes;
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQStages * kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKVBytes;
  // The staged output (store_output_staged, hopper_softmax.cuh): each consumer's 64 rows of the
  // final 16-bit output in the Q layout (D/64 swizzled column blocks), written out by bulk tensor
  // stores. Only in the per-tile loop and where it fits beside the rest (not at 128x176 or head
  // dim 256, whose stages take the shared memory).
  static constexpr int kOutBytes = kRowsPerConsumer * D * kValueBytes;  // one consumer's rows
  static constexpr int kOffOut = kOffV + kStages * kKVBytes;
  // Also only where the causal order's shift (query_shift: a multiple of gcd(block_m, block_n))
  // moves whole consumers, so that no consumer's rows straddle row 0.
  static constexpr bool kStagedOut = QSTAGES == 1 && kOffOut + NC * kOutBytes + kTailBytes <= 232448 &&
                                     gcd_of(kBlockM, N) % kRowsPerConsumer == 0;
  static constexpr int kOffBar = kOffOut + (kStagedOut ? NC * kOutBytes : 0);
  static constexpr int kOffTileSlots = kOffBar + kNumBars * 8;
  static constexpr int kSmemBytes = kOffTileSlots + kTileSlots * 4 + kSwizzleAtomBytes;
  static_assert(kSmemBytes <= 232448, "over the 227 KB of shared memory a CTA may have");
  // Register budget after setmaxnreg: 128 * producer + 128 * NC * consumer <= 65536. Head dim 256
  // holds 128 accumulators of O per consumer thread: its consumers take 240 (the producer's one
  // issuing thread needs few).
  static constexpr int kProducerRegs = NC == 2 ? (D == 256 ? 24 : 40) : 32;
  static constexpr int kConsumerRegs = NC == 2 ? (D == 256 ? 240 : 232) : 160;
  // The dynamic tile schedule (TileFeed). Not at head dim 256: there the copy thread's 24
  // registers spill (48 bytes) when it reads tile indices from shared memory, so CTAs take the
  // static round robin.
  static constexpr bool kDynamicSchedule = D != 256;
  // setmaxnreg moves registers between the warpgroups of the CTA: the sum may not exceed what the
  // launch gave each thread (65536 / kThreads, rounded down to 8) times the warpgroups.
  static_assert(kProducerRegs + NC * kConsumerRegs <= (NC + 1) * (65536 / kThreads / 8 * 8), "register file");
};

// Addresses in the 1024-byte aligned dynamic shared memory of one CTA.
template <typename C>
struct SmemPlan {
  uint32_t base;
  __device__ __forceinline__ uint32_t q(int slot) const { return base + C::kOffQ + slot * C::kQBytes; }
  __device__ __forceinline__ uint32_t k(int s) const { return base + C::kOffK + s * C::kKVBytes; }
  __device__ __forceinline__ uint32_t v(int s) const { return base + C::kOffV + s * C::kKVBytes; }
  __device__ __forceinline__ uint32_t out(int consumer) const { return base + C::kOffOut + consumer * C::kOutBytes; }
  __device__ __forceinline__ uint32_t bar(int i) const { return base + C::kOffBar + 8 * i; }
  __device__ __forceinline__ uint32_t full_k(int s) const { return bar(s); }
  __device__ __forceinline__ uint32_t full_v(int s) const { return bar(C::kStages + s); }
  __device__ __forceinline__ uint32_t empty_k(int s) const { return bar(2 * C::kStages + s); }
  __device__ __forceinline__ uint32_t empty_v(int s) const { return bar(3 * C::kStages + s); }
  __device__ __forceinline__ uint32_t q_full(int s) const { return bar(4 * C::kStages + s); }
  __device__ __forceinline__ uint32_t q_empty(int s) const { return bar(4 * C::kStages + C::kQStages + s); }
  __device__ __forceinline__ uint32_t tile_full(int s) const { return bar(4 * C::kStages + 2 * C::kQStages + s); }
  __device__ __forceinline__ uint32_t tile_empty(int s) const {
    return bar(4 * C::kStages + 2 * C::kQStages + C::kTileSlots + s);
  }
  __device__ __forceinline__ uint32_t peer_k(int s) const {
    return bar(4 * C::kStages + 2 * C::kQStages + 2 * C::kTileSlots + s);
  }
  __device__ __forceinline__ uint32_t peer_v(int s) const {
    return bar(5 * C::kStages + 2 * C::kQStages + 2 * C::kTileSlots + s);
  }
  __device__ __forceinline__ uint32_t tile_slot(int s) const { return base + C::kOffTileSlots + 4 * s; }
};

// The dynamic tile schedule. CTA c starts with tile c; every later tile goes to the CTA whose
// producer asks first (an atomic counter in global memory), so a CTA that drew short tiles takes
// more of them. The static round robin (tile c, c + gridDim.x, ...) left the slowest CTA with 3%
// more than the mean at batch 4 x 2k causal and 6% at 8k causal (hopper/PERF.md). The producer
// schedules: one thread of its second warp asks for the CTA's next tile and publishes each tile
// index (then one past the last tile: the end) through a ring of kTileSlots shared slots, which
// the copy-issuing thread and every consumer thread read once each (a thread of its own, because
// the copy thread has only 24 registers at head dim 256). Tiles keep decode_tile's order (longest
// causal tiles first).
// Without C::kDynamicSchedule, next() returns tiles c, c + gridDim.x, ... (the static round robin)
// and no thread schedules.
// In a cluster of two (C::kCluster) the schedule hands out pairs: rank 0's scheduling thread
// publishes the pair's first tile (even) into the slots of both CTAs, and rank r reads it + r, so
// both CTAs run tiles 2i and 2i + 1 in step; every reader of both CTAs arrives on rank 0's empty
// barrier. (blockIdx.x is 2 x the cluster + the rank, so the static order and the first tiles
// already pair up.)
template <typename C>
struct TileFeed {
  // Every consumer thread and the copy thread read each index and arrive on the slot's empty
  // barrier (one arrival per warp after __syncwarp is enough in the memory model, but racecheck
  // only sees the order through a thread's own arrival, as in the backward's stage barriers).
  static constexpr int kReaders = 32 * C::kConsumerWarps + 1;
  int it = 0;
  // Readers: the next tile index; >= p.num_tiles when there is none. Call again only before
  // that.
  __device__ __forceinline__ int next(const SmemPlan<C>& sm) {
    if constexpr (!C::kDynamicSchedule) return int(blockIdx.x) + int(gridDim.x) * it++;
    const int s = it % C::kTileSlots;
    int ti;
    if constexpr (C::kCluster == 1) {
      mbar_wait(sm.tile_full(s), (it / C::kTileSlots) & 1);
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(ti) : "r"(sm.tile_slot(s)) : "memory");
      mbar_arrive(sm.tile_empty(s));
    } else {
      mbar_wait_cluster(sm.tile_full(s), (it / C::kTileSlots) & 1);
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(ti) : "r"(sm.tile_slot(s)) : "memory");
      mbar_arrive_cluster(cluster_addr(sm.tile_empty(s), 0));
      ti += int(cluster_ctarank());
    }
    ++it;
    return ti;
  }
  // The scheduling thread (rank 0's in a cluster): publishes tile index ti once every reader has
  // read the index kTileSlots before it.
  __device__ __forceinline__ void publish(const SmemPlan<C>& sm, int ti) {
    const int s = it % C::kTileSlots;
    const uint32_t parity = ((it / C::kTileSlots) & 1) ^ 1;
    if constexpr (C::kCluster == 1) {
      mbar_wait(sm.tile_empty(s), parity);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sm.tile_slot(s)), "r"(ti) : "memory");
      mbar_arrive(sm.tile_full(s));  // release: the consumers' wait sees the index
    } else {
      mbar_wait_cluster(sm.tile_empty(s), parity);
      for (uint32_t r = 0; r < C::kCluster; ++r) st_shared_cluster(cluster_addr(sm.tile_slot(s), r), uint32_t(ti));
      for (uint32_t r = 0; r < C::kCluster; ++r) mbar_arrive_cluster(cluster_addr(sm.tile_full(s), r));
    }
    ++it;
  }
};
// The scheduling thread: the index of this CTA's (cluster's) next tile (the first gridDim.x went
// one to each CTA, two to each cluster).
template <typename C>
__device__ __forceinline__ int fetch_tile(const HopperParams& p) {
  return int(gridDim.x) + C::kCluster * atomicAdd(p.tile_counter, 1);
}
// The scheduling thread, after the fetch that returned the end: the last one to get here has seen
// every other's last fetch done, and zeroes both counters for the next launch on the stream
// (launches on one stream run one after another).
template <typename C>
__device__ __forceinline__ void schedule_done(const HopperParams& p) {
  __threadfence();
  if (atomicAdd(p.tile_counter + 1, 1) == int(gridDim.x) / C::kCluster - 1) {
    atomicExch(p.tile_counter, 0);
    atomicExch(p.tile_counter + 1, 0);
  }
}

// The copy thread's wait until a K or V stage may be refilled at step `it` (round it / kStages):
// this CTA's consumer warps have released it (empty_bar); in a cluster also the other
// CTA's, whose copy of the stage this CTA's multicast writes too. The copy threads tell each other
// (peer_bar, one arrival per release from the other CTA's copy thread), so the consumers arrive
// only on their own CTA's barriers, as without a cluster (remote arrivals in the consumers' loop
// made ptxas serialize the 128x176 kernel's wgmmas: C7511, registers short). Round 0 finds every
// stage empty and sends nothing: the arrival sent in round k is the release of round k - 1.
template <typename C>
__device__ __forceinline__ void wait_stage_free(uint32_t empty_bar, uint32_t peer_bar, int it) {
  const uint32_t parity = ((it / C::kStages) & 1) ^ 1;
  mbar_wait(empty_bar, parity);
  if constexpr (C::kCluster == 2) {
    if (it >= C::kStages) mbar_arrive_cluster(cluster_addr(peer_bar, cluster_ctarank() ^ 1u));
    mbar_wait_cluster(peer_bar, parity);
  }
}

// True when key block nb needs the element mask: it reaches past kv_len, or the mask hides some
// of its keys from some row of the tile. Every other block is fully visible.
// classify_block's Full test, as two int comparisons against the bounds decode_tile found once
// per tile (keys past kv_len count as needing the mask; without a window full_begin is 0 and the
// first never holds). Uniform across the warpgroup.
template <typename C>
__device__ __forceinline__ bool block_needs_mask(const HopperParams& /*p*/, const Tile& t, int nb) {
  return nb * C::kBlockN < t.full_begin || (nb + 1) * C::kBlockN > t.full_end;
}

}  // namespace ringattn::cuda::hopper
