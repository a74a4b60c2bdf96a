// Core value types shared by every backend and transport: strided tensor views, the fp32 softmax
// state (o, lse) and the host conversions between the dtypes (core/dtype.hpp, the dtype table)
// and float. Plain structs, passed by value to kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"

namespace ringattn {

// A [batch, heads, len, dim] tensor. The last dimension is contiguous; the other three carry
// strides in elements, so [B,H,T,D] and [B,T,H,D] memory layouts are both views.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t batch = 0, heads = 0, len = 0, dim = 0;
  int64_t stride_b = 0, stride_h = 0, stride_t = 0;

  int64_t offset(int64_t b, int64_t h, int64_t t) const { return b * stride_b + h * stride_h + t * stride_t; }
  int64_t numel() const { return batch * heads * len * dim; }
  // Rows [t0, t0 + n) of this view (same strides).
  TensorView rows(int64_t t0, int64_t n) const {
    TensorView v = *this;
    v.data = static_cast<char*>(data) + t0 * stride_t * dtype_size(dtype);
    v.len = n;
    return v;
  }
};

// Contiguous [B, H, T, D] view over `data`.
inline TensorView bhtd_view(void* data, DType dtype, int64_t b, int64_t h, int64_t t, int64_t d) {
  return TensorView{data, dtype, b, h, t, d, h * t * d, t * d, d};
}
// [B, T, H, D] memory seen as a [B, H, T, D] view.
inline TensorView bthd_view(void* data, DType dtype, int64_t b, int64_t h, int64_t t, int64_t d) {
  return TensorView{data, dtype, b, h, t, d, t * h * d, d, h * d};
}

// The partial softmax state over some set of keys, fp32: o [batch, heads, len, dim] is the
// normalized output, lse [batch, heads, len] the natural-log sum of exp(scores). The empty state
// (no key seen) is o = 0, lse = -inf. Strides in elements; lse rows are contiguous along len.
struct StateView {
  float* o = nullptr;
  float* lse = nullptr;
  int64_t batch = 0, heads = 0, len = 0, dim = 0;
  int64_t o_stride_b = 0, o_stride_h = 0, o_stride_t = 0;
  int64_t lse_stride_b = 0, lse_stride_h = 0;

  StateView rows(int64_t t0, int64_t n) const {
    StateView s = *this;
    s.o += t0 * o_stride_t;
    s.lse += t0;
    s.len = n;
    return s;
  }
};

// Contiguous state view: o [B,H,T,D], lse [B,H,T].
inline StateView contiguous_state(float* o, float* lse, int64_t b, int64_t h, int64_t t, int64_t d) {
  return StateView{o, lse, b, h, t, d, h * t * d, t * d, d, h * t, t};
}

// ---- host-side half-precision conversions (round to nearest even) ----

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do { mant <<= 1; ++e; } while ((mant & 0x400u) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {                                  // result is subnormal or zero
    if (ax < 0x33000000u) return sign;                     // below half the smallest subnormal
    const uint32_t e = ax >> 23;
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24: scales |f| to units of 2^-24
    uint32_t out = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (out & 1u))) ++out;
    return uint16_t(sign | out);
  }
  uint32_t out = ((ax >> 13) - (112u << 10));
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (out & 1u))) ++out;
  return uint16_t(sign | out);
}

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

// Element `i` of a buffer of dtype `t`, widened to float. The conversions are code, one case per
// row of the dtype table: a new row needs its case here (and in store_from_float).
static_assert(kDTypes.size() == 3, "load_as_float and store_from_float convert every dtype of kDTypes");
inline float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F16: return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  return NAN;
}

inline void store_from_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_fp16(v); break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
  }
}

}  // namespace ringattn
