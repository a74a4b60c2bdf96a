// Split-KV decode (flash-decoding) on tensor cores, bf16/fp16, head dims 64, 128 and 256.
//
// Decode is bound by reading K and V once, so the kernel is shaped for bandwidth:
// - GQA packing: the G = q_heads / kv_heads query heads of one KV head and the q_len rows are
//   packed as the 16 rows of one m16 tile, so every K/V byte loaded serves all of them.
// - Split KV: the grid is (split, batch x KV head, row block), sized so that every
//   multiprocessor holds CTAs even at batch 1 with 8 KV heads. The keys some row sees are cut into
//   64-key tiles dealt round robin: split s of S takes tiles s, s + S, s + 2S, ..., so that at any
//   moment the splits of a head read neighbouring tiles (one region of K and V in DRAM rather than
//   one stream per split).
// - 16 packed rows at head dims 64 and 128 (decode_phased_kernel): 128-key tiles whose K and V
//   halves go through a cp.async ring of half-tile buffers: three on short splits, K_{j+1} issued
//   while Q K_j^T runs and V_{j+1} while P V_j runs (two halves in flight, 2 CTAs per SM at 128:
//   cuDNN's decode has this shape), two on long ones (one half in flight, 3 CTAs per SM). Each of
//   the 4 warps takes its own 32 keys of every tile and keeps its own (m, l, acc); the warps
//   combine through shared memory at the end, and the partials of all splits are combined by the
//   merge-splits kernel (merge.cu), launched programmatically after this one (Hopper: its launch
//   overlaps this kernel's tail).
// - Head dim 256 (decode_mma_kernel): 64-key tiles in a ring of 3 K+V stages, 16 keys a warp.
// - Wide row blocks (decode_mma_kernel with kWide, 64 packed rows or more: speculative decoding,
//   several query tokens per head group): a CTA takes 64 packed rows, each warp its own 16 over
//   all 64 keys of every 64-key tile (2 K+V stages), so the K/V a CTA loads serves 4x the rows
//   (four 16-row CTAs would each load it); each warp writes its rows' partial itself, with no
//   combine.
// - Every kernel works out its tiles and mask edges from its parameters before its programmatic
//   wait, so its first loads leave as soon as the kernel ahead has completed.
#include <atomic>
#include <utility>
#include <type_traits>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/exact_row.cuh"
#include "kernels/cuda/online_softmax.cuh"

namespace ringattn::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kTileKeys = 16 * kWarps;  // decode_mma_kernel: 16 keys per warp per tile (narrow)
// Stages of decode_mma_kernel's K/V ring. Two (double buffering) for the wide row blocks at head
// dims 64 and 128 (80 KB at 128: 2 CTAs per SM). At 256 a single CTA fits per SM with either (2
// stages 136 KB, 3 stages 200 KB; 227 KB per block), so three: two 64 KB tiles in flight per SM
// instead of one.
template <int D>
constexpr int decode_stages() {
  return D == 256 ? 3 : 2;
}

// Packed query rows per CTA: 16, or 64 in the wide variant (a 16-row block per warp).
template <bool kWide>
constexpr int decode_rows() {
  return kWide ? 16 * kWarps : 16;
}
// Wide row blocks at head dims 64 and 128 (at 256 the narrow kernel's one CTA per SM already
// leaves no room for 64 rows of Q beside three stages).
constexpr bool decode_wide_supported(int dim) { return dim <= 128; }

template <int D, bool kWide = false>
constexpr size_t decode_smem_bytes() {
  return size_t(decode_rows<kWide>() * D + 2 * decode_stages<D>() * kTileKeys * D) * 2;
}
static_assert(decode_smem_bytes<256>() <= 227 * 1024, "the largest instantiation fits a block on sm_90");
static_assert(decode_smem_bytes<128, true>() <= 99 * 1024, "the wide instantiations fit a block on sm_86/89 too");

struct DecodeKernelParams {
  FlashParams f;
  SplitPartials out;
  int64_t key0;   // the first key any row sees: band tile i covers keys key0 + tile keys * i ..
  int64_t tiles;  // band tiles, dealt to the gridDim.x splits round robin
};

// Packed row R is query head hk * group + R % group at position R / group. The backend checks
// that the row blocks fit the grid (at most 65535 x 64 packed rows), so R and group fit 32 bits,
// whose division is several times cheaper than a 64-bit one.
struct PackedRow {
  int t, g;  // position, query head within the KV head's group
};
__device__ __forceinline__ PackedRow packed_row(int64_t R, int64_t group) {
  const int r = int(R), gr = int(group), t = r / gr;
  return {t, r - t * gr};
}

// Queues the copy of the CTA's ROWS packed query rows into sQ (zeros past the last one).
template <typename T, int D, int ROWS>
__device__ __forceinline__ void load_packed_q(T* sQ, const FlashParams& f, int64_t b, int64_t hk, int64_t group,
                                              int64_t packed_rows, int64_t row0, int tid) {
  using Tile = SwizzledTile<D>;
  for (int i = tid; i < ROWS * (D / 8); i += kThreads) {
    const int r = i / (D / 8), c = i % (D / 8);
    const int64_t R = row0 + r;
    const bool valid = R < packed_rows;
    const PackedRow pr = packed_row(valid ? R : 0, group);
    const T* src = static_cast<const T*>(f.q.data) + b * f.q.stride_b + (hk * group + pr.g) * f.q.stride_h +
                   int64_t(pr.t) * f.q.stride_t + c * 8;
    cp_async_16(sQ + Tile::offset(r, c), src, valid);
  }
}

