// Flash forward on tensor cores (bf16/fp16, mma.sync m16n8k16), FlashAttention-2 style.
//
// One CTA owns kBM query rows of one (batch, query head): 4 warps of 16 * kM rows each. Every
// warp keeps its rows' fp32 accumulator and softmax statistics (m, l) in registers for the whole
// key loop (and its Q fragments too when they fit; at 32 rows x head dim 128 they are re-read
// from shared memory per key tile). Key tiles of kBN rows stream through shared memory: K and V
// each double-buffered with cp.async, V_j loading while S = Q K_j^T is computed and K_{j+1}
// loading while O += P V_j is. Shared tiles are XOR-swizzled (SwizzledTile) so ldmatrix is free
// of bank conflicts. Scores are moved into log2 units with the scale folded into the exponent's
// FFMA, so every exponential is one ex2; the accumulator rescale is skipped once a warp's
// running maxima stop moving. The S accumulators become the A operand of the P V product in
// registers (their m16n8 C layout is exactly two halves of the m16k16 A layout).
//
// With kM = 2 every K/V fragment read from shared memory feeds two m16 tiles: 37% less
// shared-memory traffic per FLOP than kM = 1, which is what bounds this design (PERF.md).
//
// Tile classification: the CTA loads only key tiles that some of its rows can see, from the
// tile of the first row's first visible key (a window's lower edge) to that of the last row's
// last (invisible tiles are never loaded); a warp whose rows see none of a tile skips its math,
// and a tile that every row of the warp fully sees (and that lies inside kv_len) is processed
// unmasked. Only the tiles on the band's two edges pay for the element mask.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/fwd_epilogue.cuh"
#include "kernels/cuda/online_softmax.cuh"

namespace ringattn::cuda {
namespace {

// A kernel configuration: kWarps warps of kM m16 row tiles each (16 * kM query rows per warp),
// key tiles of kBN keys.
template <int D, int kWarps, int kM, int kBN>
struct FlashShape {
  static constexpr int kBM = 16 * kM * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  // Q fragments stay in registers when they fit in 32 registers; otherwise they are re-read from
  // shared memory for every key tile (the price of 32 rows per warp at head dim 128).
  static constexpr bool kQInRegs = kM * (D / 16) * 4 <= 32;
  static constexpr size_t smem_bytes(size_t elem) { return size_t(kBM * D + 4 * kBN * D) * elem; }
};

// S = Q K_j^T for this warp's kM m16 row tiles against the kBN keys of the K tile at kt (shared
// byte address); Q fragments from registers (qf) or from shared memory (sQa).
template <typename T, int D, int kM, int kBN, bool kQInRegs>
__device__ __forceinline__ void warp_scores(float (&s)[kM][kBN / 8][4],
                                            const uint32_t (&qf)[kQInRegs ? kM : 1][kQInRegs ? D / 16 : 1][4],
                                            uint32_t sQa, uint32_t kt, const uint32_t (&q_off)[4],
                                            const uint32_t (&k_off)[4], int q_row0) {
  using H = Half16<T>;
  using Tile = SwizzledTile<D>;
  constexpr int kNT = kBN / 8;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int n = 0; n < kNT; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t qa[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      if constexpr (kQInRegs) {
#pragma unroll
        for (int x = 0; x < 4; ++x) qa[mt][x] = qf[mt][kk][x];
      } else {
        ldmatrix_x4(qa[mt], sQa + Tile::fragment_offset(q_off, q_row0 + mt * 16, kk));
      }
    }
#pragma unroll
    for (int nn = 0; nn < kNT / 2; ++nn) {
      uint32_t bk[4];
      ldmatrix_x4(bk, kt + Tile::fragment_offset(k_off, nn * 16, kk));
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        H::mma(s[mt][2 * nn], qa[mt], bk[0], bk[1]);
        H::mma(s[mt][2 * nn + 1], qa[mt], bk[2], bk[3]);
      }
    }
  }
}

