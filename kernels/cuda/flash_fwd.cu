// Flash forward on tensor cores (bf16/fp16), FlashAttention-2 style.
//
// One CTA owns kBM = 16 * kWarps query rows of one (batch, query head); each warp owns 16 rows
// and keeps their Q fragments, the fp32 accumulator and the softmax statistics (m, l) in
// registers for the whole key loop. Key tiles of 64 rows stream through shared memory: K and V
// each double-buffered with cp.async, V_j loading while S = Q K_j^T is computed and K_{j+1}
// loading while O += P V_j is. Shared tiles are XOR-swizzled (SwizzledTile) so ldmatrix is free
// of bank conflicts. Scores are scaled into log2 units once (scale * log2 e), so every
// exponential is one ex2. The S accumulators are converted in registers into the A operand of
// the P V product (their m16n8 C layout is exactly two halves of the m16k16 A layout).
//
// Tile classification: the CTA loads only key tiles that some of its rows can see (invisible
// tiles are never loaded); a warp whose 16 rows see none of a tile skips its math, and a tile
// that every row of the warp fully sees (and that lies inside kv_len) is processed unmasked.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/flash_epilogue.cuh"

namespace ringattn::cuda {
namespace {

constexpr int kBN = 64;  // keys per tile

template <int D, int kWarps>
struct FlashShape {
  static constexpr int kBM = 16 * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr size_t smem_bytes(size_t elem) { return size_t(kBM * D + 4 * kBN * D) * elem; }
};

template <typename T, int D, int kWarps, bool kCausal>
__global__ void __launch_bounds__(32 * kWarps) flash_fwd_mma_kernel(const FlashParams p) {
  using Shape = FlashShape<D, kWarps>;
  using H = Half16<T>;
  using Tile = SwizzledTile<D>;
  constexpr int kBM = Shape::kBM, kThreads = Shape::kThreads;
  constexpr int kNT = kBN / 8;  // n8 score tiles per warp row block
  constexpr int kDT = D / 8;    // n8 output tiles

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kBM * D;      // [2][kBN][D]
  T* sV = sK + 2 * kBN * D;  // [2][kBN][D]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t len_q = p.q.len, len_k = p.k.len;
  // Causal: the last query tiles see the most keys; launch them first so the tail is short.
  const int64_t q_tile = kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t b = blockIdx.y / p.q.heads, h = blockIdx.y % p.q.heads;
  const int64_t hk = h / (p.q.heads / p.k.heads);
  const int64_t i0 = q_tile * kBM;
  const T* q_base = static_cast<const T*>(p.q.data) + b * p.q.stride_b + h * p.q.stride_h;
  const T* k_base = static_cast<const T*>(p.k.data) + b * p.k.stride_b + hk * p.k.stride_h;
  const T* v_base = static_cast<const T*>(p.v.data) + b * p.v.stride_b + hk * p.v.stride_h;

  // Keys that any row of this CTA can see: [0, k_end).
  int64_t k_end = len_k;
  if (kCausal) {
    const int64_t last_row = (i0 + kBM < len_q ? i0 + kBM : len_q) - 1;
    k_end = last_row + p.q_offset + 1;
    k_end = k_end < 0 ? 0 : (k_end > len_k ? len_k : k_end);
  }
  const int n_tiles = int((k_end + kBN - 1) / kBN);

  load_tile_async<D, kBM, kThreads>(sQ, q_base, p.q.stride_t, i0, len_q, tid);
  cp_async_commit();
  if (n_tiles > 0) load_tile_async<D, kBN, kThreads>(sK, k_base, p.k.stride_t, 0, len_k, tid);
  cp_async_commit();

  const int64_t w_row0 = i0 + warp * 16;  // first query row of this warp
  const int mi = lane >> 3;               // which 8x8 matrix of an ldmatrix.x4 this lane addresses
  uint32_t q_off[4], k_off[4], v_off[4];
  Tile::lane_offsets(q_off, lane & 15, lane >> 4, lane);
  Tile::lane_offsets(k_off, (mi >> 1) * 8 + (lane & 7), mi & 1, lane);
  Tile::lane_offsets(v_off, (mi & 1) * 8 + (lane & 7), mi >> 1, lane);
  const uint32_t sQa = smem_addr(sQ), sKa = smem_addr(sK), sVa = smem_addr(sV);
  const float scale_log2 = p.scale * kLog2e;
  uint32_t qf[D / 16][4];
  float acc[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};

  for (int j = 0; j < n_tiles; ++j) {
    const int64_t j0 = int64_t(j) * kBN;
    const uint32_t kt = sKa + (j & 1) * kBN * D * 2;
    const uint32_t vt = sVa + (j & 1) * kBN * D * 2;
    load_tile_async<D, kBN, kThreads>(sV + (j & 1) * kBN * D, v_base, p.v.stride_t, j0, len_k, tid);
    cp_async_commit();
    cp_async_wait<1>();  // Q and K_j have landed (V_j may still be in flight)
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qf[kk], sQa + Tile::fragment_offset(q_off, warp * 16, kk));
    }
    // Warp-level classification of this tile (warp-uniform branches).
    const bool warp_sees_none = kCausal && j0 > w_row0 + 15 + p.q_offset;
    const bool need_mask = j0 + kBN > len_k || (kCausal && j0 + kBN - 1 > w_row0 + p.q_offset);