// The band tiles a CTA streams: tiles split + j * S (S = gridDim.x) of kKeys keys for j in [j0,
// j0 + n_tiles), those that meet the keys its rows see (positions t_first..t_last: both edges of
// the mask at the block's positions). Keys of those tiles at or past c1 are zero-filled, those
// before the block's first key are masked. From the kernel's parameters alone (no memory read),
// so the kernels work it out before their programmatic wait.
struct BlockTiles {
  int64_t j0 = 0, c1 = 0;
  int n_tiles = 0;
};
template <int kKeys>
__device__ __forceinline__ BlockTiles block_tiles(const DecodeKernelParams& a, int64_t split, int64_t t_first,
                                                  int64_t t_last) {
  const KeyRange keys = visible_range_of_rows(a.f.mask, t_first, t_last - t_first + 1, a.f.k.len);
  BlockTiles bt;
  bt.c1 = keys.end;
  if (keys.empty()) return bt;
  const int64_t S = gridDim.x;
  const int64_t tb = (keys.begin - a.key0) / kKeys;  // band tiles [tb, te) meet the block's keys
  int64_t te = (keys.end - a.key0 + kKeys - 1) / kKeys;
  te = te < a.tiles ? te : a.tiles;
  bt.j0 = split >= tb ? 0 : (tb - split + S - 1) / S;
  const int64_t j_end = split >= te ? 0 : (te - split + S - 1) / S;  // own tiles before te
  bt.n_tiles = j_end > bt.j0 ? int(j_end - bt.j0) : 0;
  return bt;
}

// The slow path of a packed row whose partial is not finite (exact_row.cuh): packed row R's
// partial over the split's own tiles (bt, tiles of kKeys keys), recomputed exactly over the keys
// its position sees, and written in place of the fast one. Called by a whole warp.
template <typename T, int D, int kKeys>
__device__ __forceinline__ void redo_partial(const DecodeKernelParams& a, const BlockTiles& bt, int64_t split, int64_t b,
                                             int64_t hk, int64_t group, int64_t R) {
  const FlashParams& f = a.f;
  const PackedRow pr = packed_row(R, group);
  const int64_t h = hk * group + pr.g, row = (b * f.q.heads + h) * f.q.len + pr.t, S = gridDim.x;
  const SplitPartials& out = a.out;
  redo_row_tiles<T, D / 32>(static_cast<const T*>(f.q.data) + view_offset(f.q, b, h, pr.t),
                            static_cast<const T*>(f.k.data) + view_offset(f.k, b, hk, 0), f.k.stride_t,
                            static_cast<const T*>(f.v.data) + view_offset(f.v, b, hk, 0), f.v.stride_t, D, f.scale,
                            visible_range(f.mask, pr.t, f.k.len), a.key0 + (split + bt.j0 * S) * kKeys, S * kKeys,
                            kKeys, bt.n_tiles, out.o + (split * out.rows + row) * out.dim, out.lse + split * out.rows + row);
}

// Whether a written partial (its lse, and o element x) is not finite: an lse of -inf is the empty
// partial.
__device__ __forceinline__ bool partial_not_finite(float lse, float x) {
  return not_finite(x) || (not_finite(lse) && lse != neg_inf());
}