// The online-softmax step of this warp's rows over one key tile starting at key j0: masks (when
// need_mask) each row's keys outside its visible_range, turns s into probabilities, updates
// (m, l) and rescales the accumulator when some row's max moved.
template <int D, int kM, int kBN, bool kPosScale, bool kWindowed>
__device__ __forceinline__ void warp_softmax(float (&s)[kM][kBN / 8][4], float (&acc)[kM][D / 8][4],
                                             float (&m)[kM][2], float (&l)[kM][2], const MaskSpec& mask,
                                             bool need_mask, int64_t w_row0, int64_t j0, int64_t len_k, int lane,
                                             float scale_log2) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    float alpha[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // A masked tile: this row sees the tile's keys [key_begin, key_end) (kv_len included).
      int key_begin = 0, key_end = kBN;
      if (need_mask) {
        const KeyRange r = visible_range(mask, w_row0 + mt * 16 + (lane >> 2) + half * 8, len_k);
        key_end = tile_key_bound(r.end, j0, kBN);
        if (kWindowed) key_begin = tile_key_bound(r.begin, j0, kBN);
      }
      alpha[half] = online_softmax_row<kBN / 8, kPosScale, kWindowed>(s[mt], half, lane, need_mask, key_begin, key_end,
                                                                      scale_log2, m[mt][half], l[mt][half]);
    }
    // Once the running max settles, alpha is exactly 1 for every row: skip the rescale then.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        acc[mt][n][0] *= alpha[0];
        acc[mt][n][1] *= alpha[0];
        acc[mt][n][2] *= alpha[1];
        acc[mt][n][3] *= alpha[1];
      }
    }
  }
}

// O += P V_j: the probabilities s (m16n8 accumulators, which are exactly two halves of the
// m16k16 A layout) against the V tile at vt (shared byte address).
template <typename T, int D, int kM, int kBN>
__device__ __forceinline__ void warp_pv(float (&acc)[kM][D / 8][4], const float (&s)[kM][kBN / 8][4], uint32_t vt,
                                        const uint32_t (&v_off)[4]) {
  using H = Half16<T>;
  using Tile = SwizzledTile<D>;
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      a[mt][0] = H::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      a[mt][1] = H::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      a[mt][2] = H::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      a[mt][3] = H::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t bv[4];
      ldmatrix_x4_trans(bv, vt + Tile::fragment_offset(v_off, kk * 16, dn));
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        H::mma(acc[mt][2 * dn], a[mt], bv[0], bv[1]);
        H::mma(acc[mt][2 * dn + 1], a[mt], bv[2], bv[3]);
      }
    }
  }
}

