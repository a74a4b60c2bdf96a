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

template <typename T>
__device__ __forceinline__ T cast_from_float(float x);
template <>
__device__ __forceinline__ float cast_from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half cast_from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 cast_from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Combines all partials of one row (their lse-weighted average), then writes or folds. One CTA
// per row: the warps take interleaved partials and the lanes the head dims, so a row with a
// hundred partials still has many independent loads in flight. One pass over the partials: each
// warp keeps an online (max, sum, weighted o) of its own partials (the lse and o loads of several
// partials in flight together), and the warps' states meet once in shared memory. (The two-pass
// form, max then weights, put two block-wide reductions and their load latencies on the critical
// path of every decode: at batch 1 this kernel is a few dozen rows, latency-bound.)
constexpr int kSplitWarps = 8, kSplitThreads = 32 * kSplitWarps;
constexpr int kMaxDim = 256, kMaxPerLane = kMaxDim / 32;
static_assert(kMaxDim >= kSimtMaxHeadDim && kMaxDim >= 128, "every head dim a backend path accepts");

// Natural exp as a function object, for the state helpers (core/state.hpp) in natural units.
struct NaturalExp {
  __device__ __forceinline__ float operator()(float x) const { return expf(x); }
};

// T: the dtype of p.out (float when there is none: then nothing is cast).
template <typename T>
__global__ void __launch_bounds__(kSplitThreads) merge_splits_kernel(const MergeSplitsParams p) {
  __shared__ float partial_sums[kSplitWarps][kMaxDim];
  __shared__ float warp_m[kSplitWarps], warp_l[kSplitWarps];
  // Launched programmatically after the kernel that writes the partials (launch_merge_splits):
  // nothing is read or written before that kernel has completed. The kernel after this one (the
  // next decode, launched programmatically too) may be scheduled at once: it waits for this
  // grid's completion in turn.
  // The row's (b, h, t) and addresses come from the parameters alone: worked out (64-bit
  // divisions) before the wait, so the partials' loads leave as soon as it returns.
  const SplitPartials& in = p.parts;
  const int64_t row = blockIdx.x, dim = in.dim;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const RowIndex a = row_index(p.state, row);
  // A Write merge given `out` may have no fp32 o (DecodeParams): then only out and the lse are written.
  float* o = p.state.o == nullptr ? nullptr : state_o_row(p.state, a.b, a.h, a.t);
  float* lse = state_lse_at(p.state, a.b, a.h, a.t);
  T* out = p.out.data == nullptr ? nullptr : static_cast<T*>(p.out.data) + view_offset(p.out, a.b, a.h, a.t);
  pdl_wait_for_prior_grid();
  pdl_allow_dependent_launch();
  // Read before any thread can write it (the barrier below separates the two).
  const float lse_old = p.mode == StateMode::Fold ? *lse : 0.f;

  // This warp's partials k = warp, warp + kSplitWarps, ...: (m, l, x) with l = sum exp(lse_k - m)
  // and x = sum exp(lse_k - m) o_k, m their running max (natural units; an empty partial, lse =
  // -inf, adds nothing).
  float m = neg_inf(), l = 0.f, x[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) x[i] = 0.f;
#pragma unroll 4
  for (int64_t k = warp; k < in.parts; k += kSplitWarps) {
    const float lk = in.lse[k * in.rows + row];
    const float* ok = in.o + (k * in.rows + row) * dim;
    float v[kMaxPerLane];
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) v[i] = lane + 32 * i < dim ? ok[lane + 32 * i] : 0.f;
    if (lk == neg_inf()) continue;  // an empty partial (its o is 0)
    const OnlineStep st = online_step(m, lk, NaturalExp{});
    const float w = expf(lk - st.base);
    l = l * st.alpha + w;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) x[i] = x[i] * st.alpha + w * v[i];
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (lane + 32 * i < dim) partial_sums[warp][lane + 32 * i] = x[i];
  if (lane == 0) warp_m[warp] = m, warp_l[warp] = l;
  __syncthreads();

  // The warps' states against the row's max mx.
  float mx = neg_inf();
  bool poisoned = false;  // a NaN partial (its lse NaN): fmaxf drops it from mx, its sum l is NaN
