// Flash backward on tensor cores (bf16/fp16 inputs, head dim 64 or 128, fp32 accumulation), with
// mma.sync m16n8k16 only (sm_80 features): the portable backward, FlashAttention-2 style.
//
// The math (natural-log lse of the forward, scale included; log2(e) folded into the exponent):
//   P_ij = 2^(scale log2e q_i.k_j - log2e lse_i) on visible (i, j), else 0; 0 when lse_i = -inf,
//   D_i = dout_i . o_i (the pre-pass of bwd_simt.cu),  dP_ij = dout_i . v_j,
//   dS_ij = P_ij (dP_ij - D_i),  dV_j = sum_i P_ij dout_i,  dK_j = scale sum_i dS_ij q_i,
//   dQ_i = scale sum_j dS_ij k_j.
//
// Key kernel (bwd_keys_mma_kernel): one CTA per (batch, kv head, block of kBK = 64 keys), 4 warps,
// warp w owning keys 16w..16w+15 of the block. K and V of the block stay in shared memory; the
// warp's dK and dV (16 x D each, fp32) stay in registers. The CTA walks the query heads of the
// group and, per head, the blocks of kBQ = 64 query rows that can see its keys
// (core/mask.hpp visible_rows_of_keys); Q, dout (64 x D) and the rows' lse (pre-multiplied by log2e, +inf for a
// row that sees no key or lies past q_len, so that P = 0 there) and D stream through shared
// memory, double-buffered (cp.async for Q and dout). Per query block and per sub-step of kQN
// queries (32 at D = 128, to bound the live registers; 64 at D = 64) each warp computes
//   S^T  = K_w Q^T          (16 keys x kQN queries)  A = K_w  (ldmatrix), B = Q  (ldmatrix)
//   dP^T = V_w dout^T                                 A = V_w  (ldmatrix), B = dout (ldmatrix)
//   P^T, dS^T in registers (the element mask only on blocks that are not Full or that pass
//   kv_len; a per-key range of visible query columns),
//   dV_w += P^T dout         A = P^T from the accumulators (as the forward's P for P V),
//                            B = dout via ldmatrix.trans (as the forward's V)
//   dK_w += dS^T Q           A = dS^T likewise, B = Q via ldmatrix.trans.
// Fast mode (kAtomicDq): each warp also stores its dS^T (16-bit, 16 keys x 64 queries) into a
// shared 64 x 64 tile; after a barrier warp w takes the query rows 16w..16w+15 and computes
//   dQ rows = dS K           A = dS via ldmatrix.trans of the stored dS^T, B = K via
//                            ldmatrix.trans
// 16 columns of D at a time, and adds scale * dQ to the fp32 dq with atomics (dq zeroed first in
// Write mode). One CTA owns its (kv head, key block) dK, dV over all the group's query heads, so
// they are written (or accumulated) once, without atomics.
//
// Query kernel (bwd_dq_mma_kernel, deterministic mode): one CTA per (batch, query head, block of
// 64 query rows), warp w owning rows 16w..16w+15; Q and dout in shared memory, K and V tiles of 64
// keys double-buffered, walked in key order over the keys the rows can see. Each warp recomputes
//   S = Q_w K^T, dP = dout_w V^T (B = K, V via ldmatrix), dS = P (dP - D),
//   dQ_w += dS K             A = dS from the accumulators, B = K via ldmatrix.trans
// and keeps dQ_w (16 x D) in registers; the key kernel then skips dq. Every sum runs in a fixed
// order: bitwise reproducible.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit A/B; g = lane / 4, t = lane % 4):
//   A (16 x 16, row): a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g, 8 + 2t..), a3 = (g + 8, 8 + 2t..)
//   B (16 x 8, col):  b0 = (k 2t..2t+1, n g), b1 = (k 8 + 2t.., n g)
//   C (16 x 8):       c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..2t+1)
// An m16n8 accumulator pair (tiles 2kk, 2kk + 1) is exactly the A fragment of k-step kk (the
// forward's S -> P conversion). Shared tiles are SwizzledTile (device_common.cuh); an ldmatrix.x4
// lane addresses matrix mi = lane / 8, row lane % 8 of it:
//   a_off (A, no trans): rows lane % 16, chunk lane / 16          -> a0..a3
//   b_off (B, no trans): rows (mi / 2) * 8 + lane % 8, chunk mi % 2 -> b0, b1 of n8 tile 0, then tile 1
//     (a [rows][D] tile whose rows are B's n index: K or V for S = Q K^T, Q or dout for S^T)
//   t_off (B, trans):    rows (mi % 2) * 8 + lane % 8, chunk mi / 2 -> b0, b1 of n8 tile 0, then tile 1
//     (a [rows][D] tile whose rows are B's k index: dout, Q, K for the P B products)
//   The dS^T tile read as dS (A, trans): rows = keys (mi / 2) * 8 + lane % 8, chunk = queries
//     2 w + mi % 2, i.e. b_off's pattern on a 64-column tile: matrix 0 is (queries 0-7, keys 0-7)
//     transposed -> a0, 1 (queries 8-15, keys 0-7) -> a1, 2 (queries 0-7, keys 8-15) -> a2, 3 -> a3.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/bwd_common.cuh"
#include "kernels/cuda/online_softmax.cuh"