// The 4 warps saw disjoint keys of the same rows: combines their (m, l, acc) through shared
// memory (`scratch`, the K stages, free once every warp is past the key loop) so that each
// split writes one partial per row (the merge then reads 4x less).
template <typename T, int D, int kKeys>
__device__ __forceinline__ void combine_warps(const DecodeKernelParams& a, const BlockTiles& bt, float* scratch, int tid,
                                              int warp, int lane, int64_t group, int64_t len_q, int64_t packed_rows,
                                              int64_t row0, int64_t split, int64_t b, int64_t hk, const float (&m)[2],
                                              const float (&l)[2], const float (&acc)[D / 8][4]) {
  constexpr int kDT = D / 8;
  const FlashParams& f = a.f;
  constexpr int kLd = D + 4;  // padded rows: the quads' stores spread over the banks
  // The K stages and the V stages after them (decode_mma_kernel's sK, sV) are one region.
  static_assert(sizeof(float) * (kWarps * 16 * (kLd + 2)) <= sizeof(T) * 2 * decode_stages<D>() * kTileKeys * D,
                "the combine scratch fits in the K and V stages");
  float* red_acc = scratch;                          // [kWarps][16][kLd], unnormalized
  float* red_m = red_acc + kWarps * 16 * kLd;       // [kWarps][16], log2 units
  float* red_l = red_m + kWarps * 16;               // [kWarps][16]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = (lane >> 2) + half * 8;
    const float sum = quad_sum(l[half]);
    if ((lane & 3) == 0) {
      red_m[warp * 16 + r] = m[half];
      red_l[warp * 16 + r] = sum;
    }
    float* dst = red_acc + (warp * 16 + r) * kLd + (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
      dst[n * 8] = acc[n][half * 2];
      dst[n * 8 + 1] = acc[n][half * 2 + 1];
    }
  }
  __syncthreads();

  const SplitPartials& out = a.out;
  // Only the block's packed rows (4 of the 16 at batch-1 decode with 4 query heads a group).
  const int valid_rows = packed_rows - row0 < 16 ? int(packed_rows - row0) : 16;
  bool bad = false;
  for (int i = tid; i < valid_rows * D; i += kThreads) {
    const int r = i / D, d = i % D;
    const PackedRow pr = packed_row(row0 + r, group);
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_m[w * 16 + r]);
    float total_l = 0.f, total_o = 0.f;
    if (mx != neg_inf()) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float mw = red_m[w * 16 + r];
        const float c = rescale_factor(mw, mx, FastExp2{});
        total_l += c * red_l[w * 16 + r];
        total_o += c * red_acc[(w * 16 + r) * kLd + d];
      }
    }
    const int64_t row = (b * f.q.heads + hk * group + pr.g) * len_q + pr.t;
    const float x = total_l == 0.f ? 0.f : total_o / total_l;  // NaN stays NaN
    bad |= not_finite(x) || not_finite(total_l);
    out.o[(split * out.rows + row) * out.dim + d] = x;
    if (d == 0) out.lse[split * out.rows + row] = lse_from_stats_log2(mx, total_l);
  }
  // Rows whose partial is not finite (a non-finite key or value, seen or masked): each warp
  // rereads its rows' partials (written above by the block) and recomputes the bad ones.
  if (__syncthreads_or(bad)) {
    for (int r = warp; r < valid_rows; r += kWarps) {
      const PackedRow pr = packed_row(row0 + r, group);
      const int64_t row = (b * f.q.heads + hk * group + pr.g) * len_q + pr.t;
      const float lse = out.lse[split * out.rows + row];
      bool row_bad = false;
      for (int d = lane; d < D; d += 32) row_bad |= partial_not_finite(lse, out.o[(split * out.rows + row) * out.dim + d]);
      if (__any_sync(0xffffffffu, row_bad)) redo_partial<T, D, kKeys>(a, bt, split, b, hk, group, row0 + r);
    }
  }
}

// The wide variant's end: each warp owns its 16 rows over all of the split's keys, so it writes
// their partial itself (o normalized, lse; rows past the last packed row are not written).
template <typename T, int D>
__device__ __forceinline__ void store_warp_rows(const DecodeKernelParams& a, const BlockTiles& bt, int lane, int64_t group,
                                                int64_t len_q, int64_t packed_rows, int64_t wrow0, int64_t split,
                                                int64_t b, int64_t hk, const float (&m)[2], const float (&l)[2],
                                                const float (&acc)[D / 8][4]) {
  const SplitPartials& out = a.out;
  bool bad[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float sum = quad_sum(l[half]);
    const int64_t R = wrow0 + (lane >> 2) + half * 8;
    bad[half] = quad_row_not_finite(acc, half, sum) && R < packed_rows;  // every lane takes the quad's shuffles
    if (R >= packed_rows || bad[half]) continue;
    const PackedRow pr = packed_row(R, group);
    const int64_t row = (b * a.f.q.heads + hk * group + pr.g) * len_q + pr.t;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    float* dst = out.o + (split * out.rows + row) * out.dim + (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(dst + n * 8) = make_float2(acc[n][half * 2] * inv, acc[n][half * 2 + 1] * inv);
    if ((lane & 3) == 0) out.lse[split * out.rows + row] = lse_from_stats_log2(m[half], sum);
  }
  // Rows whose partial is not finite: recomputed exactly (exact_row.cuh).
  for (unsigned rows = redo_mask(bad); rows != 0u; rows &= rows - 1u)
    redo_partial<T, D, kTileKeys>(a, bt, split, b, hk, group, wrow0 + __ffs(rows) - 1);
}

// The warp's scores of one tile: s = Q K^T for its 16 rows (Q fragments in registers, or
// reloaded from sQ at row wq when they do not fit) and its NT * 8 keys from key wk of the stage.
template <typename T, int D, int NT, bool kQInRegisters>
__device__ __forceinline__ void warp_scores(float (&s)[NT][4], const uint32_t (&qf)[D / 16][4], uint32_t sQa,
                                            const uint32_t (&q_off)[4], int wq, uint32_t kt,
                                            const uint32_t (&k_off)[4], int wk) {
  using H = Half16<T>;
  using Tile = SwizzledTile<D>;
#pragma unroll
  for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t q_reloaded[4];
    if constexpr (!kQInRegisters) ldmatrix_x4(q_reloaded, sQa + Tile::fragment_offset(q_off, wq, kk));
    const uint32_t(&reloaded)[4] = q_reloaded;
    const uint32_t(&qa)[4] = kQInRegisters ? qf[kk] : reloaded;
#pragma unroll
    for (int g = 0; g < NT / 2; ++g) {
      uint32_t bk[4];
      ldmatrix_x4(bk, kt + Tile::fragment_offset(k_off, wk + g * 16, kk));
      H::mma(s[2 * g], qa, bk[0], bk[1]);
      H::mma(s[2 * g + 1], qa, bk[2], bk[3]);
    }
  }
}

