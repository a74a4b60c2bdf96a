// The fp64 oracles every test compares against: plain softmax(q k^T * scale) v per row, with the
// scores materialized and everything accumulated in double; and its gradient, row by row.
#include <algorithm>
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

// ---- the gradient oracle ----

namespace ringattn::cpu {
namespace {

// Rows [0, n) of (b, h) of `x` widened to double, contiguous [n][D].
std::vector<double> rows_as_double(const TensorView& x, int64_t b, int64_t h, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n * x.dim));
  for (int64_t r = 0; r < n; ++r) {
    const int64_t off = x.offset(b, h, r);
    for (int64_t d = 0; d < x.dim; ++d) out[size_t(r * x.dim + d)] = double(load_as_float(x.data, x.dtype, off + d));
  }
  return out;
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0.0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// One query row i (q_i, do_i) against the keys it sees (k, v: all keys of its kv head): adds its
// share to dq_i (D values), dk and dv ([S][D] of the kv head).
// o_i: the forward's output row to take D from (OracleDelta::FromOutput), or null for the row's
// own fp64 output.
void backward_row(const BackwardParams& p, int64_t i, const double* q_i, const double* do_i, const double* o_i,
                  const double* k, const double* v, double* dq_i, double* dk, double* dv) {
  const int64_t D = p.q.dim, S = p.k.len;
  const double scale = double(p.scale);
  const KeyRange keys = visible_range(clamp_offset(p.mask, p.q.len, S), i, S);
  if (keys.empty()) return;  // o = 0 whatever q, k, v are: no gradient
  // The forward in double: scores, lse, the normalized output o_i.
  std::vector<double> s(static_cast<size_t>(keys.size())), o(static_cast<size_t>(D), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = keys.begin; j < keys.end; ++j) {
    double& sj = s[size_t(j - keys.begin)];
    sj = scale * dot(q_i, k + j * D, D);
    m = std::max(m, sj);
  }
  double l = 0.0;
  for (double& sj : s) l += std::exp(sj - m);
  const double lse = m + std::log(l);
  for (int64_t j = keys.begin; j < keys.end; ++j) {
    const double pj = std::exp(s[size_t(j - keys.begin)] - lse);
    for (int64_t d = 0; d < D; ++d) o[size_t(d)] += pj * v[j * D + d];
  }
  if (o_i != nullptr) std::copy_n(o_i, D, o.begin());
  // D_i = do_i . o_i; per key dP = do_i . v_j, dS = P (dP - D_i).
  const double delta = dot(do_i, o.data(), D);
  for (int64_t j = keys.begin; j < keys.end; ++j) {
    const double pj = std::exp(s[size_t(j - keys.begin)] - lse);
    const double ds = pj * (dot(do_i, v + j * D, D) - delta);
    for (int64_t d = 0; d < D; ++d) {
      dq_i[d] += scale * ds * k[j * D + d];
      dk[j * D + d] += scale * ds * q_i[d];
      dv[j * D + d] += pj * do_i[d];
    }
  }
}

}  // namespace

GradReference naive_backward(const BackwardParams& p, OracleDelta delta) {
  const int64_t B = p.q.batch, Hq = p.q.heads, Hkv = p.k.heads, T = p.q.len, S = p.k.len, D = p.q.dim;
  const int64_t group = Hq / Hkv;
  GradReference g;
  g.dq.assign(static_cast<size_t>(B * Hq * T * D), 0.0);
  g.dk.assign(static_cast<size_t>(B * Hkv * S * D), 0.0);
  g.dv.assign(static_cast<size_t>(B * Hkv * S * D), 0.0);
  // One (batch, kv head) per iteration: its dk and dv are written by it alone.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      const std::vector<double> k = rows_as_double(p.k, b, hk, S), v = rows_as_double(p.v, b, hk, S);
      double* dk = &g.dk[size_t((b * Hkv + hk) * S * D)];
      double* dv = &g.dv[size_t((b * Hkv + hk) * S * D)];
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const std::vector<double> q = rows_as_double(p.q, b, h, T), dout = rows_as_double(p.dout, b, h, T),
                                  o = delta == OracleDelta::FromOutput ? rows_as_double(p.o, b, h, T)
                                                                       : std::vector<double>();
        double* dq = &g.dq[size_t((b * Hq + h) * T * D)];
        for (int64_t i = 0; i < T; ++i)
          backward_row(p, i, &q[size_t(i * D)], &dout[size_t(i * D)], o.empty() ? nullptr : &o[size_t(i * D)],
                       k.data(), v.data(), dq + i * D, dk, dv);
      }
    }
  return g;
}

}  // namespace ringattn::cpu