namespace ringattn::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBK = 64;  // keys per key-kernel CTA and per query-kernel key tile (16 per warp)
constexpr int kBQ = 64;  // query rows per query block (16 per warp in the dq step and the query kernel)

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int clamp_int(int64_t x, int lo, int hi) { return int(x < lo ? lo : (x > hi ? hi : x)); }

template <int D>
struct BwdShape {
  // Queries per warp sub-step of the key kernel: 16 keys x kQN of S^T and dP^T live next to the
  // 2 x 16 x D dK, dV accumulators.
  static constexpr int kQN = D == 128 ? 32 : 64;
  // Key kernel: K, V (kBK x D), Q and dout double-buffered (2 x kBQ x D each), with kAtomicDq the
  // dS^T tile (kBK x kBQ), then lse and D of the two buffers (fp32).
  static constexpr size_t keys_smem(size_t elem, bool atomic_dq) {
    return size_t(2 * kBK * D + 4 * kBQ * D + (atomic_dq ? kBK * kBQ : 0)) * elem + 4 * kBQ * sizeof(float);
  }
  // Query kernel: Q, dout (kBQ x D), K and V double-buffered (2 x kBK x D each).
  static constexpr size_t dq_smem(size_t elem) { return size_t(2 * kBQ * D + 4 * kBK * D) * elem; }
};

// ---- warp-level GEMMs on shared tiles ----

// c = A B^T: A = rows [a_row0, a_row0 + 16) of the [rows][D] tile at a_tile, B^T's columns = rows
// [b_row0, b_row0 + kN) of the [rows][D] tile at b_tile (shared byte addresses): c[n] holds
// columns 8n..8n+7. The product over the head dim (S = Q K^T and its relatives).
template <typename T, int D, int kN>
__device__ __forceinline__ void warp_gemm_abt(float (&c)[kN / 8][4], uint32_t a_tile, int a_row0, uint32_t b_tile,
                                              int b_row0, const uint32_t (&a_off)[4], const uint32_t (&b_off)[4]) {
  using H = Half16<T>;
  using Tile = SwizzledTile<D>;
#pragma unroll
  for (int n = 0; n < kN / 8; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, a_tile + Tile::fragment_offset(a_off, a_row0, kk));
#pragma unroll
    for (int nn = 0; nn < kN / 16; ++nn) {
      uint32_t b[4];
      ldmatrix_x4(b, b_tile + Tile::fragment_offset(b_off, b_row0 + nn * 16, kk));
      H::mma(c[2 * nn], a, b[0], b[1]);
      H::mma(c[2 * nn + 1], a, b[2], b[3]);
    }
  }
}

// The A fragment of k-step kk from m16n8 accumulators (tiles 2kk and 2kk + 1), rounded to T.
template <typename T, int kN>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&x)[kN][4], int kk) {
  using H = Half16<T>;
  a[0] = H::pack(x[2 * kk][0], x[2 * kk][1]);
  a[1] = H::pack(x[2 * kk][2], x[2 * kk][3]);
  a[2] = H::pack(x[2 * kk + 1][0], x[2 * kk + 1][1]);
  a[3] = H::pack(x[2 * kk + 1][2], x[2 * kk + 1][3]);
}