// acc += P V over the warp's NT * 8 keys from key wk of the stage (p = the softmax's s, packed to
// 16 bits 16 keys at a time: the A fragments of m16n8k16).
template <typename T, int D, int NT>
__device__ __forceinline__ void warp_pv(float (&acc)[D / 8][4], const float (&s)[NT][4], uint32_t vt,
                                        const uint32_t (&v_off)[4], int wk) {
  using H = Half16<T>;
  using Tile = SwizzledTile<D>;
#pragma unroll
  for (int g = 0; g < NT / 2; ++g) {
    const uint32_t pa[4] = {H::pack(s[2 * g][0], s[2 * g][1]), H::pack(s[2 * g][2], s[2 * g][3]),
                            H::pack(s[2 * g + 1][0], s[2 * g + 1][1]), H::pack(s[2 * g + 1][2], s[2 * g + 1][3])};
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t bv[4];
      ldmatrix_x4_trans(bv, vt + Tile::fragment_offset(v_off, wk + g * 16, dn));
      H::mma(acc[2 * dn], pa, bv[0], bv[1]);
      H::mma(acc[2 * dn + 1], pa, bv[2], bv[3]);
    }
  }
}

// The ldmatrix lane offsets (SwizzledTile::lane_offsets) of a warp's Q fragments (A of Q K^T), K
// fragments (B of Q K^T) and V fragments (B of P V, read transposed).
template <int D>
struct LaneFragments {
  uint32_t q[4], k[4], v[4];
  __device__ __forceinline__ explicit LaneFragments(int lane) {
    const int mi = lane >> 3;
    SwizzledTile<D>::lane_offsets(q, lane & 15, lane >> 4, lane);
    SwizzledTile<D>::lane_offsets(k, (mi >> 1) * 8 + (lane & 7), mi & 1, lane);
    SwizzledTile<D>::lane_offsets(v, (mi & 1) * 8 + (lane & 7), mi >> 1, lane);
  }
};

// A warp's rows before their first key: acc = 0, m = -inf, l = 0.
template <int kDT>
__device__ __forceinline__ void start_rows(float (&acc)[kDT][4], float (&m)[2], float (&l)[2]) {
#pragma unroll
  for (int n = 0; n < kDT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  m[0] = m[1] = neg_inf();
  l[0] = l[1] = 0.f;
}

// The online softmax over the warp's scores of one tile (its 16 rows from packed row wrow0, its
// kWarpKeys keys from key kw) and acc rescaled by it; the rows' visible keys within the warp's are
// found only where the mask is needed (rows past the end take the last position; they are never
// written).
template <int kNT, int kWarpKeys, int kDT>
__device__ __forceinline__ void warp_softmax_step(float (&s)[kNT][4], float (&acc)[kDT][4], float (&m)[2],
                                                  float (&l)[2], const MaskSpec& mask, bool need_mask, int64_t wrow0,
                                                  int64_t packed_rows, int64_t group, int64_t kw, int64_t c1,
                                                  float scale_log2, int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    int key_begin = 0, key_end = kWarpKeys;
    if (need_mask) {
      const int64_t R = wrow0 + (lane >> 2) + half * 8;
      const KeyRange r = visible_range(mask, packed_row(R < packed_rows ? R : packed_rows - 1, group).t, c1);
      key_begin = tile_key_bound(r.begin, kw, kWarpKeys);
      key_end = tile_key_bound(r.end, kw, kWarpKeys);
    }
    const float alpha = online_softmax_row<kNT, false, true>(s, half, lane, need_mask, key_begin, key_end, scale_log2,
                                                             m[half], l[half]);
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
      acc[n][half * 2] *= alpha;
      acc[n][half * 2 + 1] *= alpha;
    }
  }
}

