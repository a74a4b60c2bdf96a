// Flash backward on the CUDA SIMT cores: the portable path for every dtype (bf16, fp16, fp32
// inputs; fp32 arithmetic and accumulation), for head dims up to kBackwardMaxHeadDim. The
// probabilities are recomputed from the forward's lse and never stored:
//   D_i = dout_i . o_i (a pass of its own),  P = exp(scale q.k - lse),  dP = dout . v,
//   dS = P (dP - D),  dv += P dout,  dk += scale dS q,  dq += scale dS k.
// The key kernel gives each warp kKeysPerWarp keys of one (batch, kv head), whose K, V and dK, dV
// stay in registers while the warp walks the query rows of the group's heads that may see them
// (core/mask.hpp visible_rows_of_keys: the rows between the causal edge and a window's lower edge); query tiles
// of kRowTile rows that see none of the CTA's keys are skipped (classify_block).
// dq: fast mode adds each warp's share with fp32 atomics from the key kernel; deterministic mode
// runs a separate pass, one warp per query row over its visible keys in order (no atomics, so
// bitwise reproducible). Every lane of a warp works on the same row and key, so the warp-wide
// reductions never diverge.
// Only visible pairs are visited, so a NaN or Inf at a masked position reaches no gradient: the
// tensor-core paths hand a call whose inputs hold one to these kernels (launch_nonfinite_scan and
// BackwardGate, decided on the device), so every path keeps that rule.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/exact_row.cuh"  // to_float
#include "kernels/cuda/bwd_common.cuh"

namespace ringattn::cuda {
namespace {

constexpr int kWarps = 4;         // warps per CTA
constexpr int kKeysPerWarp = 4;   // keys a warp holds in registers
constexpr int kKeysPerCta = kWarps * kKeysPerWarp;
constexpr int64_t kRowTile = 64;  // query rows classified against the CTA's keys at once

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// r[e] = row[lane + 32 e] widened to fp32 (0 past the head dim).
template <typename T, int kPer>
__device__ __forceinline__ void load_row(float (&r)[kPer], const T* row, int64_t D, int lane) {
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t d = lane + 32 * e;
    r[e] = d < D ? to_float(row[d]) : 0.f;
  }
}

template <int kPer>
__device__ __forceinline__ float warp_dot(const float (&a)[kPer], const float (&b)[kPer]) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) s = fmaf(a[e], b[e], s);
  return warp_sum(s);
}

// Writes (Write) or adds (Accumulate) r into an fp32 gradient row.
template <int kPer>
__device__ __forceinline__ void store_row(float* row, const float (&r)[kPer], int64_t D, int lane, GradMode mode) {
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < D) row[d] = mode == GradMode::Accumulate ? row[d] + r[e] : r[e];
  }
}

// One query row as the gradient needs it.
template <int kPer>
struct QueryRow {
  float q[kPer], dout[kPer];
  float lse, delta;
};

template <typename T, int kPer>
__device__ __forceinline__ void load_query(QueryRow<kPer>& r, const BackwardParams& p, const float* delta, int64_t b,
                                           int64_t h, int64_t i, int lane) {
  load_row<T, kPer>(r.q, static_cast<const T*>(p.q.data) + view_offset(p.q, b, h, i), p.q.dim, lane);
  load_row<T, kPer>(r.dout, static_cast<const T*>(p.dout.data) + view_offset(p.dout, b, h, i), p.q.dim, lane);
  r.delta = delta[(b * p.q.heads + h) * p.q.len + i];
}

// (P, dS) of a row against one key.
template <int kPer>
__device__ __forceinline__ float2 prob_and_grad(const QueryRow<kPer>& r, const float (&k)[kPer], const float (&v)[kPer],
                                                float scale) {
  const float pr = expf(scale * warp_dot(r.q, k) - r.lse);
  return make_float2(pr, pr * (warp_dot(r.dout, v) - r.delta));
}

// The rows of (batch, head) blockIdx.y that this warp takes, one at a time: blockIdx.x's row and
// every gridDim.x * kWarps-th after it (the grid may be capped, see grid_of).
#define RA_FOR_WARP_ROWS(i, len) \
  for (int64_t i = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; i < (len); i += int64_t(gridDim.x) * kWarps)