// kCausal and kWindowed are p.mask.causal and p.mask.windowed(): the mask's kind at compile time,
// so the instantiations without a window carry no lower-edge code.
template <typename T, int D, int kWarps, int kM, int kBN, bool kCausal, bool kWindowed, bool kPosScale>
__global__ void __launch_bounds__(32 * kWarps) flash_fwd_mma_kernel(const FlashParams p) {
  using Shape = FlashShape<D, kWarps, kM, kBN>;
  using Tile = SwizzledTile<D>;
  constexpr int kBM = Shape::kBM, kThreads = Shape::kThreads, kRows = 16 * kM;
  constexpr int kNT = kBN / 8;  // n8 score tiles per m16 tile
  constexpr int kDT = D / 8;    // n8 output tiles
  constexpr bool kQInRegs = Shape::kQInRegs;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kBM * D;      // [2][kBN][D]
  T* sV = sK + 2 * kBN * D;  // [2][kBN][D]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t len_q = p.q.len, len_k = p.k.len;
  // Causal: the last query tiles see the most keys. The grid is (head, query tile) with the
  // tiles reversed, so the CTAs are handed out heaviest first across all heads and the last
  // wave holds only light tiles (longest-processing-time-first); the tail otherwise costs ~20%.
  // A window without the causal edge makes the first tiles the heaviest: the same grid, not
  // reversed. (Causal with a window: the tiles are about equal, any order does.)
  constexpr bool kHeadsFirst = kCausal || kWindowed;
  const int64_t q_tile = kCausal ? gridDim.y - 1 - blockIdx.y : (kHeadsFirst ? blockIdx.y : blockIdx.x);
  const int64_t bh = kHeadsFirst ? blockIdx.x : blockIdx.y;
  const int64_t b = bh / p.q.heads, h = bh % p.q.heads;
  const int64_t hk = h / (p.q.heads / p.k.heads);
  const int64_t i0 = q_tile * kBM;
  const T* q_base = static_cast<const T*>(p.q.data) + b * p.q.stride_b + h * p.q.stride_h;
  const T* k_base = static_cast<const T*>(p.k.data) + b * p.k.stride_b + hk * p.k.stride_h;
  const T* v_base = static_cast<const T*>(p.v.data) + b * p.v.stride_b + hk * p.v.stride_h;

  // The mask with its kind known at compile time.
  const MaskSpec mask{kCausal, p.mask.q_offset, kWindowed ? p.mask.window : -1};
  // Keys that any row of this CTA can see: [keys.begin, keys.end), in key tiles
  // [j_begin, n_tiles) (none when the range is empty).
  const KeyRange keys = visible_range_of_rows(mask, i0, (i0 + kBM < len_q ? kBM : len_q - i0), len_k);
  const int n_tiles = keys.empty() ? 0 : int((keys.end + kBN - 1) / kBN);
  const int j_begin = kWindowed && !keys.empty() ? int(keys.begin / kBN) : 0;

  load_tile_async<D, kBM, kThreads>(sQ, q_base, p.q.stride_t, i0, len_q, tid);
  cp_async_commit();
  if (j_begin < n_tiles)
    load_tile_async<D, kBN, kThreads>(sK + (j_begin & 1) * kBN * D, k_base, p.k.stride_t, int64_t(j_begin) * kBN, len_k,
                                      tid);
  cp_async_commit();

  const int64_t w_row0 = i0 + warp * kRows;  // first query row of this warp
  const int mi = lane >> 3;                  // which 8x8 matrix of an ldmatrix.x4 this lane addresses
  uint32_t q_off[4], k_off[4], v_off[4];
  Tile::lane_offsets(q_off, lane & 15, lane >> 4, lane);
  Tile::lane_offsets(k_off, (mi >> 1) * 8 + (lane & 7), mi & 1, lane);
  Tile::lane_offsets(v_off, (mi & 1) * 8 + (lane & 7), mi >> 1, lane);
  const uint32_t sQa = smem_addr(sQ), sKa = smem_addr(sK), sVa = smem_addr(sV);
  const float scale_log2 = p.scale * kLog2e;

  uint32_t qf[kQInRegs ? kM : 1][kQInRegs ? D / 16 : 1][4];
  float acc[kM][kDT][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int n = 0; n < kDT; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
  float m[kM][2], l[kM][2];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) m[mt][0] = m[mt][1] = neg_inf(), l[mt][0] = l[mt][1] = 0.f;

  for (int j = j_begin; j < n_tiles; ++j) {
    const int64_t j0 = int64_t(j) * kBN;
    const uint32_t kt = sKa + (j & 1) * kBN * D * 2;
    const uint32_t vt = sVa + (j & 1) * kBN * D * 2;
    load_tile_async<D, kBN, kThreads>(sV + (j & 1) * kBN * D, v_base, p.v.stride_t, j0, len_k, tid);
    cp_async_commit();
    cp_async_wait<1>();  // Q and K_j have landed (V_j may still be in flight)
    __syncthreads();
    if (kQInRegs && j == j_begin) {
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          ldmatrix_x4(qf[kQInRegs ? mt : 0][kQInRegs ? kk : 0], sQa + Tile::fragment_offset(q_off, warp * kRows + mt * 16, kk));
    }
    // Warp-level classification of this tile (warp-uniform branches).
    const BlockVisibility vis = classify_block(mask, w_row0, kRows, j0, kBN);
    const bool warp_sees_none = vis == BlockVisibility::Empty;
    const bool need_mask = j0 + kBN > len_k || vis != BlockVisibility::Full;

    float s[kM][kNT][4];
    if (!warp_sees_none) warp_scores<T, D, kM, kBN, kQInRegs>(s, qf, sQa, kt, q_off, k_off, warp * kRows);
    // K_{j+1} goes into the buffer K_{j-1} used; every warp finished with it before the barrier.
    if (j + 1 < n_tiles)
      load_tile_async<D, kBN, kThreads>(sK + ((j + 1) & 1) * kBN * D, k_base, p.k.stride_t, j0 + kBN, len_k, tid);
    cp_async_commit();

    if (!warp_sees_none)
      warp_softmax<D, kM, kBN, kPosScale, kWindowed>(s, acc, m, l, mask, need_mask, w_row0, j0, len_k, lane, scale_log2);

    cp_async_wait<1>();  // V_j has landed (K_{j+1} may still be in flight)
    __syncthreads();
    if (!warp_sees_none) warp_pv<T, D, kM, kBN>(acc, s, vt, v_off);
  }
  cp_async_wait<0>();  // nothing may stay in flight when the CTA exits (n_tiles == 0 included)

#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    const int64_t r0 = w_row0 + mt * 16;
    finish_rows<kDT>(p.mode, lane, acc[mt], m[mt], l[mt], [&](int r) {
      const int64_t row = r0 + r;
      if (row >= len_q) return RowPtr{};
      return RowPtr{state_o_row(p.state, b, h, row), state_lse_at(p.state, b, h, row)};
    }, [&](int r) {  // a row whose result is not finite: recomputed over its visible keys only
      const int64_t row = r0 + r;
      if (row >= len_q) return;
      redo_row<T, D / 32>(q_base + row * p.q.stride_t, k_base, p.k.stride_t, v_base, p.v.stride_t, D, p.scale,
                          visible_range(mask, row, len_k), p.mode == StateMode::Fold, state_o_row(p.state, b, h, row),
                          state_lse_at(p.state, b, h, row), static_cast<float*>(nullptr));
    });
  }
}

