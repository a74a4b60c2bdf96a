// The sm_90a flash backward: two warp-specialized kernels in the style of the forward
// (hopper_flash_kernel.cuh), each a CTA of one producer warpgroup (bulk tensor copies into
// 128-byte swizzled tiles) and two consumer warpgroups of 64 rows (wgmma, fp32 accumulators).
//
// The math is flash_bwd_mma.cu's (natural-log lse of the forward; log2(e) folded into exp2):
//   P = exp2(scale log2e S - log2e lse), dS = P (dP - D), dV = P^T dout, dK = scale dS^T Q,
//   dQ = scale dS K, with S = Q K^T, dP = dout V^T and D = rowsum(dout * o).
//
// Key kernel (dK, dV): one CTA per (batch, kv head, block of 128 keys); consumer c owns keys
// 64c..64c+63 of the block and keeps their dK and dV (64 x D each) in registers. K and V are
// loaded once; the producer streams (Q, dout) tiles of 64 query rows, with the rows' lse (log2
// units, +inf where P must be 0) and D, through a ring of kStages, over every query head of the
// group and every query tile that can see the block's keys. Per tile each consumer issues
//   S^T  = K_c Q^T,  dP^T = V_c dout^T      (wgmma m64n64k16, both operands in shared memory)
// then forms P^T and dS^T in registers (the mask as each key's range of visible query rows,
// core/mask.hpp visible_rows) and issues
//   dV_c += P^T dout,  dK_c += dS^T Q       (A from registers, B = dout / Q read N-major).
// Query kernel (dQ): one CTA per (batch, query head, block of 128 query rows); consumer c owns
// rows 64c..64c+63. Q and dout are loaded once; (K, V) tiles of 64 keys stream in key order:
//   S = Q_c K^T, dP = dout_c V^T; P, dS in registers (the forward's mask_scores); dQ_c += dS K.
// The query kernel runs every sum in a fixed order, so its results are bitwise reproducible
// (deterministic mode), at the cost of recomputing S and dP (7 matrix products per tile pair
// instead of 5).
// Fused dq (HopperBwdParams::fused_dq, the fast mode at head dim 128): the key kernel also stores
// each tile's dS^T (16-bit) into a double-buffered shared tile, the two consumers meet at a named
// barrier, and consumer c computes dQ = dS K for head-dim columns 64c..64c+63 over the block's
// 128 keys (wgmma with both operands transposed from shared memory), stages it in fp32 and adds
// it into dq with bulk reduce-adds (dq zeroed first in Write mode). No query kernel then.
//
// Accumulator and A-fragment layouts are the forward's (hopper_softmax.cuh): register i of a
// thread holds row g + 8 ((i >> 1) & 1) and column 8 (i >> 2) + 2 t + (i & 1) of its warp's 16
// rows; scores_to_p packs them into the A operand of the next wgmma.
#pragma once

#include "kernels/cuda/flash_bwd_common.cuh"
#include "kernels/cuda/hopper/hopper_bwd_params.hpp"
#include "kernels/cuda/hopper/hopper_config.cuh"
#include "kernels/cuda/hopper/hopper_ptx.cuh"
#include "kernels/cuda/hopper/hopper_softmax.cuh"
#include "kernels/cuda/hopper/hopper_wgmma.cuh"

