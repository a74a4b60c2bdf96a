// Tiled flash forward on the CPU. Each (batch, head, query tile) keeps the running softmax state
// (m, l, acc) for its rows in fp32 and streams the visible key tiles through it; acc is normalized
// once at the end. Key tiles are classified against the query tile: fully visible tiles pay no
// masking cost, invisible tiles are never loaded.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/tile_io.hpp"

namespace ringattn::cpu {

void load_rows(const TensorView& x, int64_t b, int64_t h, int64_t r0, int64_t n, float* dst) {
  const int64_t D = x.dim;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t off = x.offset(b, h, r0 + r);
    float* out = dst + r * D;
    if (x.dtype == DType::F32) {
      const float* src = static_cast<const float*>(x.data) + off;
      std::copy(src, src + D, out);
    } else {
      for (int64_t d = 0; d < D; ++d) out[d] = load_as_float(x.data, x.dtype, off + d);
    }
  }
}

int64_t padded(int64_t tk) { return (tk + kLanes - 1) / kLanes * kLanes; }

void load_rows_transposed(const TensorView& x, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t ld, float* dst) {
  const int64_t D = x.dim;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t off = x.offset(b, h, r0 + r);
    for (int64_t d = 0; d < D; ++d) dst[d * ld + r] = load_as_float(x.data, x.dtype, off + d);
  }
}

void score_rows(const float* q, int64_t rb, const float* kt, int64_t ld, int64_t n, int64_t D, float* s) {
  const float* q1 = q + (rb > 1 ? D : 0);
  const float* q2 = q + (rb > 2 ? 2 * D : 0);
  const float* q3 = q + (rb > 3 ? 3 * D : 0);
  for (int64_t c0 = 0; c0 < n; c0 += kLanes) {
    float a0[kLanes] = {}, a1[kLanes] = {}, a2[kLanes] = {}, a3[kLanes] = {};
    for (int64_t d = 0; d < D; ++d) {
      const float* kr = kt + d * ld + c0;
      const float x0 = q[d], x1 = q1[d], x2 = q2[d], x3 = q3[d];
#pragma omp simd
      for (int64_t c = 0; c < kLanes; ++c) {
        a0[c] += x0 * kr[c];
        a1[c] += x1 * kr[c];
        a2[c] += x2 * kr[c];
        a3[c] += x3 * kr[c];
      }
    }
    std::copy(a0, a0 + kLanes, s + c0);
    std::copy(a1, a1 + kLanes, s + ld + c0);
    std::copy(a2, a2 + kLanes, s + 2 * ld + c0);
    std::copy(a3, a3 + kLanes, s + 3 * ld + c0);
  }
}

void accumulate_pv(const float* p, int64_t ld, int64_t rb, int64_t n, const float* v, int64_t D, float* acc) {
  const float* p1 = p + (rb > 1 ? ld : 0);
  const float* p2 = p + (rb > 2 ? 2 * ld : 0);
  const float* p3 = p + (rb > 3 ? 3 * ld : 0);
  int64_t d0 = 0;
  for (; d0 + kLanes <= D; d0 += kLanes) {
    float a0[kLanes], a1[kLanes], a2[kLanes], a3[kLanes];
    for (int64_t d = 0; d < kLanes; ++d) {
      a0[d] = a1[d] = a2[d] = a3[d] = 0.f;
    }
    for (int64_t c = 0; c < n; ++c) {
      const float* vr = v + c * D + d0;
      const float x0 = p[c], x1 = p1[c], x2 = p2[c], x3 = p3[c];
#pragma omp simd
      for (int64_t d = 0; d < kLanes; ++d) {
        a0[d] += x0 * vr[d];
        a1[d] += x1 * vr[d];
        a2[d] += x2 * vr[d];
        a3[d] += x3 * vr[d];
      }
    }
    float* rows[kRows] = {a0, a1, a2, a3};
    for (int64_t r = 0; r < rb; ++r)
      for (int64_t d = 0; d < kLanes; ++d) acc[r * D + d0 + d] += rows[r][d];
  }
  for (; d0 < D; ++d0) {  // head dims that are not a multiple of kLanes
    const float* pr[kRows] = {p, p1, p2, p3};
    for (int64_t r = 0; r < rb; ++r) {
      float x = 0.f;
      for (int64_t c = 0; c < n; ++c) x += pr[r][c] * v[c * D + d0];
      acc[r * D + d0] += x;
    }
  }
}