#pragma unroll
  for (int w = 0; w < kSplitWarps; ++w) {
    mx = fmaxf(mx, warp_m[w]);
    poisoned |= warp_l[w] != warp_l[w];
  }
  if (mx == neg_inf() && poisoned) mx = 0.f;  // only NaN partials: the row comes out NaN (0 * NaN) below
  if (mx == neg_inf()) {  // no partial saw a key: the state is empty (Write) or unchanged (Fold)
    if (p.mode == StateMode::Write) {
      if (o != nullptr)
        for (int64_t d = tid; d < dim; d += kSplitThreads) o[d] = 0.f;
      if (tid == 0) *lse = neg_inf();
    }
    if (out != nullptr)
      for (int64_t d = tid; d < dim; d += kSplitThreads) out[d] = cast_from_float<T>(p.mode == StateMode::Write ? 0.f : o[d]);
    return;
  }
  float c[kSplitWarps], sum = 0.f;
#pragma unroll
  for (int w = 0; w < kSplitWarps; ++w) {
    c[w] = rescale_factor(warp_m[w], mx, NaturalExp{});
    sum += c[w] * warp_l[w];
  }

  const float lse_b = lse_from_stats(mx, sum);  // sum >= 1 (some partial has lse == mx), or NaN
  float wa = 0.f, wb = 1.f, merged = lse_b;
  if (p.mode == StateMode::Fold) merge_weights(lse_old, lse_b, wa, wb, merged);  // lse_b not -inf: true
  const bool a_empty = p.mode == StateMode::Write || lse_old == neg_inf();
  const float scale = wb / sum;
  for (int64_t d = tid; d < dim; d += kSplitThreads) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) t += c[w] * partial_sums[w][d];
    t *= scale;
    const float od = a_empty ? t : o[d] * wa + t;
    if (o != nullptr) o[d] = od;
    if (out != nullptr) out[d] = cast_from_float<T>(od);
  }
  if (tid == 0) *lse = merged;
}

// One warp per row (grid-stride over rows): the row's (b, h, t) is worked out once per row, not
// per element (64-bit divisions are slow), and the lanes move coalesced runs of the row.
template <typename T>
__global__ void __launch_bounds__(kThreads) finalize_kernel(const FinalizeParams p) {
  const StateView& s = p.state;
  const int64_t rows = s.batch * s.heads * s.len;
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; row < rows;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    const RowIndex r = row_index(s, row);
    const float* o = state_o_row(s, r.b, r.h, r.t);
    T* out = static_cast<T*>(p.out.data) + view_offset(p.out, r.b, r.h, r.t);
#pragma unroll 4
    for (int64_t d = lane; d < s.dim; d += 32) out[d] = cast_from_float<T>(o[d]);
  }
}

__global__ void __launch_bounds__(kThreads) fill_empty_kernel(const StateView s) {
  const int64_t rows = s.batch * s.heads * s.len;
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; row < rows;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    const RowIndex r = row_index(s, row);
    float* o = state_o_row(s, r.b, r.h, r.t);
    for (int64_t d = lane; d < s.dim; d += 32) o[d] = 0.f;
    if (lane == 0) *state_lse_at(s, r.b, r.h, r.t) = neg_inf();
  }
}

// One warp per row of `dst` (b, h, t): dst := 0 when `src` is null, else dst += src.
__global__ void __launch_bounds__(kThreads) zero_or_add_f32_kernel(const TensorView dst, const TensorView src,
                                                                    bool add) {
  const int64_t rows = dst.batch * dst.heads * dst.len;
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; row < rows;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    const int64_t t = row % dst.len, bh = row / dst.len, h = bh % dst.heads, b = bh / dst.heads;
    float* d = static_cast<float*>(dst.data) + view_offset(dst, b, h, t);
    if (!add) {
      for (int64_t i = lane; i < dst.dim; i += 32) d[i] = 0.f;
      continue;
    }
    const float* s = static_cast<const float*>(src.data) + view_offset(src, b, h, t);
    for (int64_t i = lane; i < dst.dim; i += 32) d[i] += s[i];
  }
}

unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }
// Row-per-warp kernels: enough CTAs to fill the GPU several times over, grid-stride beyond that.
unsigned grid_stride_row_blocks(int64_t rows) {
  const int64_t b = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  return unsigned(b < (1 << 16) ? (b > 0 ? b : 1) : (1 << 16));
}

// merge_splits_kernel<T>, launched programmatically (launch_programmatic): its CTAs may be
// scheduled while the kernel that writes the partials (decode, which allows it once its CTAs are
// past their key loops) is still running, so the launch gap between the two is hidden; the
// kernel's pdl_wait_for_prior_grid keeps it correct.
template <typename T>
void launch_merge_splits_instance(const MergeSplitsParams& p, cudaStream_t stream) {
  RA_CHECK_CUDA(launch_programmatic(merge_splits_kernel<T>, dim3(unsigned(p.parts.rows)), dim3(kSplitThreads), 0,
                                    stream, p));
}

}  // namespace

void launch_merge(const MergeParams& p, cudaStream_t stream) {
  const int64_t rows = p.state.batch * p.state.heads * p.state.len;
  if (rows == 0) return;
  merge_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(p);
  RA_CHECK_CUDA_LAUNCH("merge_kernel");
}

void launch_merge_splits(const MergeSplitsParams& p, cudaStream_t stream) {
  if (p.parts.rows == 0) return;
  switch (p.out.data == nullptr ? DType::F32 : p.out.dtype) {
    case DType::F32: launch_merge_splits_instance<float>(p, stream); break;
    case DType::F16: launch_merge_splits_instance<__half>(p, stream); break;
    case DType::BF16: launch_merge_splits_instance<__nv_bfloat16>(p, stream); break;
    default: fail_no_instance("merge_splits_kernel", "out dtype", int(p.out.dtype), "fp32, fp16 and bf16");
  }
  RA_CHECK_CUDA_LAUNCH("merge_splits_kernel");
}

void launch_finalize(const FinalizeParams& p, cudaStream_t stream) {
  const int64_t rows = p.state.batch * p.state.heads * p.state.len;
  if (rows == 0 || p.state.dim == 0) return;
  const unsigned blocks = grid_stride_row_blocks(rows);
  switch (p.out.dtype) {
    case DType::F32: finalize_kernel<float><<<blocks, kThreads, 0, stream>>>(p); break;
    case DType::F16: finalize_kernel<__half><<<blocks, kThreads, 0, stream>>>(p); break;
    case DType::BF16: finalize_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(p); break;
    default: fail_no_instance("launch_finalize", "dtype", int(p.out.dtype), "f32, f16 and bf16");
  }
  RA_CHECK_CUDA_LAUNCH("finalize_kernel");
}

void launch_zero_f32(const TensorView& x, cudaStream_t stream) {
  const int64_t rows = x.batch * x.heads * x.len;
  if (rows == 0 || x.dim == 0) return;
  zero_or_add_f32_kernel<<<grid_stride_row_blocks(rows), kThreads, 0, stream>>>(x, x, false);
  RA_CHECK_CUDA_LAUNCH("zero_or_add_f32_kernel (zero)");
}

void launch_add_f32(const TensorView& dst, const TensorView& src, cudaStream_t stream) {
  const int64_t rows = dst.batch * dst.heads * dst.len;
  if (rows == 0 || dst.dim == 0) return;
  zero_or_add_f32_kernel<<<grid_stride_row_blocks(rows), kThreads, 0, stream>>>(dst, src, true);
  RA_CHECK_CUDA_LAUNCH("zero_or_add_f32_kernel (add)");
}

void launch_fill_empty(const StateView& s, cudaStream_t stream) {
  const int64_t rows = s.batch * s.heads * s.len;
  if (rows == 0) return;
  fill_empty_kernel<<<grid_stride_row_blocks(rows), kThreads, 0, stream>>>(s);
  RA_CHECK_CUDA_LAUNCH("fill_empty_kernel");
}

}  // namespace ringattn::cuda