namespace ringattn::cuda::hopper {

template <int D>
struct BwdConfig {
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  static constexpr int kHeadDim = D;
  static constexpr int kTile = 64;  // rows of one box, of one consumer's share, of one streamed tile
  static constexpr int kConsumers = 2;
  static constexpr int kBlock = kTile * kConsumers;  // keys of a key-kernel CTA, query rows of a query-kernel CTA
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static constexpr int kConsumerWarps = 4 * kConsumers;
  static constexpr int kStages = 2;
  static constexpr int kColBlocks = D / kSwizzleRowValues;
  static constexpr int kTileColBytes = kTile * kSwizzleRowBytes;    // one 64-value column block of a tile
  static constexpr int kBlockColBytes = kBlock * kSwizzleRowBytes;  // ... of a block
  static constexpr int kTileBytes = kColBlocks * kTileColBytes;
  static constexpr int kBlockBytes = kColBlocks * kBlockColBytes;
  // Key kernel: K, V (block); per stage Q, dout (tile) and the tile's lse and D (kTile floats each).
  static constexpr int kKeyOffK = 0;
  static constexpr int kKeyOffV = kKeyOffK + kBlockBytes;
  static constexpr int kKeyOffQ = kKeyOffV + kBlockBytes;
  static constexpr int kKeyOffDo = kKeyOffQ + kStages * kTileBytes;
  static constexpr int kKeyOffRows = kKeyOffDo + kStages * kTileBytes;
  // With the fused dq: dS^T (kBlock keys x kTile queries, 16-bit, swizzled) double-buffered, and
  // each consumer's 64 x 64 fp32 dQ part staged for the reduce-add, double-buffered (two boxes
  // of 64 rows x 32 columns, 128-byte swizzle). (Reserved either way: the CTA is one per SM by
  // its registers.)
  static constexpr int kKeyOffDs = kKeyOffRows + kSwizzleAtomBytes;  // the rows take 1 KB
  static_assert(kStages * 2 * kTile * 4 <= kSwizzleAtomBytes, "lse and D of every stage in 1 KB");
  static constexpr int kDsBytes = kBlock * kSwizzleRowBytes;
  static constexpr int kKeyOffDqPart = kKeyOffDs + 2 * kDsBytes;
  static constexpr int kDqPartBytes = kTile * kTile * 4;
  static constexpr int kKeyOffBar = kKeyOffDqPart + 2 * kConsumers * kDqPartBytes;
  static constexpr int kKeyBars = 1 + 2 * kStages;  // kv_full, qd_full[S], qd_empty[S]
  static constexpr int kKeySmem = kKeyOffBar + kKeyBars * 8 + kSwizzleAtomBytes;
  // Query kernel: Q, dout (block); per stage K, V (tile).
  static constexpr int kDqOffQ = 0;
  static constexpr int kDqOffDo = kDqOffQ + kBlockBytes;
  static constexpr int kDqOffK = kDqOffDo + kBlockBytes;
  static constexpr int kDqOffV = kDqOffK + kStages * kTileBytes;
  static constexpr int kDqOffBar = kDqOffV + kStages * kTileBytes;
  static constexpr int kDqBars = 1 + 2 * kStages;  // qo_full, kv_full[S], kv_empty[S]
  static constexpr int kDqSmem = kDqOffBar + kDqBars * 8 + kSwizzleAtomBytes;
  static_assert(kKeySmem <= 232448 && kDqSmem <= 232448, "over the 227 KB of shared memory a CTA may have");
  static_assert(kTileColBytes % kSwizzleAtomBytes == 0, "column blocks on 1024-byte boundaries");
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(kWarpgroupThreads * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "register file");
};

// The wgmma products of both kernels, on tiles of 64 rows of one consumer.
template <typename T, int D>
struct BwdIssue {
  using W = Wgmma<T>;
  // acc[64 x 64] = A B^T over the head dim: A = 64 rows at a_base, B = 64 rows at b_base, both
  // K-major in column blocks a_cb / b_cb bytes apart (S = Q K^T and its relatives).
  __device__ __forceinline__ static void abt(float (&acc)[32], uint32_t a_base, int a_cb, uint32_t b_base, int b_cb) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t cb = kk / kKStepsPerSwizzleRow, within = (kk % kKStepsPerSwizzleRow) * kKStepBytes;
      const uint64_t da = smem_desc_sw128(a_base + cb * a_cb + within, 16, kSwizzleAtomBytes);
      const uint64_t db = smem_desc_sw128(b_base + cb * b_cb + within, 16, kSwizzleAtomBytes);
      W::ss_n64(acc, da, db, kk > 0 ? 1 : 0);
    }
  }
  // acc[64 x D] (+)= X B over 64 rows of B: X packed by scores_to_p (16 registers), B the 64-row
  // tile at b_base read N-major (its 64-value column blocks b_cb bytes apart): the forward's P V.
  // accumulate = false overwrites acc.
  __device__ __forceinline__ static void xb(float (&acc)[D / 2], const uint32_t (&x)[16], uint32_t b_base, int b_cb,
                                            bool accumulate = true) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t db = smem_desc_sw128(b_base + kk * 2 * kSwizzleAtomBytes, b_cb, kSwizzleAtomBytes);
      const uint32_t a[4] = {x[4 * kk], x[4 * kk + 1], x[4 * kk + 2], x[4 * kk + 3]};
      const int scale_d = (kk > 0 || accumulate) ? 1 : 0;
      if constexpr (D == 64)
        W::rs_n64(acc, a, db, scale_d);
      else
        W::rs_n128(acc, a, db, scale_d);
    }
  }
};