// D_i = dout_i . o_i, one warp per row; grid (<= ceil(T / kWarps), B * Hq). nonfinite (the
// tensor-core paths' flag, or null): set when a D is not finite, which a NaN or an Inf in dout
// (or o) makes it, so that the non-finite scan need not read dout.
template <typename T, int kPer>
__global__ void __launch_bounds__(32 * kWarps) bwd_delta_kernel(const BackwardParams p, float* delta,
                                                                const BackwardGate gate, int* nonfinite) {
  if (gate_shut(gate)) return;
  const int lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y / p.q.heads, h = blockIdx.y % p.q.heads;
  RA_FOR_WARP_ROWS(i, p.q.len) {
    float o[kPer], dout[kPer];
    load_row<T, kPer>(o, static_cast<const T*>(p.o.data) + view_offset(p.o, b, h, i), p.q.dim, lane);
    load_row<T, kPer>(dout, static_cast<const T*>(p.dout.data) + view_offset(p.dout, b, h, i), p.q.dim, lane);
    const float s = warp_dot(o, dout);
    if (lane == 0) delta[(b * p.q.heads + h) * p.q.len + i] = s;
    if (nonfinite != nullptr && lane == 0 && !isfinite(s)) *nonfinite = 1;
  }
}

// Zeroes every row of an fp32 view (dq before the atomics of a Write call); grid as the delta's.
__global__ void __launch_bounds__(32 * kWarps) zero_rows_kernel(const TensorView g, const BackwardGate gate) {
  if (gate_shut(gate)) return;
  RA_FOR_WARP_ROWS(i, g.len) {
    float* row = grad_row(g, blockIdx.y / g.heads, blockIdx.y % g.heads, i);
    for (int64_t d = threadIdx.x % 32; d < g.dim; d += 32) row[d] = 0.f;
  }
}