namespace {

// acc[d] += sum_{c in [c0, c1)} p[c] v[c][d]: one row alone.
void accumulate_row(const float* p, int64_t c0, int64_t c1, const float* v, int64_t D, float* acc) {
  for (int64_t c = c0; c < c1; ++c) {
    const float x = p[c];
    const float* vr = v + c * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] += x * vr[d];
  }
}

}  // namespace

void accumulate_ranges(const float* p, int64_t ld, int64_t rb, const int64_t* lo, const int64_t* hi, const float* v,
                       int64_t D, float* acc) {
  int64_t shared_lo = lo[0], shared_hi = hi[0];  // the keys of every row: [max lo, min hi)
  for (int64_t r = 1; r < rb; ++r) {
    shared_lo = std::max(shared_lo, lo[r]);
    shared_hi = std::min(shared_hi, hi[r]);
  }
  if (shared_lo < shared_hi)
    accumulate_pv(p + shared_lo, ld, rb, shared_hi - shared_lo, v + shared_lo * D, D, acc);
  else
    shared_lo = shared_hi = 0;  // no key in common: every row alone over its whole range
  for (int64_t r = 0; r < rb; ++r) {
    const float* pr = p + r * ld;
    float* ar = acc + r * D;
    if (shared_lo < shared_hi) {
      accumulate_row(pr, lo[r], shared_lo, v, D, ar);
      accumulate_row(pr, shared_hi, hi[r], v, D, ar);
    } else {
      accumulate_row(pr, lo[r], hi[r], v, D, ar);
    }
  }
}

namespace {

thread_local size_t g_last_workspace = 0;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
struct Tiles {
  int64_t tq, tk;
};

Tiles tiles_of(const FlashParams& p) {
  return {p.tile_q > 0 ? p.tile_q : kDefaultTileQ, p.tile_k > 0 ? p.tile_k : kDefaultTileK};
}
// Per-thread workspace, in floats: q tile, transposed k tile, v tile, scores, acc, m, l.
int64_t workspace_floats(const Tiles& t, int64_t D) {
  return t.tq * D + D * padded(t.tk) + t.tk * D + kRows * padded(t.tk) + t.tq * D + 2 * t.tq;
}

// One (b, h, query tile) work item.
void flash_tile(const FlashParams& p, const Tiles& t, int64_t b, int64_t h, int64_t i0, float* ws) {
  const int64_t D = p.q.dim, T = p.q.len, S = p.k.len;
  const int64_t nq = std::min(t.tq, T - i0);
  const int64_t hk = h / (p.q.heads / p.k.heads);

  float* qf = ws;                // [tq][D], pre-scaled
  float* kt = qf + t.tq * D;     // [D][ld]
  const int64_t ld = padded(t.tk);
  float* vf = kt + D * ld;       // [tk][D]
  float* s = vf + t.tk * D;      // [kRows][ld]
  float* acc = s + kRows * ld;   // [tq][D]
  float* m = acc + t.tq * D;     // [tq]
  float* l = m + t.tq;           // [tq]

  load_rows(p.q, b, h, i0, nq, qf);
  for (int64_t x = 0; x < nq * D; ++x) qf[x] *= p.scale;
  std::fill(acc, acc + nq * D, 0.f);
  std::fill(m, m + nq, kNegInf);
  std::fill(l, l + nq, 0.f);

  // Keys outside every row's range (before the first row's window, past the last row's end) are
  // never loaded.
  const KeyRange tile_keys = visible_range_of_rows(p.mask, i0, nq, S);
  const int64_t kend = tile_keys.end;

  for (int64_t j0 = tile_keys.begin; j0 < kend; j0 += t.tk) {
    const int64_t nk = std::min(t.tk, kend - j0);
    const bool full = classify_block(p.mask, i0, nq, j0, nk) == BlockVisibility::Full;
    load_rows_transposed(p.k, b, hk, j0, nk, ld, kt);
    load_rows(p.v, b, hk, j0, nk, vf);
    // Rows in blocks of kRows: each K and V element loaded once serves all rows of the block.
    for (int64_t r0 = 0; r0 < nq; r0 += kRows) {
      const int64_t rb = std::min<int64_t>(kRows, nq - r0);
      int64_t lo[kRows] = {0}, lim[kRows] = {0};
      int64_t lim_max = 0;
      for (int64_t r = 0; r < rb; ++r) {
        // Visible keys [lo, lim) of this row inside the tile: all of them for a fully visible tile.
        if (!full) {
          const KeyRange keys = visible_range(p.mask, i0 + r0 + r, S);
          lo[r] = std::clamp<int64_t>(keys.begin - j0, 0, nk);
          lim[r] = std::max(lo[r], std::clamp<int64_t>(keys.end - j0, 0, nk));
        } else {
          lim[r] = nk;
        }
        lim_max = std::max(lim_max, lim[r]);
      }
      if (lim_max == 0) continue;
      score_rows(qf + r0 * D, rb, kt, ld, lim_max, D, s);
      for (int64_t r = 0; r < rb; ++r)
        softmax_rescale(m[r0 + r], l[r0 + r], acc + (r0 + r) * D, s + r * ld + lo[r], lim[r] - lo[r], D);
      // Each row over its own keys only: a masked key's score (and value) is never read.
      if (full) accumulate_pv(s, ld, rb, nk, vf, D, acc + r0 * D);
      else accumulate_ranges(s, ld, rb, lo, lim, vf, D, acc + r0 * D);
    }
  }

  // Normalize once, then write or fold into the state.
  const StateView& st = p.state;
  for (int64_t r = 0; r < nq; ++r) {
    float* o_row = st.o + b * st.o_stride_b + h * st.o_stride_h + (i0 + r) * st.o_stride_t;
    float* lse_row = st.lse + b * st.lse_stride_b + h * st.lse_stride_h + (i0 + r);
    float* ar = acc + r * D;
    const float lse = lse_from_stats(m[r], l[r]);
    if (l[r] > 0.f) {
      const float inv = 1.f / l[r];
      for (int64_t d = 0; d < D; ++d) ar[d] *= inv;
    }
    if (p.mode == StateMode::Write) {
      std::copy(ar, ar + D, o_row);
      *lse_row = lse;
    } else {
      merge_row(o_row, lse_row, ar, lse, D);
    }
  }
}

}  // namespace