// acc += X B: X (16 x kK) from m16n8 accumulators x[kK / 8], B = rows [b_row0, b_row0 + kK) of
// the [rows][D] tile at b_tile, read with ldmatrix.trans (the forward's P V).
template <typename T, int D, int kK>
__device__ __forceinline__ void warp_gemm_xb(float (&acc)[D / 8][4], const float (&x)[kK / 8][4], uint32_t b_tile,
                                             int b_row0, const uint32_t (&t_off)[4]) {
  using H = Half16<T>;
  using Tile = SwizzledTile<D>;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t a[4];
    pack_a<T, kK / 8>(a, x, kk);
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_tile + Tile::fragment_offset(t_off, b_row0 + kk * 16, dn));
      H::mma(acc[2 * dn], a, b[0], b[1]);
      H::mma(acc[2 * dn + 1], a, b[2], b[3]);
    }
  }
}

// ---- gradient rows ----

// Writes (Write) or adds (Accumulate) scale * acc, the m16n8 accumulators of 16 rows x D, into
// fp32 gradient rows; row_at(r) is row r's pointer, nullptr past the end.
template <int D, typename RowAt>
__device__ __forceinline__ void store_grad_rows(const float (&acc)[D / 8][4], float scale, GradMode mode, int lane,
                                                RowAt row_at) {
  const int col = (lane & 3) * 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float* row = row_at((lane >> 2) + 8 * half);
    if (row == nullptr) continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = acc[n][half * 2 + e] * scale;
        float* dst = row + n * 8 + col + e;
        *dst = mode == GradMode::Accumulate ? *dst + x : x;
      }
    }
  }
}

// ---- key kernel ----

// What the key kernel keeps per thread across its loop.
template <int D>
struct KeyAcc {
  float dk[D / 8][4], dv[D / 8][4];
};

// The visible query columns [lo, hi] (relative to query row q0, clamped to [0, kBQ]) of key j
// under the mask; none when j >= S.
struct ColRange {
  int lo, hi;
};
__device__ __forceinline__ ColRange visible_cols(const MaskSpec& m, int64_t j, int64_t S, int64_t q0) {
  if (j >= S) return {kBQ, -1};
  // The rows that see key j (core/mask.hpp), bounded by the block's end: rows past it do not matter.
  const KeyRange rows = visible_rows(m, j, q0 + kBQ);
  return {clamp_int(rows.begin - q0, 0, kBQ), clamp_int(rows.end - 1 - q0, -1, kBQ - 1)};
}

// P^T and dS^T of one sub-step: s (S^T) becomes P^T and dp (dP^T) becomes dS^T, for this thread's
// keys (rows g and g + 8 of the warp's 16) and query columns q_col0 + 8n + 2t + e of the block.
// sLse / sDelta are the block's per-row lse (log2 units, +inf for no P) and D.
template <int kQN>
__device__ __forceinline__ void keys_probs_grads(float (&s)[kQN / 8][4], float (&dp)[kQN / 8][4], const float* sLse,
                                                 const float* sDelta, int q_col0, bool need_mask,
                                                 const ColRange (&cols)[2], float scale_log2, int lane) {
#pragma unroll
  for (int n = 0; n < kQN / 8; ++n) {
    const int c = q_col0 + n * 8 + (lane & 3) * 2;
    const float2 lse = *reinterpret_cast<const float2*>(sLse + c);
    const float2 del = *reinterpret_cast<const float2*>(sDelta + c);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float pr = fast_exp2(fmaf(s[n][half * 2 + e], scale_log2, -(e ? lse.y : lse.x)));
        if (need_mask && (c + e < cols[half].lo || c + e > cols[half].hi)) pr = 0.f;
        s[n][half * 2 + e] = pr;
        dp[n][half * 2 + e] = pr * (dp[n][half * 2 + e] - (e ? del.y : del.x));
      }
    }
  }
}

// Stores this warp's dS^T (16 keys x kQN queries from q_col0) into the shared dS^T tile
// (kBK x kBQ, swizzled), rounded to T; zeros when `zero` (a sub-step the warp skipped).
template <typename T, int kQN>
__device__ __forceinline__ void store_ds(T* sdS, const float (&ds)[kQN / 8][4], int key_row0, int q_col0, int lane,
                                         bool zero) {
  using H = Half16<T>;
  using DsTile = SwizzledTile<kBQ>;
#pragma unroll
  for (int n = 0; n < kQN / 8; ++n) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = key_row0 + (lane >> 2) + 8 * half;
      const uint32_t v = zero ? 0u : H::pack(ds[n][half * 2], ds[n][half * 2 + 1]);
      *reinterpret_cast<uint32_t*>(sdS + DsTile::offset(row, (q_col0 + n * 8) / 8) + (lane & 3) * 2) = v;
    }
  }
}

