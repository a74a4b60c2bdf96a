// State kernels: the pairwise (o, lse) merge, the many-way merge of split-KV partials, the cast
// of the final state to the output dtype, and the empty state. One warp per state row for the
// merges (lanes across head_dim, so the row's lse is read once and broadcast).
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_common.cuh"

namespace ringattn::cuda {
namespace {

constexpr int kThreads = 256, kRowsPerBlock = kThreads / 32;

struct RowIndex {
  int64_t b, h, t;
};
__device__ __forceinline__ RowIndex row_index(const StateView& s, int64_t row) {
  return {row / (s.heads * s.len), (row / s.len) % s.heads, row % s.len};
}

// state := merge(state, other), exactly kernels/cpu/merge.cpp merge_row.
__global__ void __launch_bounds__(kThreads) merge_kernel(const MergeParams p) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.state.batch * p.state.heads * p.state.len) return;
  const RowIndex a = row_index(p.state, row);
  float* o = state_o_row(p.state, a.b, a.h, a.t);
  float* lse = state_lse_at(p.state, a.b, a.h, a.t);
  const float* ob = state_o_row(p.other, a.b, a.h, a.t);
  const float lse_a = *lse, lse_b = *state_lse_at(p.other, a.b, a.h, a.t);
  __syncwarp();  // every lane has read lse before lane 0 writes it
  float wa, wb, merged;
  if (!merge_weights(lse_a, lse_b, wa, wb, merged)) return;
  const bool a_empty = lse_a == neg_inf();
  for (int64_t d = lane; d < p.state.dim; d += 32) o[d] = a_empty ? ob[d] : o[d] * wa + ob[d] * wb;
  if (lane == 0) *lse = merged;
}

// Combines all partials of each row (their lse-weighted average), then writes or folds.
__global__ void __launch_bounds__(kThreads) merge_splits_kernel(const MergeSplitsParams p) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const SplitPartials& in = p.parts;
  if (row >= in.rows) return;
  float mx = neg_inf();
  for (int64_t k = lane; k < in.parts; k += 32) mx = fmaxf(mx, in.lse[k * in.rows + row]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const RowIndex a = row_index(p.state, row);
  float* o = state_o_row(p.state, a.b, a.h, a.t);
  float* lse = state_lse_at(p.state, a.b, a.h, a.t);
  const int64_t dim = in.dim;
  if (mx == neg_inf()) {  // no partial saw a key
    if (p.mode == StateMode::Write) {
      for (int64_t d = lane; d < dim; d += 32) o[d] = 0.f;
      if (lane == 0) *lse = neg_inf();
    }
    return;
  }
  float sum = 0.f;
  for (int64_t k = lane; k < in.parts; k += 32) sum += expf(in.lse[k * in.rows + row] - mx);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float lse_b = mx + logf(sum);
  float wa = 0.f, wb = 1.f, merged = lse_b;
  bool a_empty = true;
  if (p.mode == StateMode::Fold) {
    const float lse_a = *lse;
    __syncwarp();
    merge_weights(lse_a, lse_b, wa, wb, merged);  // lse_b is finite: always true
    a_empty = lse_a == neg_inf();
  }
  const float scale = wb / sum;
  for (int64_t d = lane; d < dim; d += 32) {
    float x = 0.f;
    for (int64_t k = 0; k < in.parts; ++k) {
      const float lk = in.lse[k * in.rows + row];
      if (lk != neg_inf()) x += expf(lk - mx) * in.o[(k * in.rows + row) * dim + d];
    }
    x *= scale;
    o[d] = a_empty ? x : o[d] * wa + x;
  }
  if (lane == 0) *lse = merged;
}

struct FinalizeKernelParams {
  FinalizeParams p;
  int64_t total;  // elements
};

template <typename T>
__device__ __forceinline__ T cast_from_float(float x);
template <>
__device__ __forceinline__ float cast_from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half cast_from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 cast_from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T>
__global__ void __launch_bounds__(kThreads) finalize_kernel(const FinalizeKernelParams a) {
  const StateView& s = a.p.state;
  const TensorView& out = a.p.out;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < a.total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t d = i % s.dim, row = i / s.dim;
    const RowIndex r = row_index(s, row);
    static_cast<T*>(out.data)[view_offset(out, r.b, r.h, r.t) + d] = cast_from_float<T>(state_o_row(s, r.b, r.h, r.t)[d]);
  }
}

__global__ void __launch_bounds__(kThreads) fill_empty_kernel(const StateView s) {
  const int64_t total = s.batch * s.heads * s.len * s.dim;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t d = i % s.dim, row = i / s.dim;
    const RowIndex r = row_index(s, row);
    state_o_row(s, r.b, r.h, r.t)[d] = 0.f;
    if (d == 0) *state_lse_at(s, r.b, r.h, r.t) = neg_inf();
  }
}

unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }
unsigned elementwise_blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65536 ? (b > 0 ? b : 1) : 65536);  // grid-stride beyond that
}

}  // namespace

void launch_merge(const MergeParams& p, cudaStream_t stream) {
  const int64_t rows = p.state.batch * p.state.heads * p.state.len;
  if (rows == 0) return;
  merge_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(p);
  RA_CUDA_CHECK_LAUNCH("merge_kernel");
}

void launch_merge_splits(const MergeSplitsParams& p, cudaStream_t stream) {
  if (p.parts.rows == 0) return;
  merge_splits_kernel<<<row_blocks(p.parts.rows), kThreads, 0, stream>>>(p);
  RA_CUDA_CHECK_LAUNCH("merge_splits_kernel");
}

void launch_finalize(const FinalizeParams& p, cudaStream_t stream) {
  const int64_t total = p.state.batch * p.state.heads * p.state.len * p.state.dim;
  if (total == 0) return;
  const FinalizeKernelParams a{p, total};
  switch (p.out.dtype) {
    case DType::F32: finalize_kernel<float><<<elementwise_blocks(total), kThreads, 0, stream>>>(a); break;
    case DType::F16: finalize_kernel<__half><<<elementwise_blocks(total), kThreads, 0, stream>>>(a); break;
    case DType::BF16: finalize_kernel<__nv_bfloat16><<<elementwise_blocks(total), kThreads, 0, stream>>>(a); break;
  }
  RA_CUDA_CHECK_LAUNCH("finalize_kernel");
}

void launch_fill_empty(const StateView& s, cudaStream_t stream) {
  const int64_t total = s.batch * s.heads * s.len * s.dim;
  if (total == 0) return;
  fill_empty_kernel<<<elementwise_blocks(total), kThreads, 0, stream>>>(s);
  RA_CUDA_CHECK_LAUNCH("fill_empty_kernel");
}

}  // namespace ringattn::cuda