template <typename T, int D, bool kWide>
__global__ void __launch_bounds__(kThreads) decode_mma_kernel(const DecodeKernelParams a) {
  static_assert(kWide || D == 256, "16-row blocks at head dims 64 and 128 run decode_phased_kernel");
  using Tile = SwizzledTile<D>;
  constexpr int kDT = D / 8;
  constexpr int kStages = decode_stages<D>();
  constexpr int kRows = decode_rows<kWide>();
  // Keys of a tile per warp: 16 (the warps split the keys) or all 64 (wide: the warps split the rows).
  constexpr int kWarpKeys = kWide ? kTileKeys : 16, kNT = kWarpKeys / 8;
  const FlashParams& f = a.f;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);      // [kRows][D]
  T* sK = sQ + kRows * D;                       // [kStages][kTileKeys][D]
  T* sV = sK + kStages * kTileKeys * D;         // [kStages][kTileKeys][D]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t group = f.q.heads / f.k.heads, len_q = f.q.len, len_k = f.k.len;
  const int64_t packed_rows = group * len_q;
  const int64_t split = blockIdx.x, b = blockIdx.y / f.k.heads, hk = blockIdx.y % f.k.heads;
  const int64_t row0 = int64_t(blockIdx.z) * kRows;  // first packed row (t * group + g)
  // This warp's rows and keys within the CTA's: all 16 rows and keys from warp * 16 of each tile,
  // or (wide) rows from warp * 16 and every key.
  const int wq = kWide ? warp * 16 : 0, wk = kWide ? 0 : warp * 16;
  const int64_t wrow0 = row0 + wq;

  const int64_t last = packed_rows - 1;
  const int64_t t_first = packed_row(row0, group).t;
  const int64_t t_last = packed_row(row0 + kRows - 1 < last ? row0 + kRows - 1 : last, group).t;
  const BlockTiles bt = block_tiles<kTileKeys>(a, split, t_first, t_last);
  const int n_tiles = bt.n_tiles;
  const int64_t c1 = bt.c1, S = gridDim.x;
  auto tile_key0 = [&](int j) { return a.key0 + (split + (bt.j0 + j) * S) * kTileKeys; };
  // Keys [full_lo, full_hi) are visible to every row of the warp: both edges of the visible range
  // grow with the row, so that is the last row's begin to the first row's end (classify_block's
  // Full test, found once). A warp's keys outside it need the element mask. A wide warp with no
  // row (past the last packed one) computes nothing.
  const bool warp_rows = wrow0 <= last;
  const int64_t w_first = packed_row(warp_rows ? wrow0 : last, group).t;
  const int64_t w_last = packed_row(wrow0 + 15 < last ? wrow0 + 15 : last, group).t;
  const int64_t full_lo = visible_range(f.mask, w_last, len_k).begin;
  const int64_t full_hi = visible_range(f.mask, w_first, len_k).end;

  // Launched programmatically (launch_instance): nothing global is touched before the kernel
  // ahead in the stream (the previous call's merge, say) has completed.
  pdl_wait_for_prior_grid();
  load_packed_q<T, D, kRows>(sQ, f, b, hk, group, packed_rows, row0, tid);

  const T* k_base = static_cast<const T*>(f.k.data) + b * f.k.stride_b + hk * f.k.stride_h;
  const T* v_base = static_cast<const T*>(f.v.data) + b * f.v.stride_b + hk * f.v.stride_h;
  auto load_stage = [&](int j) {
    const int buf = j % kStages;
    const int64_t k0 = tile_key0(j);
    load_tile_async<D, kTileKeys, kThreads>(sK + buf * kTileKeys * D, k_base, f.k.stride_t, k0, c1, tid);
    load_tile_async<D, kTileKeys, kThreads>(sV + buf * kTileKeys * D, v_base, f.v.stride_t, k0, c1, tid);
  };
  // Q travels in the first group together with tile 0.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles) load_stage(st);
    cp_async_commit();
  }

  const float scale_log2 = f.scale * kLog2e;
  // Q's fragments stay in registers up to head dim 128. At 256 they would be 64 registers beside
  // the 128 of acc, and ptxas spilled (255 registers); there each warp reloads them from sQ per
  // key tile instead (one more ldmatrix per k-step, from shared memory that is never overwritten).
  constexpr bool kQInRegisters = D <= 128;
  uint32_t qf[D / 16][4];
  float acc[kDT][4];
  float m[2], l[2];
  start_rows(acc, m, l);

  const LaneFragments<D> lf(lane);
  const uint32_t sQa = smem_addr(sQ), sKa = smem_addr(sK), sVa = smem_addr(sV);

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<kStages - 2>();  // tile j (and Q) have landed
    __syncthreads();
    if (kQInRegisters && j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], sQa + Tile::fragment_offset(lf.q, wq, kk));
    }
    // The buffer refilled here was read in iteration j - 1, which every warp has finished.
    if (j + kStages - 1 < n_tiles) load_stage(j + kStages - 1);
    cp_async_commit();

    const int buf = j % kStages;
    const uint32_t kt = sKa + buf * kTileKeys * D * 2;
    const uint32_t vt = sVa + buf * kTileKeys * D * 2;
    const int64_t kw = tile_key0(j) + wk;  // this warp's first key
    if (kw >= c1 || !warp_rows) continue;  // warp-uniform
    const bool need_mask = kw < full_lo || kw + kWarpKeys > full_hi;

    float s[kNT][4];
    warp_scores<T, D, kNT, kQInRegisters>(s, qf, sQa, lf.q, wq, kt, lf.k, wk);
    warp_softmax_step<kNT, kWarpKeys>(s, acc, m, l, f.mask, need_mask, wrow0, packed_rows, group, kw, c1, scale_log2,
                                      lane);
    warp_pv<T, D, kNT>(acc, s, vt, lf.v, wk);
  }
  // Past its key loop the CTA only combines and stores: merge_splits, launched programmatically
  // after this kernel, may be scheduled once every CTA is here (it waits for this grid's
  // completion before it reads a partial), so its launch overlaps the last CTAs' tails.
  pdl_allow_dependent_launch();
  cp_async_wait<0>();
  if constexpr (kWide) {
    store_warp_rows<T, D>(a, bt, lane, group, len_q, packed_rows, wrow0, split, b, hk, m, l, acc);
  } else {
    __syncthreads();  // every warp is done with the K/V tiles: their memory becomes the scratch
    combine_warps<T, D, kTileKeys>(a, bt, reinterpret_cast<float*>(sK), tid, warp, lane, group, len_q, packed_rows,
                                   row0, split, b, hk, m, l, acc);
  }
}