// dk and dv of the kKeysPerCta keys from cta_j0 of one (b, kv head) (and, kAtomicDq, dq's share
// of them).
template <typename T, int kPer, bool kAtomicDq>
__device__ __forceinline__ void keys_block(const BackwardParams& p, const float* delta, int64_t b, int64_t hk,
                                           int64_t cta_j0) {
  const int lane = threadIdx.x % 32;
  const int64_t S = p.k.len, Tq = p.q.len, D = p.q.dim, group = p.q.heads / p.k.heads;
  const int64_t cta_keys = min64(kKeysPerCta, S - cta_j0);
  const int64_t j0 = cta_j0 + (threadIdx.x / 32) * kKeysPerWarp;
  float k[kKeysPerWarp][kPer], v[kKeysPerWarp][kPer], dk[kKeysPerWarp][kPer], dv[kKeysPerWarp][kPer];
#pragma unroll
  for (int c = 0; c < kKeysPerWarp; ++c) {
    const int64_t j = min64(j0 + c, S - 1);  // keys past S are loaded as the last key and never used
    load_row<T, kPer>(k[c], static_cast<const T*>(p.k.data) + view_offset(p.k, b, hk, j), D, lane);
    load_row<T, kPer>(v[c], static_cast<const T*>(p.v.data) + view_offset(p.v, b, hk, j), D, lane);
#pragma unroll
    for (int e = 0; e < kPer; ++e) dk[c][e] = dv[c][e] = 0.f;
  }
  const KeyRange row_range = visible_rows_of_keys(p.mask, cta_j0, cta_keys, Tq);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const float* lse = p.lse.row(b, h);
    for (int64_t i0 = row_range.begin; i0 < row_range.end; i0 += kRowTile) {
      const int64_t rows = min64(kRowTile, row_range.end - i0);
      const BlockVisibility vis = classify_block(p.mask, i0, rows, cta_j0, cta_keys);
      if (vis == BlockVisibility::Empty) continue;
      for (int64_t i = i0; i < i0 + rows; ++i) {
        QueryRow<kPer> r;
        r.lse = lse[i];
        if (r.lse == neg_inf()) continue;  // a row that sees no key contributes nothing
        load_query<T, kPer>(r, p, delta, b, h, i, lane);
        float dq[kPer] = {};
#pragma unroll
        for (int c = 0; c < kKeysPerWarp; ++c) {
          if (j0 + c >= S || (vis != BlockVisibility::Full && !is_visible(p.mask, i, j0 + c))) continue;
          const float2 g = prob_and_grad(r, k[c], v[c], p.scale);
          const float ds = p.scale * g.y;
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            dv[c][e] = fmaf(g.x, r.dout[e], dv[c][e]);
            dk[c][e] = fmaf(ds, r.q[e], dk[c][e]);
            if (kAtomicDq) dq[e] = fmaf(ds, k[c][e], dq[e]);
          }
        }
        if (kAtomicDq) {
          float* row = grad_row(p.dq, b, h, i);
#pragma unroll
          for (int e = 0; e < kPer; ++e)
            if (lane + 32 * e < D && dq[e] != 0.f) atomicAdd(row + lane + 32 * e, dq[e]);
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kKeysPerWarp; ++c) {
    if (j0 + c >= S) continue;
    store_row(grad_row(p.dk, b, hk, j0 + c), dk[c], D, lane, p.mode);
    store_row(grad_row(p.dv, b, hk, j0 + c), dv[c], D, lane, p.mode);
  }
}

// keys_block over the key blocks of (b, kv head) blockIdx.y: blockIdx.x's and every gridDim.x-th
// after it; grid (<= ceil(S / kKeysPerCta), B * Hkv).
template <typename T, int kPer, bool kAtomicDq>
__global__ void __launch_bounds__(32 * kWarps) bwd_keys_kernel(const BackwardParams p, const float* delta,
                                                               const BackwardGate gate) {
  if (gate_shut(gate)) return;
  const int64_t b = blockIdx.y / p.k.heads, hk = blockIdx.y % p.k.heads;
  for (int64_t j0 = int64_t(blockIdx.x) * kKeysPerCta; j0 < p.k.len; j0 += int64_t(gridDim.x) * kKeysPerCta)
    keys_block<T, kPer, kAtomicDq>(p, delta, b, hk, j0);
}

// Deterministic dq: one warp per query row over its visible keys in order; grid as the delta's.
template <typename T, int kPer>
__device__ __forceinline__ void dq_row(const BackwardParams& p, const float* delta, int64_t b, int64_t h, int64_t i) {
  const int lane = threadIdx.x % 32;
  const int64_t hk = h / (p.q.heads / p.k.heads), D = p.q.dim;
  float dq[kPer] = {};
  QueryRow<kPer> r;
  r.lse = p.lse.row(b, h)[i];
  if (r.lse != neg_inf()) {
    load_query<T, kPer>(r, p, delta, b, h, i, lane);
    const KeyRange keys = visible_range(p.mask, i, p.k.len);
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      float k[kPer], v[kPer];
      load_row<T, kPer>(k, static_cast<const T*>(p.k.data) + view_offset(p.k, b, hk, j), D, lane);
      load_row<T, kPer>(v, static_cast<const T*>(p.v.data) + view_offset(p.v, b, hk, j), D, lane);
      const float ds = p.scale * prob_and_grad(r, k, v, p.scale).y;
#pragma unroll
      for (int e = 0; e < kPer; ++e) dq[e] = fmaf(ds, k[e], dq[e]);
    }
  }
  store_row(grad_row(p.dq, b, h, i), dq, D, lane, p.mode);
}

template <typename T, int kPer>
__global__ void __launch_bounds__(32 * kWarps) bwd_dq_kernel(const BackwardParams p, const float* delta,
                                                             const BackwardGate gate) {
  if (gate_shut(gate)) return;
  const int64_t b = blockIdx.y / p.q.heads, h = blockIdx.y % p.q.heads;
  RA_FOR_WARP_ROWS(i, p.q.len) dq_row<T, kPer>(p, delta, b, h, i);
}

#undef RA_FOR_WARP_ROWS

// A gated launch's grid: x capped so that the whole grid is about one wave (kGatedCtas CTAs), as
// the kernels loop over the rows or key blocks that a capped grid leaves.
constexpr unsigned kGatedCtas = 2048;

dim3 grid_of(int64_t blocks, int64_t batch_heads, const BackwardGate& gate) {
  int64_t x = blocks;
  if (gate.flag != nullptr) x = std::min<int64_t>(x, std::max<int64_t>(1, kGatedCtas / batch_heads));
  return dim3(unsigned(std::max<int64_t>(x, 1)), unsigned(batch_heads));
}