// Shared-memory tiles of the key kernel (byte addresses for ldmatrix, pointers for the rest).
template <typename T, int D>
struct KeySmem {
  T *k, *v, *q, *dout, *ds;  // q, dout: [2][kBQ][D]
  float *lse, *delta;        // [2][kBQ]
  __device__ __forceinline__ KeySmem(unsigned char* raw, bool atomic_dq) {
    k = reinterpret_cast<T*>(raw);
    v = k + kBK * D;
    q = v + kBK * D;
    dout = q + 2 * kBQ * D;
    ds = dout + 2 * kBQ * D;
    lse = reinterpret_cast<float*>(ds + (atomic_dq ? kBK * kBQ : 0));
    delta = lse + 2 * kBQ;
  }
};

// Lane offsets of the ldmatrix patterns (header comment). ds: this lane's byte offset in the dS^T
// tile for warp w's query columns 16w..16w+15 at key rows 0..15 (add kk * 16 rows for k-step kk).
struct LaneOffsets {
  uint32_t a[4], b[4], t[4], ds;
  template <int D>
  __device__ __forceinline__ void init(int lane, int warp) {
    const int mi = lane >> 3;
    SwizzledTile<D>::lane_offsets(a, lane & 15, lane >> 4, lane);
    SwizzledTile<D>::lane_offsets(b, (mi >> 1) * 8 + (lane & 7), mi & 1, lane);
    SwizzledTile<D>::lane_offsets(t, (mi & 1) * 8 + (lane & 7), mi >> 1, lane);
    ds = uint32_t(SwizzledTile<kBQ>::offset((mi >> 1) * 8 + (lane & 7), 2 * warp + (mi & 1))) * 2u;
  }
};

// One query block against the warp's keys: per sub-step of kQN queries S^T, dP^T, P^T, dS^T, then
// dV += P^T dout and dK += dS^T Q; with kAtomicDq the dS^T goes to shared memory (zeros for the
// sub-steps the warp skips).
template <typename T, int D, bool kAtomicDq>
__device__ __forceinline__ void keys_block_step(KeyAcc<D>& acc, const KeySmem<T, D>& sm, int buf, const LaneOffsets& lo,
                                                const MaskSpec& mask, int64_t i0, int64_t Tq, int64_t S,
                                                int64_t warp_j0, float scale_log2, int warp, int lane) {
  constexpr int kQN = BwdShape<D>::kQN;
  const uint32_t sK = smem_addr(sm.k), sV = smem_addr(sm.v);
  const uint32_t sQ = smem_addr(sm.q + buf * kBQ * D), sO = smem_addr(sm.dout + buf * kBQ * D);
  const float* sLse = sm.lse + buf * kBQ;
  const float* sDelta = sm.delta + buf * kBQ;
  const int64_t warp_keys = min64(16, S - warp_j0);
  ColRange cols[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) cols[half] = visible_cols(mask, warp_j0 + (lane >> 2) + 8 * half, S, i0);
#pragma unroll 1
  for (int qs = 0; qs < kBQ; qs += kQN) {
    // Warp-uniform: the sub-step's rows that exist against the warp's keys that exist.
    const BlockVisibility vis = classify_block(mask, i0 + qs, min64(kQN, Tq - i0 - qs), warp_j0, warp_keys);
    float s[kQN / 8][4], dp[kQN / 8][4];
    if (vis == BlockVisibility::Empty) {
      if (kAtomicDq) store_ds<T, kQN>(sm.ds, dp, warp * 16, qs, lane, true);
      continue;
    }
    const bool need_mask = vis != BlockVisibility::Full || warp_keys < 16;
    warp_gemm_abt<T, D, kQN>(s, sK, warp * 16, sQ, qs, lo.a, lo.b);
    warp_gemm_abt<T, D, kQN>(dp, sV, warp * 16, sO, qs, lo.a, lo.b);
    keys_probs_grads<kQN>(s, dp, sLse, sDelta, qs, need_mask, cols, scale_log2, lane);
    if (kAtomicDq) store_ds<T, kQN>(sm.ds, dp, warp * 16, qs, lane, false);
    warp_gemm_xb<T, D, kQN>(acc.dv, s, sO, qs, lo.t);
    warp_gemm_xb<T, D, kQN>(acc.dk, dp, sQ, qs, lo.t);
  }
}

