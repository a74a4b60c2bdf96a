// The sm_90a flash backward (this file: what both kernels share; bwd_hopper_keys.cuh: the key
// kernel; bwd_hopper_query.cuh: the query kernel; bwd_hopper.cu: their launch). Two
// warp-specialized kernels in the style of the forward
// (fwd_hopper_kernel.cuh), each a CTA of one producer warpgroup (bulk tensor copies into
// 128-byte swizzled tiles) and two consumer warpgroups of 64 rows (wgmma, fp32 accumulators).
//
// The math is bwd_mma.cu's (natural-log lse of the forward; log2(e) folded into exp2):
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
// Fused dq (HopperBwdParams::fused_dq, the fast mode): the key kernel also stores each tile's
// dS^T (16-bit) into a double-buffered shared tile, the two consumers meet at a named barrier,
// and at head dim 128 consumer c computes dQ = dS K for head-dim columns 64c..64c+63 over the
// block's 128 keys (wgmma with both operands transposed from shared memory); at head dim 64 the
// consumers take turns by tile, one forming all 64 columns. The result is staged in fp32 and
// added into dq with bulk reduce-adds (dq zeroed first in Write mode). No query kernel then.
//
// Accumulator and A-fragment layouts are the forward's (hopper_softmax.cuh): register i of a
// thread holds row g + 8 ((i >> 1) & 1) and column 8 (i >> 2) + 2 t + (i & 1) of its warp's 16
// rows; scores_to_p packs them into the A operand of the next wgmma.
#pragma once

#include "kernels/cuda/bwd_common.cuh"
#include "kernels/cuda/hopper/bwd_hopper_params.hpp"
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
  // The k-steps' descriptors are the first one's advanced by compile-time offsets (desc_advance),
  // as in the forward's Issue::qk.
  __device__ __forceinline__ static void abt(float (&acc)[32], uint32_t a_base, int a_cb, uint32_t b_base, int b_cb) {
    const uint64_t da0 = smem_desc_sw128(a_base, 16, kSwizzleAtomBytes);
    const uint64_t db0 = smem_desc_sw128(b_base, 16, kSwizzleAtomBytes);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t cb = kk / kKStepsPerSwizzleRow, within = (kk % kKStepsPerSwizzleRow) * kKStepBytes;
      const uint64_t da = desc_advance(da0, cb * a_cb + within);
      const uint64_t db = desc_advance(db0, cb * b_cb + within);
      W::ss_n64(acc, da, db, kk > 0 ? 1 : 0);
    }
  }
  // acc[64 x D] (+)= X B over 64 rows of B: X packed by scores_to_p (16 registers), B the 64-row
  // tile at b_base read N-major (its 64-value column blocks b_cb bytes apart): the forward's P V.
  // accumulate = false overwrites acc.
  __device__ __forceinline__ static void xb(float (&acc)[D / 2], const uint32_t (&x)[16], uint32_t b_base, int b_cb,
                                            bool accumulate = true) {
    const uint64_t db0 = smem_desc_sw128(b_base, b_cb, kSwizzleAtomBytes);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t db = desc_advance(db0, kk * 2 * kSwizzleAtomBytes);
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
// cw comes from lane 0 (warp_uniform, as the forward's Lane), and so do the shared-memory bases
// the consumers make from it.
struct BwdLane {
  int cw, lane, g, tq, r0;
  __device__ __forceinline__ explicit BwdLane(int consumer) {
    cw = warp_uniform(consumer);
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

}  // namespace ringattn::cuda::hopper