dim3 rows_grid_of(const BackwardParams& p, const BackwardGate& gate) {
  return grid_of((p.q.len + kWarps - 1) / kWarps, p.q.batch * p.q.heads, gate);
}

template <typename T, int kPer>
void launch_delta(const BackwardParams& p, float* delta, cudaStream_t stream, const BackwardGate& gate,
                  int* nonfinite = nullptr) {
  bwd_delta_kernel<T, kPer><<<rows_grid_of(p, gate), 32 * kWarps, 0, stream>>>(p, delta, gate, nonfinite);
  RA_CHECK_CUDA_LAUNCH("bwd_delta_kernel");
}

template <typename T, int kPer>
void launch_typed(const BackwardParams& p, bool atomic_dq, float* delta, cudaStream_t stream,
                  const BackwardGate& gate) {
  const dim3 rows_grid = rows_grid_of(p, gate);
  const dim3 keys_grid = grid_of((p.k.len + kKeysPerCta - 1) / kKeysPerCta, p.k.batch * p.k.heads, gate);
  launch_delta<T, kPer>(p, delta, stream, gate);
  if (atomic_dq) {
    if (p.mode == GradMode::Write) {
      zero_rows_kernel<<<rows_grid, 32 * kWarps, 0, stream>>>(p.dq, gate);
      RA_CHECK_CUDA_LAUNCH("zero_rows_kernel");
    }
    bwd_keys_kernel<T, kPer, true><<<keys_grid, 32 * kWarps, 0, stream>>>(p, delta, gate);
    RA_CHECK_CUDA_LAUNCH("bwd_keys_kernel");
    return;
  }
  bwd_keys_kernel<T, kPer, false><<<keys_grid, 32 * kWarps, 0, stream>>>(p, delta, gate);
  RA_CHECK_CUDA_LAUNCH("bwd_keys_kernel");
  bwd_dq_kernel<T, kPer><<<rows_grid, 32 * kWarps, 0, stream>>>(p, delta, gate);
  RA_CHECK_CUDA_LAUNCH("bwd_dq_kernel");
}

template <typename T>
void launch_dim(const BackwardParams& p, bool atomic_dq, float* delta, cudaStream_t stream, const BackwardGate& gate) {
  const int64_t per = (p.q.dim + 31) / 32;
  if (per <= 1) launch_typed<T, 1>(p, atomic_dq, delta, stream, gate);
  else if (per <= 2) launch_typed<T, 2>(p, atomic_dq, delta, stream, gate);
  else if (per <= 4) launch_typed<T, 4>(p, atomic_dq, delta, stream, gate);
  else if (per <= 8) launch_typed<T, 8>(p, atomic_dq, delta, stream, gate);
  else fail_no_instance("launch_backward_simt", "head_dim", p.q.dim, "1..256");
}

// ---- the non-finite scan: the gate between the tensor-core and the exact backward ----

constexpr int kScanThreads = 256;
constexpr int64_t kScanPasses = 4;  // row passes per CTA (loads in flight per thread)

// Whether one of the eight 16-bit values of w has an all-ones exponent (kExp: 0x7f80 for bf16,
// 0x7c00 for fp16): a NaN or an Inf.
template <uint32_t kExp>
__device__ __forceinline__ bool chunk_not_finite(const uint4 w) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  bool bad = false;
#pragma unroll
  for (int e = 0; e < 4; ++e)
    bad |= (words[e] & kExp) == kExp || (words[e] & (kExp << 16)) == (kExp << 16);
  return bad;
}

// grid x: one CTA per (tensor, batch, head) of q (B * Hq), then k, v (B * Hkv each); dout is the
// delta kernel's to check (launch_backward_delta). grid y: the CTAs that share its rows. Each
// thread reads one 16-byte chunk of a row per pass.
template <uint32_t kExp>
__global__ void __launch_bounds__(kScanThreads) nonfinite_scan_kernel(const BackwardParams p, int* flag) {
  const int64_t nq = p.q.batch * p.q.heads, nk = p.k.batch * p.k.heads;
  int64_t bh = blockIdx.x;
  TensorView t = p.q;
  if (bh >= nq) {
    bh -= nq;
    t = bh < nk ? p.k : p.v;
    bh = bh < nk ? bh : bh - nk;
  }
  const int chunks = int(t.dim / 8), rows = kScanThreads / chunks;
  const int row = threadIdx.x / chunks, chunk = threadIdx.x % chunks;
  if (row >= rows) return;
  const uint16_t* base = static_cast<const uint16_t*>(t.data) + view_offset(t, bh / t.heads, bh % t.heads, 0);
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.y) * rows + row; i < t.len; i += int64_t(gridDim.y) * rows)
    bad |= chunk_not_finite<kExp>(__ldg(reinterpret_cast<const uint4*>(base + i * t.stride_t) + chunk));
  if (bad) *flag = 1;
}

