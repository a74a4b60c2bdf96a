// One attention call of the op (ARCHITECTURE.md, "The C ABI and the Python package"), in C++ terms:
// views in, Backend::flash / flash_backward calls out. The C ABI (ringattn_c.h) parses DLPack
// descriptors into an AttentionCall and runs it; another C++ host may build one directly.
#pragma once

#include <cstdint>
#include <vector>

#include "core/mask.hpp"
#include "core/types.hpp"
#include "kernels/backend.hpp"

namespace ringattn::op {

// Scratch memory for a call: the caller's allocator, or the backend's own when `allocate` is null.
struct Allocator {
  void* ctx = nullptr;
  void* (*allocate)(void* ctx, size_t bytes, void* stream) = nullptr;
  void (*deallocate)(void* ctx, void* ptr, size_t bytes, void* stream) = nullptr;
  void* stream = nullptr;
};

// The views of one call. Batched: q [B, Hq, T, D], k and v [B, Hkv, S, D] (any strides, the head
// dim contiguous), out like q in q's dtype, lse fp32 with rows contiguous along T. Packed
// (cu non-empty): batch 1, T = S = the total tokens, cu the document boundaries (checked).
struct AttentionCall {
  TensorView q, k, v, out;
  float* lse = nullptr;
  int64_t lse_stride_b = 0, lse_stride_h = 0;
  bool causal = false;
  Window window;
  float scale = 0.f;
  std::vector<int64_t> cu;  // packed documents: cu[0] = 0 <= cu[1] <= ... <= cu[n] = T
  bool deterministic = false;
};

// The gradient views of a backward: dout like q; dq like q, dk and dv like k, all in q's dtype.
struct GradViews {
  TensorView dout, dq, dk, dv;
};

// One kernel call of the op: rows [q0, q0 + rows) of q against keys [k0, k0 + keys) of k under
// `mask` (a batched call is one segment; packed documents one segment each).
struct Segment {
  int64_t q0 = 0, rows = 0, k0 = 0, keys = 0;
  MaskSpec mask;
};
std::vector<Segment> segments(const AttentionCall& c);

// out and lse of the call, on `b` (whose memory the views are in).
void attention_forward(Backend& b, const AttentionCall& c, const Allocator& a);
// dq, dk, dv of sum(dout * out) for the call (out and lse as the forward wrote them).
void attention_backward(Backend& b, const AttentionCall& c, const GradViews& g, const Allocator& a);

}  // namespace ringattn::op
