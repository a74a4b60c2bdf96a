// Pieces of the CPU engine shared by the forward (flash.cpp) and the backward
// (flash_backward.cpp): widening rows of a view into fp32 tiles, and a vectorizable exp. Internal
// to kernels/cpu (not installed).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/types.hpp"

namespace ringattn::cpu {

// Widens rows [r0, r0 + n) of (b, h) of `x` into dst[n][D].
void load_rows(const TensorView& x, int64_t b, int64_t h, int64_t r0, int64_t n, float* dst);

// exp(x) for x <= 0 in a form the compiler vectorizes (libm's expf is a scalar call): x = n ln2 + r
// with |r| <= ln2/2, exp(r) by its Taylor polynomial to degree 7 (relative error < 2e-8, under one
// fp32 ulp), times 2^n built in the exponent bits. Arguments below -87 give 0. (Small positive
// arguments, a rounding above 0, are exact too.)
inline float exp_nonpositive(float x) {
  const float kLog2e = 1.44269504f, kLn2Hi = 0.693145752f, kLn2Lo = 1.42860677e-6f;
  const float xc = std::max(x, -87.f);
  const float n = std::nearbyint(xc * kLog2e);
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -87.f ? 0.f : p * scale;
}

}  // namespace ringattn::cpu
