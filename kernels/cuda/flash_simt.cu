// Flash forward in true fp32 on the SIMT cores: the accuracy path (fp32 inputs, fp32 products,
// full-precision expf/logf). One warp per query row; the row's q and accumulator are spread
// over the lanes (head_dim / 32 values each), every key's score is a warp-wide dot product,
// and the online softmax advances one key at a time. Simple and slow by design.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_common.cuh"

namespace ringattn::cuda {
namespace {

constexpr int kWarps = 4;

template <int kPer>  // values per lane: ceil(head_dim / 32)
__global__ void __launch_bounds__(32 * kWarps) flash_simt_kernel(const FlashParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t i = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (i >= p.q.len) return;
  const int64_t b = blockIdx.y / p.q.heads, h = blockIdx.y % p.q.heads;
  const int64_t hk = h / (p.q.heads / p.k.heads), D = p.q.dim;
  const float* q = static_cast<const float*>(p.q.data) + view_offset(p.q, b, h, i);
  const float* k = static_cast<const float*>(p.k.data) + view_offset(p.k, b, hk, 0);
  const float* v = static_cast<const float*>(p.v.data) + view_offset(p.v, b, hk, 0);

  float qr[kPer], acc[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t d = lane + 32 * e;
    qr[e] = d < D ? q[d] : 0.f;
    acc[e] = 0.f;
  }
  const KeyRange keys = visible_range(p.mask, i, p.k.len);
  float m = neg_inf(), l = 0.f;
  for (int64_t j = keys.begin; j < keys.end; ++j) {
    const float* kj = k + j * p.k.stride_t;
    const float* vj = v + j * p.v.stride_t;
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < D) dot = fmaf(qr[e], kj[d], dot);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float x = dot * p.scale;
    const OnlineStep st = online_step(m, x, [](float y) { return expf(y); });
    const float alpha = st.alpha, pj = expf(x - st.base);
    l = l * alpha + pj;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t d = lane + 32 * e;
      acc[e] = acc[e] * alpha + (d < D ? pj * vj[d] : 0.f);
    }
  }

  float* o = state_o_row(p.state, b, h, i);
  float* lse = state_lse_at(p.state, b, h, i);
  const float lse_b = lse_from_stats(m, l);
  const float inv = l > 0.f ? 1.f / l : 0.f;
  if (p.mode == StateMode::Write) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < D) o[d] = acc[e] * inv;
    }
    if (lane == 0) *lse = lse_b;
    return;
  }
  const float lse_a = *lse;
  __syncwarp();  // every lane has read lse before lane 0 writes it
  float wa, wb, merged;
  if (!merge_weights(lse_a, lse_b, wa, wb, merged)) return;
  wb *= inv;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < D) o[d] = lse_a == neg_inf() ? acc[e] * wb : o[d] * wa + acc[e] * wb;
  }
  if (lane == 0) *lse = merged;
}

template <int kPer>
void launch_per(const FlashParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned((p.q.len + kWarps - 1) / kWarps), unsigned(p.q.batch * p.q.heads));
  flash_simt_kernel<kPer><<<grid, 32 * kWarps, 0, stream>>>(p);
  RA_CHECK_CUDA_LAUNCH("flash_simt_kernel");
}

}  // namespace

void launch_flash_simt(const FlashParams& p, cudaStream_t stream) {
  const int64_t per = (p.q.dim + 31) / 32;
  if (per <= 1) launch_per<1>(p, stream);
  else if (per <= 2) launch_per<2>(p, stream);
  else if (per <= 4) launch_per<4>(p, stream);
  else if (per <= 8) launch_per<8>(p, stream);
  else fail_no_instance("launch_flash_simt", "head_dim", p.q.dim, "1..256");
}

}  // namespace ringattn::cuda