// Fast mode's dq step: warp w takes query rows 16w..16w+15 of the block, dQ = dS K from the shared
// dS^T and K tiles, 16 columns of D at a time, and adds scale * dQ to dq with atomics. dq_row(r)
// is row r's dq pointer (nullptr past q_len).
template <typename T, int D, typename RowAt>
__device__ __forceinline__ void keys_dq_atomic(const KeySmem<T, D>& sm, const LaneOffsets& lo, float scale, int lane,
                                               RowAt dq_row) {
  using H = Half16<T>;
  using Tile = SwizzledTile<D>;
  const uint32_t sK = smem_addr(sm.k), sdS = smem_addr(sm.ds);
  uint32_t a[kBK / 16][4];
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk)
    ldmatrix_x4_trans(a[kk], sdS + lo.ds + kk * 16 * kBQ * 2);
  float* rows[2] = {dq_row((lane >> 2)), dq_row((lane >> 2) + 8)};
  const int col = (lane & 3) * 2;
#pragma unroll
  for (int dn = 0; dn < D / 16; ++dn) {
    float c[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sK + Tile::fragment_offset(lo.t, kk * 16, dn));
      H::mma(c[0], a[kk], b[0], b[1]);
      H::mma(c[1], a[kk], b[2], b[3]);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (rows[half] == nullptr) continue;
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = c[x][half * 2 + e];
          if (v != 0.f) atomicAdd(rows[half] + dn * 16 + x * 8 + col + e, v * scale);
        }
    }
  }
}

// Loads query block `it` (head h, rows [i0, i0 + kBQ)) into buffer buf: Q and dout by cp.async
// (one commit group), lse and D by plain loads (threads 0..kBQ-1).
template <typename T, int D>
__device__ __forceinline__ void keys_load_block(const KeySmem<T, D>& sm, int buf, const BackwardParams& p,
                                                const float* delta, int64_t b, int64_t h, int64_t i0, int tid) {
  const int64_t Tq = p.q.len;
  const T* q_base = static_cast<const T*>(p.q.data) + b * p.q.stride_b + h * p.q.stride_h;
  const T* o_base = static_cast<const T*>(p.dout.data) + b * p.dout.stride_b + h * p.dout.stride_h;
  load_tile_async<D, kBQ, kThreads>(sm.q + buf * kBQ * D, q_base, p.q.stride_t, i0, Tq, tid);
  load_tile_async<D, kBQ, kThreads>(sm.dout + buf * kBQ * D, o_base, p.dout.stride_t, i0, Tq, tid);
  cp_async_commit();
  if (tid < kBQ) {
    const int64_t i = i0 + tid;
    sm.lse[buf * kBQ + tid] = lse_log2_of(p.lse.row(b, h), i, Tq);
    sm.delta[buf * kBQ + tid] = i < Tq ? delta[(b * p.q.heads + h) * Tq + i] : 0.f;
  }
}

