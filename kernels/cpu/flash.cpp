// Tiled flash forward on the CPU. Each (batch, head, query tile) keeps the running softmax state
// (m, l, acc) for its rows in fp32 and streams the visible key tiles through it; acc is normalized
// once at the end. Key tiles are classified against the query tile: fully visible tiles pay no
// masking cost, invisible tiles are never loaded.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

namespace ringattn::cpu {
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
  return t.tq * D + D * t.tk + t.tk * D + t.tk + t.tq * D + 2 * t.tq;
}

// Widens rows [r0, r0 + n) of (b, h) into dst[n][D].
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

// Widens rows [r0, r0 + n) of (b, h) into dst[D][ld] (transposed) so that score rows vectorize.
void load_rows_transposed(const TensorView& x, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t ld, float* dst) {
  const int64_t D = x.dim;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t off = x.offset(b, h, r0 + r);
    for (int64_t d = 0; d < D; ++d) dst[d * ld + r] = load_as_float(x.data, x.dtype, off + d);
  }
}

// One (b, h, query tile) work item.
void flash_tile(const FlashParams& p, const Tiles& t, int64_t b, int64_t h, int64_t i0, float* ws) {
  const int64_t D = p.q.dim, T = p.q.len, S = p.k.len;
  const int64_t nq = std::min(t.tq, T - i0);
  const int64_t hk = h / (p.q.heads / p.k.heads);

  float* qf = ws;                // [tq][D], pre-scaled
  float* kt = qf + t.tq * D;     // [D][tk]
  float* vf = kt + D * t.tk;     // [tk][D]
  float* s = vf + t.tk * D;      // [tk]
  float* acc = s + t.tk;         // [tq][D]
  float* m = acc + t.tq * D;     // [tq]
  float* l = m + t.tq;           // [tq]

  load_rows(p.q, b, h, i0, nq, qf);
  for (int64_t x = 0; x < nq * D; ++x) qf[x] *= p.scale;
  std::fill(acc, acc + nq * D, 0.f);
  std::fill(m, m + nq, kNegInf);
  std::fill(l, l + nq, 0.f);

  // Keys beyond the last visible key of the tile's last row are never loaded.
  int64_t kend = S;
  if (p.causal) kend = std::clamp<int64_t>(i0 + nq - 1 + p.q_offset + 1, 0, S);

  for (int64_t j0 = 0; j0 < kend; j0 += t.tk) {
    const int64_t nk = std::min(t.tk, kend - j0);
    const bool full = !p.causal || (j0 + nk - 1 <= i0 + p.q_offset);
    load_rows_transposed(p.k, b, hk, j0, nk, t.tk, kt);
    load_rows(p.v, b, hk, j0, nk, vf);
    for (int64_t r = 0; r < nq; ++r) {
      // Visible keys of this row inside the tile: all of them for a fully visible tile.
      const int64_t lim = full ? nk : std::clamp<int64_t>(i0 + r + p.q_offset - j0 + 1, 0, nk);
      if (lim == 0) continue;
      const float* qr = qf + r * D;
      std::fill(s, s + lim, 0.f);
      for (int64_t d = 0; d < D; ++d) {
        const float qd = qr[d];
        const float* krow = kt + d * t.tk;
#pragma omp simd
        for (int64_t c = 0; c < lim; ++c) s[c] += qd * krow[c];
      }
      online_softmax_step(m[r], l[r], acc + r * D, s, lim, vf, D);
    }
  }

  // Normalize once, then write or fold into the state.
  const StateView& st = p.state;
  for (int64_t r = 0; r < nq; ++r) {
    float* o_row = st.o + b * st.o_stride_b + h * st.o_stride_h + (i0 + r) * st.o_stride_t;
    float* lse_row = st.lse + b * st.lse_stride_b + h * st.lse_stride_h + (i0 + r);
    float* ar = acc + r * D;
    float lse = kNegInf;
    if (l[r] > 0.f) {
      const float inv = 1.f / l[r];
      for (int64_t d = 0; d < D; ++d) ar[d] *= inv;
      lse = m[r] + std::log(l[r]);
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

void online_softmax_step(float& m, float& l, float* acc, float* s, int64_t n, const float* v, int64_t D) {
  float mt = kNegInf;
  for (int64_t c = 0; c < n; ++c) mt = std::max(mt, s[c]);
  const float m_new = std::max(m, mt);
  if (m_new == kNegInf) return;  // every score masked: nothing to add, and no (-inf) - (-inf)
  const float alpha = m == kNegInf ? 0.f : std::exp(m - m_new);
  float sum = 0.f;
  for (int64_t c = 0; c < n; ++c) {
    s[c] = std::exp(s[c] - m_new);
    sum += s[c];
  }
  l = l * alpha + sum;
  m = m_new;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
  for (int64_t c = 0; c < n; ++c) {
    const float pc = s[c];
    const float* vr = v + c * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] += pc * vr[d];
  }
}

size_t flash_workspace_bytes(const FlashParams& p, int threads) {
  return static_cast<size_t>(workspace_floats(tiles_of(p), p.q.dim)) * sizeof(float) * static_cast<size_t>(threads);
}

size_t last_flash_workspace_bytes() { return g_last_workspace; }

void flash_forward(const FlashParams& p) {
  validate_flash(p, /*complete=*/false);
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