// This thread's place in its consumer warpgroup: its rows are r0 + g and r0 + g + 8 of the CTA's
// block, r0 = 64 c + 16 warp.
struct BwdLane {
  int cw, lane, g, tq, r0;
  __device__ __forceinline__ explicit BwdLane(int consumer) {
    cw = consumer;
    lane = threadIdx.x % 32;
    g = lane / 4;
    tq = lane % 4;
    r0 = consumer * 64 + ((threadIdx.x / 32) % 4) * 16;
  }
};

// Writes (or adds) scale * acc into 16 x D gradient rows: row r's pointer is row_at(r) (nullptr
// past the end); acc in the accumulator layout.
template <int D, typename RowAt>
__device__ __forceinline__ void store_grad_acc(const float (&acc)[D / 2], float scale, bool accumulate,
                                               const BwdLane& ln, RowAt row_at) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float* row = row_at(ln.g + 8 * r);
    if (row == nullptr) continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float* dst = row + 8 * n + 2 * ln.tq + e;
        const float x = acc[4 * n + 2 * r + e] * scale;
        *dst = accumulate ? *dst + x : x;
      }
  }
}

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
    const uint32_t addr = tile + row * kSwizzleRowBytes + ((chunk ^ (row & 7)) << 4) + ln.tq * 4;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pds[i]) : "memory");
  }
}

// dQ part = dS K for this consumer's 64 columns of the head dim (column block c of K), over the
// block's 128 keys: A = the dS^T tile read M-major, B = K's column block read N-major.
template <typename T, typename C>
__device__ __forceinline__ void dq_part_product(float (&acc)[32], uint32_t ds_tile, uint32_t k_col_block) {
#pragma unroll
  for (int kk = 0; kk < C::kBlock / 16; ++kk) {
    const uint64_t da = smem_desc_sw128(ds_tile + kk * 2 * kSwizzleAtomBytes, C::kDsBytes, kSwizzleAtomBytes);
    const uint64_t db = smem_desc_sw128(k_col_block + kk * 2 * kSwizzleAtomBytes, C::kBlockColBytes, kSwizzleAtomBytes);
    Wgmma<T>::ss_tt_n64(acc, da, db, kk > 0 ? 1 : 0);
  }
}

// Stages scale * acc (64 query rows x 64 columns, the accumulator layout) in fp32 as two boxes
// of 64 rows x 32 columns with the 128-byte swizzle (conflict-free stores: 16-byte chunk j of row
// r at chunk j ^ (r % 8)) and adds it into dq by two bulk reduce-adds, issued by the consumer's
// first thread. `named` is the consumer's own barrier. The buffer is one of two: the reduce-adds
// of two steps ago, which read it, must be done reading (the last step's may still run).
template <typename C>
__device__ __forceinline__ void dq_part_reduce(const HopperBwdParams& p, const float (&acc)[32], uint32_t part,
                                               const BwdLane& ln, int named, int col0, int i0, int h, int b) {
  constexpr int kBoxBytes = C::kTile * kSwizzleRowBytes;  // 64 rows x 32 fp32
  const bool leader = threadIdx.x % kWarpgroupThreads == 0;
  if (leader) bulk_wait_read<1>();
  named_sync(named, kWarpgroupThreads);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // Columns 8 n + 2 t (+1): box n / 4, 16-byte chunk 2 (n % 4) + t / 2, bytes 8 (t % 2).
      const int row = ln.r0 - ln.cw * C::kTile + ln.g + 8 * r, chunk = 2 * (n & 3) + (ln.tq >> 1);
      const uint32_t addr = part + (n >> 2) * kBoxBytes + row * kSwizzleRowBytes + ((chunk ^ (row & 7)) << 4) +
                            (ln.tq & 1) * 8;
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(acc[4 * n + 2 * r] * p.scale),
                   "f"(acc[4 * n + 2 * r + 1] * p.scale)
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
  const uint32_t k_base = sm.k() + ln.cw * C::kTileColBytes, v_base = sm.v() + ln.cw * C::kTileColBytes;
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
      float dqa[32];
      wgmma_fence();
      dq_part_product<T, C>(dqa, sm.ds(s & 1), sm.k() + ln.cw * C::kBlockColBytes);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(dqa);
      dq_part_reduce<C>(p, dqa, sm.dq_part(ln.cw, s & 1), ln, 2 + ln.cw, ln.cw * C::kTile, w.i0(s),
                        w.hk * p.group + w.head(s), w.b);
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
  const uint32_t q_base = sm.q() + ln.cw * C::kTileColBytes, o_base = sm.dout() + ln.cw * C::kTileColBytes;
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