// dk and dv of kBK keys of one (b, kv head) (and, kAtomicDq, dq's share of them);
// grid (B * Hkv, ceil(S / kBK)).
template <typename T, int D, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads) bwd_keys_mma_kernel(const BackwardParams p, const float* delta,
                                                                 const BackwardGate gate) {
  if (gate_shut(gate)) return;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const KeySmem<T, D> sm(smem_raw, kAtomicDq);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t b = blockIdx.x / p.k.heads, hk = blockIdx.x % p.k.heads;
  const int64_t S = p.k.len, Tq = p.q.len, group = p.q.heads / p.k.heads;
  // Causal: the first key blocks see the most rows, so they go first (grid y in order); the lower
  // edge alone makes the last ones the heaviest (reversed).
  const bool reversed = p.mask.windowed() && !p.mask.causal;
  const int64_t j0 = int64_t(reversed ? gridDim.y - 1 - blockIdx.y : blockIdx.y) * kBK;
  const int64_t cta_keys = min64(kBK, S - j0);
  const int64_t warp_j0 = j0 + warp * 16;

  // The (query head, query block) pairs whose rows may see the keys: heads hk * group .. h_end - 1,
  // and per head the blocks of kBQ rows from rows.begin, walked by a cursor (h, i0).
  const KeyRange rows = visible_rows_of_keys(p.mask, j0, cta_keys, Tq);
  const int64_t h_end = rows.empty() ? hk * group : (hk + 1) * group;
  int64_t h = hk * group, i0 = rows.begin;
  auto advance = [&rows](int64_t& hn, int64_t& in) {
    in += kBQ;
    if (in >= rows.end) in = rows.begin, ++hn;
  };
  if (h < h_end) {  // K and V, committed with the first query block's group
    load_tile_async<D, kBK, kThreads>(sm.k, static_cast<const T*>(p.k.data) + b * p.k.stride_b + hk * p.k.stride_h,
                                      p.k.stride_t, j0, S, tid);
    load_tile_async<D, kBK, kThreads>(sm.v, static_cast<const T*>(p.v.data) + b * p.v.stride_b + hk * p.v.stride_h,
                                      p.v.stride_t, j0, S, tid);
    keys_load_block<T, D>(sm, 0, p, delta, b, h, i0, tid);
  }

  LaneOffsets lo;
  lo.init<D>(lane, warp);
  const float scale_log2 = p.scale * kLog2e;
  KeyAcc<D> acc;
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc.dk[n][e] = acc.dv[n][e] = 0.f;

  for (int buf = 0; h < h_end; buf ^= 1) {
    int64_t h_next = h, i_next = i0;
    advance(h_next, i_next);
    cp_async_wait<0>();  // this block (and, the first time, K and V) has landed
    __syncthreads();     // ... for every thread; and every warp is done with the previous block
    if (h_next < h_end) keys_load_block<T, D>(sm, buf ^ 1, p, delta, b, h_next, i_next, tid);
    keys_block_step<T, D, kAtomicDq>(acc, sm, buf, lo, p.mask, i0, Tq, S, warp_j0, scale_log2, warp, lane);
    if constexpr (kAtomicDq) {
      __syncthreads();  // the dS^T tile is complete
      const int64_t r0 = i0 + warp * 16;
      if (classify_block(p.mask, r0, min64(16, Tq - r0), j0, cta_keys) != BlockVisibility::Empty) {
        keys_dq_atomic<T, D>(sm, lo, p.scale, lane, [&](int r) -> float* {
          return r0 + r < Tq ? grad_row(p.dq, b, h, r0 + r) : nullptr;
        });
      }
    }
    h = h_next, i0 = i_next;
  }

  auto key_row = [&](const TensorView& g) {
    return [&g, b, hk, warp_j0, S](int r) -> float* {
      return warp_j0 + r < S ? grad_row(g, b, hk, warp_j0 + r) : nullptr;
    };
  };
  store_grad_rows<D>(acc.dk, p.scale, p.mode, lane, key_row(p.dk));
  store_grad_rows<D>(acc.dv, 1.f, p.mode, lane, key_row(p.dv));
}

// ---- query kernel (deterministic dq) ----

// P and dS of this warp's 16 rows against one key tile starting at key j0: s (S) becomes P and dp
// (dP) becomes dS. Row half (g + 8 half) has lse_log2[half] and delta[half]; a masked tile keeps
// each row's keys [visible_range) (kv_len included).
template <int kNT>
__device__ __forceinline__ void rows_probs_grads(float (&s)[kNT][4], float (&dp)[kNT][4], const float (&lse_log2)[2],
                                                 const float (&del)[2], bool need_mask, const MaskSpec& mask,
                                                 int64_t w_row0, int64_t j0, int64_t S, float scale_log2, int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    int key_begin = 0, key_end = kNT * 8;
    if (need_mask) {
      const KeyRange r = visible_range(mask, w_row0 + (lane >> 2) + 8 * half, S);
      key_begin = tile_key_bound(r.begin, j0, kNT * 8);
      key_end = tile_key_bound(r.end, j0, kNT * 8);
    }
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = n * 8 + (lane & 3) * 2 + e;
        float pr = fast_exp2(fmaf(s[n][half * 2 + e], scale_log2, -lse_log2[half]));
        if (need_mask && (key < key_begin || key >= key_end)) pr = 0.f;
        s[n][half * 2 + e] = pr;
        dp[n][half * 2 + e] = pr * (dp[n][half * 2 + e] - del[half]);
      }
    }
  }
}