// ---- 16 packed rows at head dims 64 and 128: 128-key tiles, K and V in a ring of half-tiles ----
// Half-tile i is the K of tile i / 2 (i even) or its V (odd), in buffer i % kBufs. Before the
// work on half h, once every warp is past half h - 1 (whose buffer is then free), half h + kBufs - 1
// is issued: with three buffers, K_{j+1} while Q K_j^T runs and V_{j+1} while P V_j runs (two
// halves, 64 KB at head dim 128, in flight; 100 KB of shared memory, 2 CTAs per SM); with two, one
// half in flight (68 KB, 3 CTAs per SM at 168 registers). Three win on short splits, two on long
// ones (plan_decode_mma). Against the 64-key K+V stages (3 CTAs per SM, one 32 KB tile in flight
// each): +5.6% at 1 x 32k cached tokens, +15% at 1 x 8k (kernels/cuda/PERF.md, 2026-12-02).
constexpr int kPhasedKeys = 128;
constexpr bool decode_phased(int dim, bool wide) { return !wide && dim <= 128; }
template <int D, int kBufs>
constexpr size_t decode_phased_smem_bytes() {
  return size_t(16 * D + kBufs * kPhasedKeys * D) * 2;
}
static_assert(decode_phased_smem_bytes<128, 3>() <= 113 * 1024, "2 CTAs per SM on sm_90 at head dim 128");
static_assert(decode_phased_smem_bytes<128, 2>() <= 75 * 1024, "3 CTAs per SM on sm_90 at head dim 128");

template <typename T, int D, int kBufs>
__global__ void __launch_bounds__(kThreads) decode_phased_kernel(const DecodeKernelParams a) {
  static_assert(kBufs == 2 || kBufs == 3, "one or two halves in flight");
  using Tile = SwizzledTile<D>;
  constexpr int kDT = D / 8;
  constexpr int kWarpKeys = kPhasedKeys / kWarps, kNT = kWarpKeys / 8;  // 32 keys a warp
  constexpr int kHalf = kPhasedKeys * D;                                // elements of a half-tile
  const FlashParams& f = a.f;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [16][D]
  T* sB = sQ + 16 * D;                      // [kBufs][kPhasedKeys][D]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t group = f.q.heads / f.k.heads, len_q = f.q.len, len_k = f.k.len;
  const int64_t packed_rows = group * len_q;
  const int64_t split = blockIdx.x, b = blockIdx.y / f.k.heads, hk = blockIdx.y % f.k.heads;
  const int64_t row0 = int64_t(blockIdx.z) * 16, last = packed_rows - 1;
  const int wk = warp * kWarpKeys;
  const int64_t t_first = packed_row(row0, group).t, t_last = packed_row(row0 + 15 < last ? row0 + 15 : last, group).t;
  const BlockTiles bt = block_tiles<kPhasedKeys>(a, split, t_first, t_last);
  const int n_tiles = bt.n_tiles;
  const int64_t c1 = bt.c1, S = gridDim.x;
  auto tile_key0 = [&](int j) { return a.key0 + (split + (bt.j0 + j) * S) * kPhasedKeys; };
  // Keys every row of the block sees (decode_mma_kernel says why): a warp's keys outside need the
  // element mask.
  const int64_t full_lo = visible_range(f.mask, t_last, len_k).begin;
  const int64_t full_hi = visible_range(f.mask, t_first, len_k).end;
  const T* k_base = static_cast<const T*>(f.k.data) + b * f.k.stride_b + hk * f.k.stride_h;
  const T* v_base = static_cast<const T*>(f.v.data) + b * f.v.stride_b + hk * f.v.stride_h;
  auto load_half = [&](int i) {  // one commit group, empty past the last half
    if (i < 2 * n_tiles) {
      T* dst = sB + (i % kBufs) * kHalf;
      const int64_t k0 = tile_key0(i / 2);
      if (i % 2 == 0) load_tile_async<D, kPhasedKeys, kThreads>(dst, k_base, f.k.stride_t, k0, c1, tid);
      else load_tile_async<D, kPhasedKeys, kThreads>(dst, v_base, f.v.stride_t, k0, c1, tid);
    }
    cp_async_commit();
  };

  // Launched programmatically: nothing global is touched before the kernel ahead has completed.
  pdl_wait_for_prior_grid();
  load_packed_q<T, D, 16>(sQ, f, b, hk, group, packed_rows, row0, tid);
  load_half(0);  // in one group with Q
  if (kBufs == 3) load_half(1);

  const float scale_log2 = f.scale * kLog2e;
  uint32_t qf[D / 16][4];
  float acc[kDT][4];
  float m[2], l[2];
  start_rows(acc, m, l);
  const LaneFragments<D> lf(lane);
  const uint32_t sQa = smem_addr(sQ), sBa = smem_addr(sB);

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<kBufs - 2>();  // K_j (and Q) have landed; V_j may still be in flight (3 buffers)
    __syncthreads();             // ... for every thread, and every warp is past P V_{j-1}
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], sQa + Tile::fragment_offset(lf.q, 0, kk));
    }
    load_half(2 * j + kBufs - 1);  // 3 buffers: K_{j+1}, into V_{j-1}'s; 2: V_j
    const int64_t kw = tile_key0(j) + wk;  // this warp's first key
    const bool active = kw < c1;           // warp-uniform
    float s[kNT][4];
    if (active) {
      const bool need_mask = kw < full_lo || kw + kWarpKeys > full_hi;
      warp_scores<T, D, kNT, true>(s, qf, sQa, lf.q, 0, sBa + ((2 * j) % kBufs) * kHalf * 2, lf.k, wk);
      warp_softmax_step<kNT, kWarpKeys>(s, acc, m, l, f.mask, need_mask, row0, packed_rows, group, kw, c1,
                                        scale_log2, lane);
    }
    cp_async_wait<kBufs - 2>();  // V_j has landed; K_{j+1} may still be in flight (3 buffers)
    __syncthreads();             // ... for every thread, and every warp is past Q K_j^T
    load_half(2 * j + kBufs);    // 3 buffers: V_{j+1}, into K_j's; 2: K_{j+1}
    if (active) warp_pv<T, D, kNT>(acc, s, sBa + ((2 * j + 1) % kBufs) * kHalf * 2, lf.v, wk);
  }
  // merge_splits may be scheduled once every CTA is here (decode_mma_kernel says why).
  pdl_allow_dependent_launch();
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the buffers: they become the combine's scratch
  combine_warps<T, D, kPhasedKeys>(a, bt, reinterpret_cast<float*>(sB), tid, warp, lane, group, len_q, packed_rows, row0,
                                   split, b, hk, m, l, acc);
}

