// The fp64 oracle every test compares against: plain softmax(q k^T * scale) v per row, with the
// scores materialized and everything accumulated in double.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

namespace ringattn::cpu {

void naive_row(const FlashParams& p, int64_t b, int64_t h, int64_t i, double* o_out, double* lse_out) {
  const int64_t D = p.q.dim, S = p.k.len;
  const int64_t hk = h / (p.q.heads / p.k.heads);
  // The offset clamped first (core/mask.hpp): the same keys, and no overflow for any offset.
  const KeyRange keys = visible_range(clamp_offset(p.mask, p.q.len, S), i, S);
  const int64_t j0 = keys.begin, n = keys.size();
  for (int64_t d = 0; d < D; ++d) o_out[d] = 0.0;
  if (n == 0) {
    *lse_out = -std::numeric_limits<double>::infinity();
    return;
  }
  std::vector<double> s(static_cast<size_t>(n));
  const int64_t qo = p.q.offset(b, h, i);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t ko = p.k.offset(b, hk, j0 + j);
    double acc = 0.0;
    for (int64_t d = 0; d < D; ++d)
      acc += double(load_as_float(p.q.data, p.q.dtype, qo + d)) * double(load_as_float(p.k.data, p.k.dtype, ko + d));
    s[j] = acc * double(p.scale);
    if (s[j] > m) m = s[j];
  }
  double l = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    l += s[j];
  }
  for (int64_t j = 0; j < n; ++j) {
    const int64_t vo = p.v.offset(b, hk, j0 + j);
    const double w = s[j] / l;
    for (int64_t d = 0; d < D; ++d) o_out[d] += w * double(load_as_float(p.v.data, p.v.dtype, vo + d));
  }
  *lse_out = m + std::log(l);
}

Reference naive_attention(const FlashParams& p) {
  const int64_t B = p.q.batch, H = p.q.heads, T = p.q.len, D = p.q.dim;
  Reference r;
  r.o.assign(static_cast<size_t>(B * H * T * D), 0.0);
  r.lse.assign(static_cast<size_t>(B * H * T), 0.0);
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t row = (b * H + h) * T + i;
        naive_row(p, b, h, i, &r.o[static_cast<size_t>(row * D)], &r.lse[static_cast<size_t>(row)]);
      }
  return r;
}

}  // namespace ringattn::cpu