// dq of kBQ query rows of one (b, query head), summed over the visible key tiles in order;
// grid (B * Hq, ceil(T / kBQ)).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) bwd_dq_mma_kernel(const BackwardParams p, const float* delta,
                                                               const BackwardGate gate) {
  if (gate_shut(gate)) return;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sO = sQ + kBQ * D;
  T* sK = sO + kBQ * D;      // [2][kBK][D]
  T* sV = sK + 2 * kBK * D;  // [2][kBK][D]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t Tq = p.q.len, S = p.k.len;
  const int64_t b = blockIdx.x / p.q.heads, h = blockIdx.x % p.q.heads, hk = h / (p.q.heads / p.k.heads);
  // As the forward: causal makes the last query blocks the heaviest (reversed), the lower edge
  // alone the first ones.
  const int64_t i0 = int64_t(p.mask.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y) * kBQ;
  const T* k_base = static_cast<const T*>(p.k.data) + b * p.k.stride_b + hk * p.k.stride_h;
  const T* v_base = static_cast<const T*>(p.v.data) + b * p.v.stride_b + hk * p.v.stride_h;

  const KeyRange keys = visible_range_of_rows(p.mask, i0, min64(kBQ, Tq - i0), S);
  const int n_tiles = keys.empty() ? 0 : int((keys.end + kBK - 1) / kBK);
  const int j_begin = keys.empty() ? 0 : int(keys.begin / kBK);
  auto load_kv = [&](int j) {
    const int bufo = (j & 1) * kBK * D;
    load_tile_async<D, kBK, kThreads>(sK + bufo, k_base, p.k.stride_t, int64_t(j) * kBK, S, tid);
    load_tile_async<D, kBK, kThreads>(sV + bufo, v_base, p.v.stride_t, int64_t(j) * kBK, S, tid);
  };
  if (n_tiles > j_begin) {
    load_tile_async<D, kBQ, kThreads>(sQ, static_cast<const T*>(p.q.data) + b * p.q.stride_b + h * p.q.stride_h,
                                      p.q.stride_t, i0, Tq, tid);
    load_tile_async<D, kBQ, kThreads>(sO, static_cast<const T*>(p.dout.data) + b * p.dout.stride_b + h * p.dout.stride_h,
                                      p.dout.stride_t, i0, Tq, tid);
    load_kv(j_begin);
  }
  cp_async_commit();

  const int64_t w_row0 = i0 + warp * 16;
  const int64_t w_rows = min64(16, Tq - w_row0);  // <= 0: the warp has no row
  float lse_log2[2], del[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = w_row0 + (lane >> 2) + 8 * half;
    lse_log2[half] = lse_log2_of(p.lse.row(b, h), i, Tq);
    del[half] = i < Tq ? delta[(b * p.q.heads + h) * Tq + i] : 0.f;
  }
  LaneOffsets lo;
  lo.init<D>(lane, warp);
  const uint32_t sQa = smem_addr(sQ), sOa = smem_addr(sO), sKa = smem_addr(sK), sVa = smem_addr(sV);
  const float scale_log2 = p.scale * kLog2e;
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;

  for (int j = j_begin; j < n_tiles; ++j) {
    const int64_t j0 = int64_t(j) * kBK;
    cp_async_wait<0>();  // tile j (and, the first time, Q and dout) has landed
    __syncthreads();     // ... for every thread; and every warp is done with tile j - 1
    if (j + 1 < n_tiles) load_kv(j + 1);
    cp_async_commit();
    const BlockVisibility vis = classify_block(p.mask, w_row0, w_rows, j0, min64(kBK, S - j0));
    if (vis == BlockVisibility::Empty) continue;
    const bool need_mask = vis != BlockVisibility::Full || j0 + kBK > S;
    const uint32_t kt = sKa + (j & 1) * kBK * D * 2, vt = sVa + (j & 1) * kBK * D * 2;
    float s[kBK / 8][4], dp[kBK / 8][4];
    warp_gemm_abt<T, D, kBK>(s, sQa, warp * 16, kt, 0, lo.a, lo.b);
    warp_gemm_abt<T, D, kBK>(dp, sOa, warp * 16, vt, 0, lo.a, lo.b);
    rows_probs_grads<kBK / 8>(s, dp, lse_log2, del, need_mask, p.mask, w_row0, j0, S, scale_log2, lane);
    warp_gemm_xb<T, D, kBK>(dq, dp, kt, 0, lo.t);
  }
  cp_async_wait<0>();
  store_grad_rows<D>(dq, p.scale, p.mode, lane, [&](int r) -> float* {
    return w_row0 + r < Tq ? grad_row(p.dq, b, h, w_row0 + r) : nullptr;
  });
}