    float s[kNT][4];
    if (!warp_sees_none) {
#pragma unroll
      for (int n = 0; n < kNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int nn = 0; nn < kNT / 2; ++nn) {
          uint32_t bk[4];
          ldmatrix_x4(bk, kt + Tile::fragment_offset(k_off, nn * 16, kk));
          H::mma(s[2 * nn], qf[kk], bk[0], bk[1]);
          H::mma(s[2 * nn + 1], qf[kk], bk[2], bk[3]);
        }
      }
    }
    // K_{j+1} goes into the buffer K_{j-1} used; every warp finished with it before the barrier.
    if (j + 1 < n_tiles)
      load_tile_async<D, kBN, kThreads>(sK + ((j + 1) & 1) * kBN * D, k_base, p.k.stride_t, j0 + kBN, len_k, tid);
    cp_async_commit();

    if (!warp_sees_none) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = w_row0 + (lane >> 2) + half * 8;
        float mx = neg_inf();
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[n][half * 2 + e] * scale_log2;
            if (need_mask) {
              const int64_t key = j0 + n * 8 + (lane & 3) * 2 + e;
              if (key >= len_k || (kCausal && key > row + p.q_offset)) x = neg_inf();
            }
            s[n][half * 2 + e] = x;
            mx = fmaxf(mx, x);
          }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[half], mx);
        // A row that has seen only masked keys keeps m = -inf; subtract 0 then, not -inf.
        const float m_use = m_new == neg_inf() ? 0.f : m_new;
        const float alpha = fast_exp2(m[half] - m_use);
        m[half] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = fast_exp2(s[n][half * 2 + e] - m_use);
            s[n][half * 2 + e] = pe;
            sum += pe;
          }
        }
        l[half] = l[half] * alpha + sum;  // per-thread partial row sum; reduced in the epilogue
#pragma unroll
        for (int n = 0; n < kDT; ++n) {
          acc[n][half * 2] *= alpha;
          acc[n][half * 2 + 1] *= alpha;
        }
      }
    }

    cp_async_wait<1>();  // V_j has landed (K_{j+1} may still be in flight)
    __syncthreads();
    if (!warp_sees_none) {
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        const uint32_t a[4] = {H::pack(s[2 * kk][0], s[2 * kk][1]), H::pack(s[2 * kk][2], s[2 * kk][3]),
                               H::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               H::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, vt + Tile::fragment_offset(v_off, kk * 16, dn));
          H::mma(acc[2 * dn], a, bv[0], bv[1]);
          H::mma(acc[2 * dn + 1], a, bv[2], bv[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing may stay in flight when the CTA exits (n_tiles == 0 included)

  finish_rows<kDT>(p.mode, lane, acc, m, l, [&](int r) {
    const int64_t row = w_row0 + r;
    if (row >= len_q) return RowPtr{};
    return RowPtr{state_o_row(p.state, b, h, row), state_lse_at(p.state, b, h, row)};
  });
}

template <typename T, int D, int kWarps, bool kCausal>
void launch_instance(const FlashParams& p, cudaStream_t stream) {
  using Shape = FlashShape<D, kWarps>;
  const size_t smem = Shape::smem_bytes(sizeof(T));
  auto kernel = flash_fwd_mma_kernel<T, D, kWarps, kCausal>;
  // Above 48 KiB a kernel must opt in to its dynamic shared memory; once per instantiation.
  static bool attribute_set = false;
  if (!attribute_set) {
    RA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attribute_set = true;
  }
  const dim3 grid(unsigned((p.q.len + Shape::kBM - 1) / Shape::kBM), unsigned(p.q.batch * p.q.heads));
  kernel<<<grid, Shape::kThreads, smem, stream>>>(p);
  RA_CUDA_CHECK_LAUNCH("flash_fwd_mma_kernel");
}

int g_flash_warps = 0;  // 0: the default per head dim

template <typename T, int D>
void dispatch_warps(const FlashParams& p, cudaStream_t stream) {
  // 8 warps (128 query rows) halve the K/V traffic per query against 4 warps; short query
  // blocks use 4 so that small problems still spread over many CTAs.
  int warps = g_flash_warps;
  if (warps == 0) warps = p.q.len >= 1024 ? 8 : 4;
  if (warps == 8) {
    if (p.causal) launch_instance<T, D, 8, true>(p, stream);
    else launch_instance<T, D, 8, false>(p, stream);
  } else {
    if (p.causal) launch_instance<T, D, 4, true>(p, stream);
    else launch_instance<T, D, 4, false>(p, stream);
  }
}

template <typename T>
void dispatch_dim(const FlashParams& p, cudaStream_t stream) {
  if (p.q.dim == 64) dispatch_warps<T, 64>(p, stream);
  else dispatch_warps<T, 128>(p, stream);
}

}  // namespace

void set_flash_mma_warps(int warps) { g_flash_warps = warps; }

void launch_flash_mma(const FlashParams& p, cudaStream_t stream) {
  if (p.q.dtype == DType::BF16) dispatch_dim<__nv_bfloat16>(p, stream);
  else dispatch_dim<__half>(p, stream);
}

}  // namespace ringattn::cuda
