// Flash forward in true fp32 on the SIMT cores: the accuracy path (fp32 inputs, fp32 products,
// full-precision expf/logf). One warp per query row (ExactRow, exact_row.cuh): the row's q and
// accumulator are spread over the lanes, every key's score is a warp-wide dot product, and the
// online softmax advances one key at a time over the row's visible keys only. Simple and slow by
// design.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/exact_row.cuh"

namespace ringattn::cuda {
namespace {

constexpr int kWarps = 4;

template <int kPer>  // values per lane: ceil(head_dim / 32)
__global__ void __launch_bounds__(32 * kWarps) flash_simt_kernel(const FlashParams p) {
  const int64_t i = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (i >= p.q.len) return;
  const int64_t b = blockIdx.y / p.q.heads, h = blockIdx.y % p.q.heads;
  const int64_t hk = h / (p.q.heads / p.k.heads);
  ExactRow<float, kPer> row;
  row.start(static_cast<const float*>(p.q.data) + view_offset(p.q, b, h, i), int(p.q.dim), p.scale);
  row.add_keys(static_cast<const float*>(p.k.data) + view_offset(p.k, b, hk, 0), p.k.stride_t,
               static_cast<const float*>(p.v.data) + view_offset(p.v, b, hk, 0), p.v.stride_t,
               visible_range(p.mask, i, p.k.len));
  const float lse = row.finish();
  store_exact_row(row, lse, p.mode == StateMode::Fold, state_o_row(p.state, b, h, i), state_lse_at(p.state, b, h, i),
                  static_cast<float*>(nullptr));
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
