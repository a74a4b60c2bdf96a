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

inline constexpr int64_t kRows = 4;    // query rows that share each K/V load
inline constexpr int64_t kLanes = 16;  // scores or output columns kept in registers per row

// Widens rows [r0, r0 + n) of (b, h) of `x` into dst[n][D].
void load_rows(const TensorView& x, int64_t b, int64_t h, int64_t r0, int64_t n, float* dst);

// Widens rows [r0, r0 + n) of (b, h) into dst[D][ld] (transposed) so that score rows vectorize.
void load_rows_transposed(const TensorView& x, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t ld, float* dst);

// Row length of a transposed tile and of score rows: n rounded up to whole lanes.
int64_t padded(int64_t n);

// s[r][c] = q_r . k_c for rows r < rb (at most kRows) and keys c < n; k is transposed [D][ld]
// with ld a multiple of kLanes. Each block of kLanes scores of the kRows rows stays in registers
// for the whole dot product; columns past n are computed from stale data and never read. Writes
// kRows rows of s (ld apart) whatever rb is: s must have room for them.
void score_rows(const float* q, int64_t rb, const float* kt, int64_t ld, int64_t n, int64_t D, float* s);

// acc[r] += sum_c p[r][c] v[c] for rows r < rb; p rows are `ld` apart (rows >= rb are never
// read). Each block of kLanes output columns stays in registers over all keys. D is a multiple of
// kLanes or the tail is done lane by lane. Every row reads all n keys: rows with different keys
// go through accumulate_ranges.
void accumulate_pv(const float* p, int64_t ld, int64_t rb, int64_t n, const float* v, int64_t D, float* acc);

// acc[r] += sum_{c in [lo[r], hi[r])} p[r][c] v[c] for rows r < rb (lo[r] <= hi[r]): the keys
// every row has in one register-blocked pass (accumulate_pv), each row's other keys row by row.
// No row reads p or v outside its own range, so a NaN or Inf at a key the row does not see (a
// masked key: its p is not even computed) never reaches it (0 x NaN would be NaN).
void accumulate_ranges(const float* p, int64_t ld, int64_t rb, const int64_t* lo, const int64_t* hi, const float* v,
                       int64_t D, float* acc);

// exp(x) for x <= 0 in a form the compiler vectorizes (libm's expf is a scalar call): x = n ln2 + r
// with |r| <= ln2/2, exp(r) by its Taylor polynomial to degree 7 (relative error < 2e-8, under one
// fp32 ulp), times 2^n built in the exponent bits. Arguments below -87 give 0 (-inf too), above 88
// +inf (+inf too), and NaN gives NaN: a NaN score or lse is never turned into a finite weight.
// (Small positive arguments, a rounding above 0, are exact too.)
inline float exp_nonpositive(float x) {
  const float kLog2e = 1.44269504f, kLn2Hi = 0.693145752f, kLn2Lo = 1.42860677e-6f;
  const float xc = std::min(std::max(x, -87.f), 88.f);  // NaN stays NaN (both compare false)
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
  const float nf = n == n ? n : 0.f;  // a NaN is not converted to an integer; p is NaN then
  const int32_t bits = (static_cast<int32_t>(nf) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -87.f ? 0.f : (x > 88.f ? INFINITY : p * scale);
}

}  // namespace ringattn::cpu