// ---- launch ----

template <typename T, int D>
void launch_typed(const BackwardParams& p, bool atomic_dq, const float* delta, cudaStream_t stream,
                  const BackwardGate& gate) {
  using Shape = BwdShape<D>;
  const dim3 keys_grid(unsigned(p.k.batch * p.k.heads), unsigned((p.k.len + kBK - 1) / kBK));
  const size_t keys_smem = Shape::keys_smem(sizeof(T), atomic_dq);
  if (atomic_dq) {
    if (p.mode == GradMode::Write) launch_zero_f32(p.dq, stream);
    auto kernel = bwd_keys_mma_kernel<T, D, true>;
    static std::atomic<uint64_t> configured{0};
    set_dynamic_smem_once(kernel, int(keys_smem), configured);
    kernel<<<keys_grid, kThreads, keys_smem, stream>>>(p, delta, gate);
    RA_CHECK_CUDA_LAUNCH("bwd_keys_mma_kernel");
    return;
  }
  auto keys_kernel = bwd_keys_mma_kernel<T, D, false>;
  static std::atomic<uint64_t> keys_configured{0};
  set_dynamic_smem_once(keys_kernel, int(keys_smem), keys_configured);
  keys_kernel<<<keys_grid, kThreads, keys_smem, stream>>>(p, delta, gate);
  RA_CHECK_CUDA_LAUNCH("bwd_keys_mma_kernel");
  auto dq_kernel = bwd_dq_mma_kernel<T, D>;
  static std::atomic<uint64_t> dq_configured{0};
  const size_t dq_smem = Shape::dq_smem(sizeof(T));
  set_dynamic_smem_once(dq_kernel, int(dq_smem), dq_configured);
  const dim3 dq_grid(unsigned(p.q.batch * p.q.heads), unsigned((p.q.len + kBQ - 1) / kBQ));
  dq_kernel<<<dq_grid, kThreads, dq_smem, stream>>>(p, delta, gate);
  RA_CHECK_CUDA_LAUNCH("bwd_dq_mma_kernel");
}

template <typename T>
void launch_dim(const BackwardParams& p, bool atomic_dq, const float* delta, cudaStream_t stream,
                const BackwardGate& gate) {
  switch (p.q.dim) {
    case 64: return launch_typed<T, 64>(p, atomic_dq, delta, stream, gate);
    case 128: return launch_typed<T, 128>(p, atomic_dq, delta, stream, gate);
    default: fail_no_instance("launch_backward_mma", "head_dim", p.q.dim, "64 and 128");
  }
}

}  // namespace

size_t backward_mma_smem_bytes(int64_t head_dim, bool atomic_dq) {
  auto larger = [](size_t a, size_t b) { return a > b ? a : b; };
  switch (head_dim) {
    case 64: return larger(BwdShape<64>::keys_smem(2, atomic_dq), atomic_dq ? 0 : BwdShape<64>::dq_smem(2));
    case 128: return larger(BwdShape<128>::keys_smem(2, atomic_dq), atomic_dq ? 0 : BwdShape<128>::dq_smem(2));
    default: fail_no_instance("backward_mma_smem_bytes", "head_dim", head_dim, "64 and 128");
  }
}

void launch_backward_mma(const BackwardParams& p, bool atomic_dq, float* delta, cudaStream_t stream,
                         BackwardGate gate) {
  switch (p.q.dtype) {
    case DType::BF16: return launch_dim<__nv_bfloat16>(p, atomic_dq, delta, stream, gate);
    case DType::F16: return launch_dim<__half>(p, atomic_dq, delta, stream, gate);
    default: fail_no_instance("launch_backward_mma", "dtype", int(p.q.dtype), "bf16 and fp16");
  }
}

}  // namespace ringattn::cuda
