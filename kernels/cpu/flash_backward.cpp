// Tiled flash backward on the CPU, in fp32 on fp32/fp16/bf16 inputs. The probabilities are
// recomputed from the forward's lse tile by tile (P = exp(scale q.k - lse)) and never stored:
//   D_i = dout_i . o_i (once per row),  dP = dout v^T,  dS = P (dP - D),
//   dv += P^T dout,  dk += scale dS^T q,  dq += scale dS k.
// Two passes, each without atomics (deterministic whatever the threads): dk and dv per (batch,
// kv head, key tile) over every query tile of the group's heads, then dq per (batch, head, query
// tile) over its key tiles. The products run on the forward's register-blocked score_rows and
// accumulate_pv (tile_io.hpp). Blocks are classified through core/mask.hpp: invisible blocks are
// skipped, fully visible ones pay no masking.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/tile_io.hpp"

namespace ringattn::cpu {
namespace {

thread_local size_t g_last_workspace = 0;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Tiles {
  int64_t tq, tk;
};

// 64 x 64 by default: the backward keeps about twice the forward's tiles per thread.
constexpr int64_t kDefaultBackwardTile = 64;

Tiles tiles_of(const BackwardParams& p) {
  return {p.tile_q > 0 ? p.tile_q : kDefaultBackwardTile, p.tile_k > 0 ? p.tile_k : kDefaultBackwardTile};
}

int64_t whole_blocks(int64_t rows) { return (rows + kRows - 1) / kRows * kRows; }

// One thread's tiles, in floats: q and dout [tq][D]; k and v transposed [D][ldk] and k
// [tk][D]; P and dS [tq'][ldk] (tq' = tq in whole blocks of kRows, which score_rows writes);
// P^T and dS^T [tk][ldq]; two accumulators [max(tq, tk)][D] (dk, dv in the first pass; dq in
// the second); the lse and D of the query rows.
struct Work {
  int64_t ldk = 0, ldq = 0;
  float *q, *dout, *kt, *vt, *k, *p, *ds, *pt, *dst, *acc0, *acc1, *lse, *delta;
  Work(float* ws, const Tiles& t, int64_t D) : ldk(padded(t.tk)), ldq(padded(t.tq)) {
    const int64_t acc = std::max(t.tq, t.tk) * D;
    q = ws;
    dout = q + t.tq * D;
    kt = dout + t.tq * D;
    vt = kt + D * ldk;
    k = vt + D * ldk;
    p = k + t.tk * D;
    ds = p + whole_blocks(t.tq) * ldk;
    pt = ds + whole_blocks(t.tq) * ldk;
    dst = pt + t.tk * ldq;
    acc0 = dst + t.tk * ldq;
    acc1 = acc0 + acc;
    lse = acc1 + acc;
    delta = lse + t.tq;
  }
};

// The floats of one Work.
int64_t workspace_floats(const Tiles& t, int64_t D) {
  const int64_t ldk = padded(t.tk), ldq = padded(t.tq);
  return 2 * t.tq * D + 2 * D * ldk + t.tk * D + 2 * whole_blocks(t.tq) * ldk + 2 * t.tk * ldq +
         2 * std::max(t.tq, t.tk) * D + 2 * t.tq;
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Loads keys [j0, j0 + nk) of (b, hk): k and v transposed (for the scores and dP), k row-major
// (for dq).
void load_key_block(const BackwardParams& p, const Work& w, int64_t b, int64_t hk, int64_t j0, int64_t nk) {
  load_rows_transposed(p.k, b, hk, j0, nk, w.ldk, w.kt);
  load_rows_transposed(p.v, b, hk, j0, nk, w.ldk, w.vt);
  load_rows(p.k, b, hk, j0, nk, w.k);
}

// Keys [begin, end) of the tile [j0, j0 + nk), relative to j0, that query row i (its lse l)
// takes part in: all of a fully visible tile, none for a row that saw no key (lse = -inf).
KeyRange tile_keys_of_row(const BackwardParams& p, int64_t i, float l, int64_t j0, int64_t nk, bool full) {
  if (l == kNegInf) return {0, 0};
  if (full) return {0, nk};
  const KeyRange keys = visible_range(p.mask, i, p.k.len);
  const int64_t lo = std::clamp<int64_t>(keys.begin - j0, 0, nk);
  return {lo, std::clamp<int64_t>(keys.end - j0, lo, nk)};
}

// Query rows [begin, end) of the block [i0, i0 + nq), relative to i0, that see key j.
KeyRange block_rows_of_key(const BackwardParams& p, int64_t j, int64_t i0, int64_t nq) {
  const KeyRange rows = visible_rows(p.mask, j, p.q.len);
  const int64_t lo = std::clamp<int64_t>(rows.begin - i0, 0, nq);
  return {lo, std::clamp<int64_t>(rows.end - i0, lo, nq)};
}

// The block of query rows [i0, i0 + nq) (w.q, w.dout, w.lse, w.delta loaded) against keys
// [j0, j0 + nk) (loaded): P and scale * dS into w.p, w.ds ([nq][ldk]); zero where a key is masked
// or the row's lse is -inf (a row that sees no key). The products below read P and dS only inside
// each row's (or key's) range, so a masked entry is never multiplied, not even by 0.
void block_grads(const BackwardParams& p, const Work& w, int64_t i0, int64_t nq, int64_t j0, int64_t nk, bool full) {
  const int64_t D = p.q.dim;
  for (int64_t r0 = 0; r0 < nq; r0 += kRows) {  // scores and dP = dout v^T, kRows rows at a time
    const int64_t rb = std::min(kRows, nq - r0);
    score_rows(w.q + r0 * D, rb, w.kt, w.ldk, nk, D, w.p + r0 * w.ldk);
    score_rows(w.dout + r0 * D, rb, w.vt, w.ldk, nk, D, w.ds + r0 * w.ldk);
  }
  for (int64_t r = 0; r < nq; ++r) {
    float* pr = w.p + r * w.ldk;
    float* dsr = w.ds + r * w.ldk;
    const float l = w.lse[r], delta = w.delta[r];
    const KeyRange keys = tile_keys_of_row(p, i0 + r, l, j0, nk, full);
    const int64_t lo = keys.begin, hi = keys.end;
    std::fill(pr, pr + lo, 0.f);
    std::fill(dsr, dsr + lo, 0.f);
#pragma omp simd
    for (int64_t c = lo; c < hi; ++c) {
      const float pc = exp_nonpositive(p.scale * pr[c] - l);
      pr[c] = pc;
      dsr[c] = p.scale * pc * (dsr[c] - delta);
    }
    std::fill(pr + hi, pr + nk, 0.f);
    std::fill(dsr + hi, dsr + nk, 0.f);
  }
}

// dst[c][r] = src[r][c] for r < rows, c < cols; src rows ld_src apart, dst rows ld_dst apart.
void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

// Adds (Accumulate) or writes (Write) rows [r0, r0 + n) of (b, h) of the fp32 gradient `g`
// from acc[n][D].
void store_grad(const TensorView& g, GradMode mode, int64_t b, int64_t h, int64_t r0, int64_t n, const float* acc) {
  const int64_t D = g.dim;
  for (int64_t r = 0; r < n; ++r) {
    float* dst = static_cast<float*>(g.data) + g.offset(b, h, r0 + r);
    const float* src = acc + r * D;
    if (mode == GradMode::Accumulate) {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dst[d] += src[d];
    } else
      std::copy(src, src + D, dst);
  }
}

// Loads the query block: rows [i0, i0 + n) of (b, h) of q and dout, their lse and D.
void load_query_block(const BackwardParams& p, const std::vector<float>& delta, const Work& w, int64_t b, int64_t h,
                      int64_t i0, int64_t n) {
  load_rows(p.q, b, h, i0, n, w.q);
  load_rows(p.dout, b, h, i0, n, w.dout);
  const float* l = p.lse.row(b, h) + i0;
  std::copy(l, l + n, w.lse);
  const float* dl = delta.data() + (b * p.q.heads + h) * p.q.len + i0;
  std::copy(dl, dl + n, w.delta);
}

// First pass, one (b, kv head hk, key tile j0) item: dk and dv of its keys over every query row
// of the group's heads that sees one of them: dv += P^T dout, dk += (scale dS)^T q.
void key_tile(const BackwardParams& p, const Tiles& t, const std::vector<float>& delta, int64_t b, int64_t hk,
              int64_t j0, float* ws) {
  const int64_t D = p.q.dim, T = p.q.len, S = p.k.len;
  const int64_t nk = std::min(t.tk, S - j0), group = p.q.heads / p.k.heads;
  const Work w(ws, t, D);
  load_key_block(p, w, b, hk, j0, nk);
  float* dk = w.acc0;
  float* dv = w.acc1;
  std::fill(dk, dk + nk * D, 0.f);
  std::fill(dv, dv + nk * D, 0.f);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
    for (int64_t i0 = 0; i0 < T; i0 += t.tq) {
      const int64_t nq = std::min(t.tq, T - i0);
      const BlockVisibility vis = classify_block(p.mask, i0, nq, j0, nk);
      if (vis == BlockVisibility::Empty) continue;
      load_query_block(p, delta, w, b, h, i0, nq);
      block_grads(p, w, i0, nq, j0, nk, vis == BlockVisibility::Full);
      transpose(w.p, w.ldk, nq, nk, w.pt, w.ldq);
      transpose(w.ds, w.ldk, nq, nk, w.dst, w.ldq);
      for (int64_t c0 = 0; c0 < nk; c0 += kRows) {  // kRows keys at a time, each over the rows that see it
        const int64_t cb = std::min(kRows, nk - c0);
        if (vis == BlockVisibility::Full) {
          accumulate_pv(w.pt + c0 * w.ldq, w.ldq, cb, nq, w.dout, D, dv + c0 * D);
          accumulate_pv(w.dst + c0 * w.ldq, w.ldq, cb, nq, w.q, D, dk + c0 * D);
          continue;
        }
        int64_t lo[kRows], hi[kRows];
        for (int64_t c = 0; c < cb; ++c) {
          const KeyRange rows = block_rows_of_key(p, j0 + c0 + c, i0, nq);
          lo[c] = rows.begin;
          hi[c] = rows.end;
        }
        accumulate_ranges(w.pt + c0 * w.ldq, w.ldq, cb, lo, hi, w.dout, D, dv + c0 * D);
        accumulate_ranges(w.dst + c0 * w.ldq, w.ldq, cb, lo, hi, w.q, D, dk + c0 * D);
      }
    }
  store_grad(p.dk, p.mode, b, hk, j0, nk, dk);
  store_grad(p.dv, p.mode, b, hk, j0, nk, dv);
}

// Second pass, one (b, head h, query tile i0) item: dq += (scale dS) k over the key tiles its
// rows see.
void query_tile(const BackwardParams& p, const Tiles& t, const std::vector<float>& delta, int64_t b, int64_t h,
                int64_t i0, float* ws) {
  const int64_t D = p.q.dim, T = p.q.len, S = p.k.len;
  const int64_t nq = std::min(t.tq, T - i0), hk = h / (p.q.heads / p.k.heads);
  const Work w(ws, t, D);
  load_query_block(p, delta, w, b, h, i0, nq);
  float* dq = w.acc0;
  std::fill(dq, dq + nq * D, 0.f);
  const KeyRange keys = visible_range_of_rows(p.mask, i0, nq, S);
  for (int64_t j0 = keys.begin / t.tk * t.tk; j0 < keys.end; j0 += t.tk) {
    const int64_t nk = std::min(t.tk, S - j0);
    const BlockVisibility vis = classify_block(p.mask, i0, nq, j0, nk);
    if (vis == BlockVisibility::Empty) continue;
    load_key_block(p, w, b, hk, j0, nk);
    block_grads(p, w, i0, nq, j0, nk, vis == BlockVisibility::Full);
    for (int64_t r0 = 0; r0 < nq; r0 += kRows) {  // each row over the keys it sees
      const int64_t rb = std::min(kRows, nq - r0);
      int64_t lo[kRows], hi[kRows];
      for (int64_t r = 0; r < rb; ++r) {
        const KeyRange keys =
            tile_keys_of_row(p, i0 + r0 + r, w.lse[r0 + r], j0, nk, vis == BlockVisibility::Full);
        lo[r] = keys.begin;
        hi[r] = keys.end;
      }
      accumulate_ranges(w.ds + r0 * w.ldk, w.ldk, rb, lo, hi, w.k, D, dq + r0 * D);
    }
  }
  store_grad(p.dq, p.mode, b, h, i0, nq, dq);
}

// D_i = dout_i . o_i for every row, [B][Hq][T].
std::vector<float> row_deltas(const BackwardParams& p) {
  const int64_t B = p.q.batch, H = p.q.heads, T = p.q.len, D = p.q.dim;
  std::vector<float> delta(size_t(B * H * T));
#pragma omp parallel
  {
    std::vector<float> o(static_cast<size_t>(D)), dout(static_cast<size_t>(D));
#pragma omp for collapse(2)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i) {
          load_rows(p.o, b, h, i, 1, o.data());
          load_rows(p.dout, b, h, i, 1, dout.data());
          delta[size_t((b * H + h) * T + i)] = dot(o.data(), dout.data(), D);
        }
  }
  return delta;
}

}  // namespace

size_t backward_workspace_bytes(const BackwardParams& p, int threads) {
  const size_t tiles = size_t(workspace_floats(tiles_of(p), p.q.dim)) * size_t(threads);
  const size_t rows = size_t(p.q.batch * p.q.heads * p.q.len);
  return (tiles + rows) * sizeof(float);
}

size_t last_backward_workspace_bytes() { return g_last_workspace; }

void flash_backward(const BackwardParams& params) {
  validate_backward(params);
  BackwardParams p = params;
  p.mask = clamp_offset(p.mask, p.q.len, p.k.len);  // row + offset sums cannot overflow
  const Tiles t = tiles_of(p);
  const int64_t B = p.q.batch, Hq = p.q.heads, Hkv = p.k.heads, T = p.q.len, S = p.k.len;
  const int64_t nqt = (T + t.tq - 1) / t.tq, nkt = (S + t.tk - 1) / t.tk;
  const int threads = std::max(1, omp_get_max_threads());
  const int64_t per_thread = workspace_floats(t, p.q.dim);
  std::vector<float> ws(size_t(per_thread * threads));
  const std::vector<float> delta = row_deltas(p);
  g_last_workspace = backward_workspace_bytes(p, threads);

#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t it = 0; it < B * Hkv * nkt; ++it) {
    const int64_t bh = it / nkt;
    key_tile(p, t, delta, bh / Hkv, bh % Hkv, (it % nkt) * t.tk, ws.data() + per_thread * omp_get_thread_num());
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t it = 0; it < B * Hq * nqt; ++it) {
    // Longest rows first under causal: query tiles in reverse order.
    const int64_t bh = it / nqt;
    query_tile(p, t, delta, bh / Hq, bh % Hq, (nqt - 1 - it % nqt) * t.tq,
               ws.data() + per_thread * omp_get_thread_num());
  }
}

}  // namespace ringattn::cpu