template <typename T, int D, int kBufs>
auto decode_phased_prepared() {
  auto kernel = decode_phased_kernel<T, D, kBufs>;
  static std::atomic<uint64_t> configured{0};
  set_dynamic_smem_once(kernel, int(decode_phased_smem_bytes<D, kBufs>()), configured);
  return kernel;
}

template <typename T, int D, bool kWide>
auto decode_kernel_prepared() {
  auto kernel = decode_mma_kernel<T, D, kWide>;
  static std::atomic<uint64_t> configured{0};
  set_dynamic_smem_once(kernel, int(decode_smem_bytes<D, kWide>()), configured);
  return kernel;
}

// Read once per device (the plan runs on every decode call; the occupancy query costs host time
// that a batch-1 decode of a few microseconds cannot spare).
// kBufs > 0: decode_phased_kernel with that many half-tile buffers.
template <typename T, int D, bool kWide, int kBufs = 0>
int decode_ctas_per_sm() {
  static std::atomic<int> per_device[64] = {};  // 0: not read yet (devices past 63 are not cached)
  int device = 0;
  RA_CHECK_CUDA(cudaGetDevice(&device));
  std::atomic<int>* cached = device < 64 ? &per_device[device] : nullptr;
  if (cached != nullptr && cached->load() > 0) return cached->load();
  int n = 0;
  if constexpr (kBufs > 0)
    RA_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_phased_prepared<T, D, kBufs>(), kThreads,
                                                                decode_phased_smem_bytes<D, kBufs>()));
  else
    RA_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel_prepared<T, D, kWide>(), kThreads,
                                                                decode_smem_bytes<D, kWide>()));
  n = n > 0 ? n : 1;
  if (cached != nullptr) cached->store(n);
  return n;
}

template <typename T, int D, bool kWide>
void launch_instance(const FlashParams& f, const DecodePlan& plan, const SplitPartials& out, cudaStream_t stream) {
  const dim3 grid(unsigned(plan.splits), unsigned(f.q.batch * f.k.heads), unsigned(plan.row_blocks));
  const DecodeKernelParams a{f, out, plan.key0, plan.tiles};
  // Programmatic: the launch and the CTAs' start overlap the tail of the kernel ahead (the
  // previous decode's merge); the kernel waits for it before it reads anything.
  if constexpr (decode_phased(D, kWide)) {
    if (plan.phased_bufs == 2)
      RA_CHECK_CUDA(launch_programmatic(decode_phased_prepared<T, D, 2>(), grid, dim3(kThreads),
                                        decode_phased_smem_bytes<D, 2>(), stream, a));
    else
      RA_CHECK_CUDA(launch_programmatic(decode_phased_prepared<T, D, 3>(), grid, dim3(kThreads),
                                        decode_phased_smem_bytes<D, 3>(), stream, a));
  } else
    RA_CHECK_CUDA(launch_programmatic(decode_kernel_prepared<T, D, kWide>(), grid, dim3(kThreads),
                                      decode_smem_bytes<D, kWide>(), stream, a));
}