// The scan's preconditions, those of the tensor-core paths that it serves.
void check_scannable(const char* name, const TensorView& t) {
  const bool aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.stride_b % 8 == 0 && t.stride_h % 8 == 0 &&
                       t.stride_t % 8 == 0;
  if (t.dtype != DType::BF16 && t.dtype != DType::F16)
    fail_no_instance("launch_nonfinite_scan", name, static_cast<long long>(t.dtype), "bf16, fp16");
  if (t.dim % 8 != 0 || t.dim / 8 > kScanThreads)
    fail_no_instance("launch_nonfinite_scan", name, t.dim, "head dims in multiples of 8 up to 2048");
  if (!aligned) fail_no_instance("launch_nonfinite_scan", name, t.stride_t, "16-byte aligned views, strides in multiples of 8");
}

}  // namespace

void launch_backward_delta(const BackwardParams& p, float* delta, cudaStream_t stream, int* nonfinite) {
  const int64_t per = (p.q.dim + 31) / 32;
  const bool bf16 = p.q.dtype == DType::BF16;
  if (p.q.dtype != DType::BF16 && p.q.dtype != DType::F16)
    fail_no_instance("launch_backward_delta", "dtype", static_cast<long long>(p.q.dtype), "bf16, fp16");
  const BackwardGate always{};
  if (per == 2)
    return bf16 ? launch_delta<__nv_bfloat16, 2>(p, delta, stream, always, nonfinite)
                : launch_delta<__half, 2>(p, delta, stream, always, nonfinite);
  if (per == 4)
    return bf16 ? launch_delta<__nv_bfloat16, 4>(p, delta, stream, always, nonfinite)
                : launch_delta<__half, 4>(p, delta, stream, always, nonfinite);
  fail_no_instance("launch_backward_delta", "head_dim", p.q.dim, "33..64 and 97..128");
}

void launch_backward_simt(const BackwardParams& p, bool atomic_dq, float* delta, cudaStream_t stream,
                          BackwardGate gate) {
  switch (p.q.dtype) {
    case DType::F32: return launch_dim<float>(p, atomic_dq, delta, stream, gate);
    case DType::BF16: return launch_dim<__nv_bfloat16>(p, atomic_dq, delta, stream, gate);
    case DType::F16: return launch_dim<__half>(p, atomic_dq, delta, stream, gate);
  }
  fail_no_instance("launch_backward_simt", "dtype", static_cast<long long>(p.q.dtype), "fp32, bf16, fp16");
}

void launch_nonfinite_scan(const BackwardParams& p, int* flag, cudaStream_t stream) {
  check_scannable("q", p.q);
  check_scannable("k", p.k);
  check_scannable("v", p.v);
  RA_CHECK_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), stream));
  const int64_t tensors = p.q.batch * p.q.heads + 2 * p.k.batch * p.k.heads;
  const int64_t rows = kScanThreads / (p.q.dim / 8), len = std::max(p.q.len, p.k.len);
  const int64_t y = std::min<int64_t>(65535, std::max<int64_t>(1, (len + rows * kScanPasses - 1) / (rows * kScanPasses)));
  if (tensors > 0x7fffffff) fail_no_instance("launch_nonfinite_scan", "(tensor, head) pairs", tensors, "up to 2^31 - 1");
  const dim3 grid{unsigned(tensors), unsigned(y)};
  if (p.q.dtype == DType::BF16) nonfinite_scan_kernel<0x7f80u><<<grid, kScanThreads, 0, stream>>>(p, flag);
  else nonfinite_scan_kernel<0x7c00u><<<grid, kScanThreads, 0, stream>>>(p, flag);
  RA_CHECK_CUDA_LAUNCH("nonfinite_scan_kernel");
}

}  // namespace ringattn::cuda
