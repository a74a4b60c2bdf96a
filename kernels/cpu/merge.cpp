// The (o, lse) merge and what is built from it on the CPU: state folding, split-KV decode and the
// final cast.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "core/error.hpp"

namespace ringattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float* o_row(const StateView& s, int64_t b, int64_t h, int64_t t) {
  return s.o + b * s.o_stride_b + h * s.o_stride_h + t * s.o_stride_t;
}
float* lse_at(const StateView& s, int64_t b, int64_t h, int64_t t) {
  return s.lse + b * s.lse_stride_b + h * s.lse_stride_h + t;
}

void check_same_shape(const StateView& a, const StateView& b) {
  if (a.batch != b.batch || a.heads != b.heads || a.len != b.len || a.dim != b.dim)
    fail_arg("merge of states with different shapes: [{}, {}, {}, {}] and [{}, {}, {}, {}]", a.batch, a.heads, a.len,
             a.dim, b.batch, b.heads, b.len, b.dim);
}

}  // namespace

void merge_row(float* o_a, float* lse_a, const float* o_b, float lse_b, int64_t dim) {
  float wa, wb, merged;
  if (!merge_weights(*lse_a, lse_b, wa, wb, merged)) return;  // b empty: the identity
  if (*lse_a == empty_lse())
    std::copy(o_b, o_b + dim, o_a);  // a's o is not read (wb is 1)
  else
    for (int64_t d = 0; d < dim; ++d) o_a[d] = o_a[d] * wa + o_b[d] * wb;
  *lse_a = merged;
}

void merge_states(const MergeParams& p) {
  check_same_shape(p.state, p.other);
  const StateView &a = p.state, &o = p.other;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t t = 0; t < a.len; ++t)
        merge_row(o_row(a, b, h, t), lse_at(a, b, h, t), o_row(o, b, h, t), *lse_at(o, b, h, t), a.dim);
}

void fill_empty(const StateView& s) {
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t t = 0; t < s.len; ++t) {
        float* o = o_row(s, b, h, t);
        std::fill(o, o + s.dim, 0.f);
        *lse_at(s, b, h, t) = kNegInf;
      }
}

void decode_split_kv(const DecodeParams& p) {
  validate_flash(p.flash, /*complete=*/false);
  const FlashParams& f = p.flash;
  const int64_t S = f.k.len;
  if (p.splits < 0) fail_arg("splits must be >= 1, or 0 for the default (got {})", p.splits);
  const int64_t splits = std::min<int64_t>(S, p.splits > 0 ? p.splits : std::max(1, omp_get_max_threads()));
  const int64_t chunk = (S + splits - 1) / splits;
  const int64_t n = (S + chunk - 1) / chunk;  // chunks that hold keys
  const StateView& st = f.state;
  const int64_t rows = st.batch * st.heads * st.len;

  // Each chunk's partial state, computed independently (in parallel), then merged in order.
  std::vector<float> o(static_cast<size_t>(n * rows * st.dim)), lse(static_cast<size_t>(n * rows));
  std::vector<StateView> parts(static_cast<size_t>(n));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < n; ++c) {
    const int64_t c0 = c * chunk, len = std::min(chunk, S - c0);
    FlashParams sub = f;
    sub.k = f.k.rows(c0, len);
    sub.v = f.v.rows(c0, len);
    sub.mask = clamp_offset(f.mask, f.q.len, S);  // clamped first: no overflow
    sub.mask.q_offset -= c0;                      // the chunk's keys start at position c0
    sub.mode = StateMode::Write;
    sub.state = contiguous_state(&o[static_cast<size_t>(c * rows * st.dim)], &lse[static_cast<size_t>(c * rows)],
                                 st.batch, st.heads, st.len, st.dim);
    parts[static_cast<size_t>(c)] = sub.state;
    flash_forward(sub);
  }
  if (f.mode == StateMode::Write) fill_empty(st);
  for (int64_t c = 0; c < n; ++c) merge_states(MergeParams{st, parts[static_cast<size_t>(c)]});
  if (f.out.data != nullptr) finalize(FinalizeParams{st, f.out});  // the final output, as flash writes it
}

void finalize(const FinalizeParams& p) {
  const StateView& s = p.state;
  const TensorView& out = p.out;
  if (out.batch != s.batch || out.heads != s.heads || out.len != s.len || out.dim != s.dim)
    fail_arg("output shape [{}, {}, {}, {}] does not match the state [{}, {}, {}, {}]", out.batch, out.heads, out.len,
             out.dim, s.batch, s.heads, s.len, s.dim);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t t = 0; t < s.len; ++t) {
        const float* o = o_row(s, b, h, t);
        const int64_t off = out.offset(b, h, t);
        for (int64_t d = 0; d < s.dim; ++d) store_from_float(out.data, out.dtype, off + d, o[d]);
      }
}

}  // namespace ringattn::cpu