// Calls fn(T{}, std::integral_constant<int, D>{}, std::bool_constant<kWide>{}) for f's dtype and
// head dim and the plan's row blocks: the one switch over the decode kernel's instantiations (wide
// ones only where decode_wide_supported).
template <typename Fn>
auto dispatch_decode(const FlashParams& f, bool wide, Fn fn) {
  using D64 = std::integral_constant<int, 64>;
  using D128 = std::integral_constant<int, 128>;
  using D256 = std::integral_constant<int, 256>;
  using Wide = std::true_type;
  using Narrow = std::false_type;
  const bool bf16 = f.q.dtype == DType::BF16;
  if (!bf16 && f.q.dtype != DType::F16) fail_no_instance("decode_mma", "dtype", int(f.q.dtype), "bf16 and fp16");
  if (wide && !decode_wide_supported(f.q.dim)) fail_no_instance("decode_mma wide rows", "head_dim", f.q.dim, "64 and 128");
  switch (f.q.dim) {
    case 64:
      return bf16 ? (wide ? fn(__nv_bfloat16{}, D64{}, Wide{}) : fn(__nv_bfloat16{}, D64{}, Narrow{}))
                  : (wide ? fn(__half{}, D64{}, Wide{}) : fn(__half{}, D64{}, Narrow{}));
    case 128:
      return bf16 ? (wide ? fn(__nv_bfloat16{}, D128{}, Wide{}) : fn(__nv_bfloat16{}, D128{}, Narrow{}))
                  : (wide ? fn(__half{}, D128{}, Wide{}) : fn(__half{}, D128{}, Narrow{}));
    case 256: return bf16 ? fn(__nv_bfloat16{}, D256{}, Narrow{}) : fn(__half{}, D256{}, Narrow{});
    default: fail_no_instance("decode_mma", "head_dim", f.q.dim, "64, 128 and 256");
  }
}

}  // namespace

DecodePlan plan_decode_mma(const FlashParams& f, int splits_hint, int sms) {
  DecodePlan plan;
  const int64_t group = f.q.heads / f.k.heads;
  // 64 packed rows or more: wide row blocks (each CTA's K/V serves 64 rows, not 16).
  plan.wide = decode_wide_supported(f.q.dim) && group * f.q.len >= decode_rows<true>();
  const int rows = plan.wide ? decode_rows<true>() : decode_rows<false>();
  plan.row_blocks = (group * f.q.len + rows - 1) / rows;
  const bool phased = decode_phased(int(f.q.dim), plan.wide);
  plan.tile_keys = phased ? kPhasedKeys : kTileKeys;
  // Only the keys some row sees are split: a window's lower edge puts every CTA on the band.
  const KeyRange visible = visible_range_of_rows(f.mask, 0, f.q.len, f.k.len);
  plan.key0 = visible.empty() ? 0 : visible.begin;
  const int64_t keys = visible.empty() ? 1 : visible.size();  // nothing visible: one split, empty
  plan.tiles = (keys + plan.tile_keys - 1) / plan.tile_keys;
  const int64_t units = f.q.batch * f.k.heads * plan.row_blocks;
  // CTAs per SM of the kernel, and of the phased kernel with two buffers (0 where there is none).
  const auto [per_sm, per_sm_two] = dispatch_decode(f, plan.wide, [](auto t, auto d, auto w) {
    using T = decltype(t);
    constexpr int kD = decltype(d)::value;
    constexpr bool kW = decltype(w)::value;
    if constexpr (decode_phased(kD, kW))
      return std::pair<int, int>{decode_ctas_per_sm<T, kD, kW, 3>(), decode_ctas_per_sm<T, kD, kW, 2>()};
    else
      return std::pair<int, int>{decode_ctas_per_sm<T, kD, kW>(), 0};
  });
  // One full wave: every CTA slot of the GPU busy, no second partial wave.
  auto one_wave = [&](int ctas_per_sm) {
    const int64_t slots = int64_t(sms) * ctas_per_sm;
    return slots / units > 1 ? slots / units : int64_t(1);
  };
  auto tiles_per_split = [&](int64_t n) { return (plan.tiles + n - 1) / n; };
  int64_t splits = splits_hint > 0 ? splits_hint : one_wave(per_sm);
  if (phased) {
    // Two buffers where they fit more CTAs per SM (head dim 128) and the splits stay long: at
    // 1 x 128k and 8 x 32k (21 and 43 tiles a split) +1.0%, at 1 x 32k (6) -7%, at 1 x 8k -5.5%
    // (kernels/cuda/PERF.md, 2026-12-02, the phased-decode run).
    constexpr int64_t kLongSplitTiles = 16;
    const int64_t two = splits_hint > 0 ? splits_hint : one_wave(per_sm_two);
    plan.phased_bufs = per_sm_two > per_sm && tiles_per_split(two) >= kLongSplitTiles ? 2 : 3;
    if (plan.phased_bufs == 2) splits = two;
  }
  // At most per_split tiles a split; the split count is the fewest that need no more (the round
  // robin then gives each split floor or ceil of tiles / splits, never none).
  const int64_t per_split = tiles_per_split(splits);
  plan.splits = (plan.tiles + per_split - 1) / per_split;
  plan.parts = plan.splits;  // the warps of a CTA combine before writing
  return plan;
}

void launch_decode_mma(const FlashParams& f, const DecodePlan& plan, const SplitPartials& out, cudaStream_t stream) {
  dispatch_decode(f, plan.wide, [&](auto t, auto d, auto w) {
    launch_instance<decltype(t), decltype(d)::value, decltype(w)::value>(f, plan, out, stream);
  });
}

}  // namespace ringattn::cuda