void softmax_rescale(float& m, float& l, float* acc, float* s, int64_t n, int64_t D) {
  float mt = kNegInf;
#pragma omp simd reduction(max : mt)
  for (int64_t c = 0; c < n; ++c) mt = std::max(mt, s[c]);
  float m_new = std::max(m, mt);  // a NaN score is dropped here, and reaches l through its exp
  if (m_new == kNegInf) {
    // Every score so far -inf: nothing to add, and no (-inf) - (-inf); unless one is NaN (std::max
    // dropped it), which must reach the row: m becomes NaN, and so do l and acc.
    bool nan = false;
    for (int64_t c = 0; c < n; ++c) nan |= s[c] != s[c];
    if (!nan) {
      std::fill(s, s + n, 0.f);
      return;
    }
    m_new = std::numeric_limits<float>::quiet_NaN();
  }
  const float alpha = rescale_factor(m, m_new, [](float x) { return std::exp(x); });
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) s[c] = exp_nonpositive(s[c] - m_new);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) sum += s[c];
  l = l * alpha + sum;
  m = m_new;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
}

void online_softmax_step(float& m, float& l, float* acc, float* s, int64_t n, const float* v, int64_t D) {
  softmax_rescale(m, l, acc, s, n, D);
  accumulate_pv(s, n, 1, n, v, D, acc);
}

size_t flash_workspace_bytes(const FlashParams& p, int threads) {
  return static_cast<size_t>(workspace_floats(tiles_of(p), p.q.dim)) * sizeof(float) * static_cast<size_t>(threads);
}

size_t last_flash_workspace_bytes() { return g_last_workspace; }

void flash_forward(const FlashParams& params) {
  validate_flash(params, /*complete=*/false);
  FlashParams p = params;
  p.mask = clamp_offset(p.mask, p.q.len, p.k.len);  // row + offset sums cannot overflow
  const Tiles t = tiles_of(p);
  const int64_t B = p.q.batch, H = p.q.heads, T = p.q.len;
  const int64_t ntiles = (T + t.tq - 1) / t.tq;
  const int64_t items = B * H * ntiles;
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), items)));
  const int64_t per_thread = workspace_floats(t, p.q.dim);
  std::vector<float> ws(static_cast<size_t>(per_thread * threads));
  g_last_workspace = ws.size() * sizeof(float);

#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t it = 0; it < items; ++it) {
    // Longest rows first under causal: query tiles in reverse order.
    const int64_t qt = ntiles - 1 - it % ntiles;
    const int64_t bh = it / ntiles;
    flash_tile(p, t, bh / H, bh % H, qt * t.tq, ws.data() + per_thread * omp_get_thread_num());
  }
}

}  // namespace ringattn::cpu