template <typename T, int D, int kWarps, int kM, int kBN, bool kCausal, bool kWindowed, bool kPosScale>
void launch_instance(const FlashParams& p, cudaStream_t stream) {
  using Shape = FlashShape<D, kWarps, kM, kBN>;
  const size_t smem = Shape::smem_bytes(sizeof(T));
  auto kernel = flash_fwd_mma_kernel<T, D, kWarps, kM, kBN, kCausal, kWindowed, kPosScale>;
  static std::atomic<uint64_t> configured{0};
  set_dynamic_smem_once(kernel, int(smem), configured);
  const unsigned q_tiles = unsigned((p.q.len + Shape::kBM - 1) / Shape::kBM), heads = unsigned(p.q.batch * p.q.heads);
  const dim3 grid = kCausal || kWindowed ? dim3(heads, q_tiles) : dim3(q_tiles, heads);
  kernel<<<grid, Shape::kThreads, smem, stream>>>(p);
  RA_CHECK_CUDA_LAUNCH("flash_fwd_mma_kernel");
}

// The mask's kind: causal or not, windowed (a lower edge) or not.
template <typename T, int D, int kWarps, int kM, int kBN, bool kPosScale = true>
void dispatch_mask(const FlashParams& p, cudaStream_t stream) {
  const bool causal = p.mask.causal, windowed = p.mask.windowed();
  if (causal && windowed) launch_instance<T, D, kWarps, kM, kBN, true, true, kPosScale>(p, stream);
  else if (causal) launch_instance<T, D, kWarps, kM, kBN, true, false, kPosScale>(p, stream);
  else if (windowed) launch_instance<T, D, kWarps, kM, kBN, false, true, kPosScale>(p, stream);
  else launch_instance<T, D, kWarps, kM, kBN, false, false, kPosScale>(p, stream);
}

template <typename T, int D>
void dispatch_variant(const FlashParams& p, MmaVariant v, cudaStream_t stream) {
  switch (v) {
    case MmaVariant::ScaleFirst: return dispatch_mask<T, D, 4, 1, 64, false>(p, stream);
    case MmaVariant::Rows16Keys64: return dispatch_mask<T, D, 4, 1, 64>(p, stream);
    case MmaVariant::Rows32Keys64: return dispatch_mask<T, D, 4, 2, 64>(p, stream);
    case MmaVariant::Rows32Keys32: return dispatch_mask<T, D, 4, 2, 32>(p, stream);
    default: fail_no_instance("launch_flash_mma", "variant", int(v), "0..3");
  }
}

template <typename T>
void dispatch_dim(const FlashParams& p, MmaVariant v, cudaStream_t stream) {
  switch (p.q.dim) {
    case 64: return dispatch_variant<T, 64>(p, v, stream);
    case 128: return dispatch_variant<T, 128>(p, v, stream);
    default: fail_no_instance("launch_flash_mma", "head_dim", p.q.dim, "64 and 128");
  }
}

}  // namespace

void launch_flash_mma(const FlashParams& p, MmaVariant v, cudaStream_t stream) {
  switch (p.q.dtype) {
    case DType::BF16: return dispatch_dim<__nv_bfloat16>(p, v, stream);
    case DType::F16: return dispatch_dim<__half>(p, v, stream);
    default: fail_no_instance("launch_flash_mma", "dtype", int(p.q.dtype), "bf16 and fp16");
  }
}

}  // namespace ringattn::cuda
