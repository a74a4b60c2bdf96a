#include "cli/check.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

namespace ringattn::cli {
namespace {

// A few seconds of the fp64 oracle on two cores; above it the check samples rows.
constexpr double kFullCheckFlops = 8e9;
constexpr int64_t kMinSampleRows = 64;

struct RowRef {
  int64_t b, h, local_row, global_row;
};

}  // namespace

// scale * max over the visible keys of the one-row view fp of sum_d |q_d k_d|: the magnitude that
// an fp32 score's rounding scales with (core/dtype.hpp, Tolerance).
static double score_magnitude(const FlashParams& fp) {
  const KeyRange keys = visible_range(fp.mask, 0, fp.k.len);
  double mag = 0;
  for (int64_t j = keys.begin; j < keys.end; ++j) {
    double s = 0;
    for (int64_t d = 0; d < fp.q.dim; ++d)
      s += std::abs(double(load_as_float(fp.q.data, fp.q.dtype, d)) *
                    double(load_as_float(fp.k.data, fp.k.dtype, j * fp.k.stride_t + d)));
    mag = std::max(mag, s);
  }
  return double(fp.scale) * mag;
}

HostResult copy_result(const GlobalProblem& p, const LocalProblem& l, Backend& b) {
  HostResult r;
  r.out.resize(l.out.bytes());
  r.lse.resize(l.lse.bytes() / sizeof(float));
  b.synchronize();
  b.copy_to_host(r.out.data(), l.out.get(), r.out.size());
  b.copy_to_host(r.lse.data(), l.lse.get(), l.lse.bytes());
  (void)p;
  return r;
}

int64_t count_nonfinite(const GlobalProblem& p, const HostResult& r, int64_t* lse_only) {
  const int64_t n = int64_t(r.out.size()) / dtype_size(p.dtype);
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(load_as_float(r.out.data(), p.dtype, i));
  int64_t bad_lse = 0;
  for (float x : r.lse) bad_lse += !std::isfinite(x);
  if (lse_only) *lse_only = bad_lse;
  return bad + bad_lse;
}

namespace {

// The rows this rank answers for (`rows_total` of them): all when checking them all is a few
// seconds of the oracle (or max_rows asks for at least that many), else a seeded sample; sorted so
// rows of one (batch, kv head), which share the K/V slab the reference reads, are adjacent.
std::vector<RowRef> pick_rows(const GlobalProblem& p, const LocalProblem& l, int rank, int world, int64_t max_rows,
                              uint64_t seed, int64_t* rows_total) {
  const int64_t tq = l.q_layout.tokens(), H = p.q_heads;
  std::vector<int64_t> mine;
  for (int64_t i = 0; i < tq; ++i)
    if (p.is_ring() || i % world == rank) mine.push_back(i);
  *rows_total = p.batch * H * int64_t(mine.size());
  if (*rows_total == 0) return {};

  // The average row sees visible_pairs / q_len keys (about half of them under a causal mask).
  const double row_flops = 4.0 * double(p.head_dim) * std::max(1.0, visible_pairs(p) / double(p.q_len));
  int64_t want = max_rows > 0 ? max_rows
                 : double(*rows_total) * row_flops <= kFullCheckFlops
                     ? *rows_total
                     : std::max<int64_t>(kMinSampleRows, int64_t(kFullCheckFlops / row_flops));
  want = std::min(want, *rows_total);
  std::vector<int64_t> picks;  // flat indices into (b, h, mine)
  if (want == *rows_total) {
    picks.resize(size_t(want));
    for (int64_t i = 0; i < want; ++i) picks[size_t(i)] = i;
  } else {
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + uint64_t(rank) + 1);
    std::unordered_set<int64_t> seen;
    while (int64_t(seen.size()) < want) seen.insert(int64_t(rng() % uint64_t(*rows_total)));
    picks.assign(seen.begin(), seen.end());
  }
  std::vector<RowRef> rows;
  rows.reserve(picks.size());
  for (int64_t f : picks) {
    const int64_t per_bh = int64_t(mine.size());
    const int64_t b = f / (H * per_bh), h = (f / per_bh) % H, lr = mine[size_t(f % per_bh)];
    rows.push_back({b, h, lr, l.q_layout.global_position(lr)});
  }
  const int64_t group = H / p.kv_heads;
  std::sort(rows.begin(), rows.end(), [&](const RowRef& a, const RowRef& c) {
    return std::tuple(a.b, a.h / group, a.global_row) < std::tuple(c.b, c.h / group, c.global_row);
  });
  return rows;
}

// One row's errors against the oracle.
struct RowErrors {
  double abs = 0, rel = 0, lse = 0;
  int64_t violations = 0;
};

// The one-row problem fp (its q, k, v, scale and mask) through the fp64 oracle, against the
// engine's output row `out` (D values in dtype) and its lse, under the dtype's tolerance.
RowErrors compare_row(const FlashParams& fp, const uint8_t* out, DType dtype, int64_t o0, float lse,
                      const Tolerance& tol) {
  const int64_t D = fp.q.dim;
  std::vector<double> ref(static_cast<size_t>(D));
  double ref_lse = 0;
  cpu::naive_row(fp, 0, 0, 0, ref.data(), &ref_lse);
  RowErrors e;
  double num = 0, den = 0;
  const double mag = std::isfinite(ref_lse) ? std::max(std::abs(ref_lse), score_magnitude(fp)) : 0.0;
  const double score_term = tol.score_rtol * mag;
  for (int64_t d = 0; d < D; ++d) {
    const double x = load_as_float(out, dtype, o0 + d);
    const double err = std::abs(x - ref[size_t(d)]);
    if (!(err <= tol.atol + tol.rtol * std::abs(ref[size_t(d)]) + score_term)) ++e.violations;  // NaN counts too
    e.abs = std::max(e.abs, std::isnan(err) ? INFINITY : err);
    num += err * err;
    den += ref[size_t(d)] * ref[size_t(d)];
  }
  const double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  e.rel = std::isnan(rel) ? INFINITY : rel;
  const double le = std::abs(double(lse) - ref_lse);
  if (!(le <= tol.lse_atol + tol.lse_rtol * std::abs(ref_lse) + double(D) * 0x1p-24 * mag)) ++e.violations;
  e.lse = std::isnan(le) ? INFINITY : le;
  return e;
}

}  // namespace

CheckResult check_rows(const GlobalProblem& p, InputSource& src, const LocalProblem& l, const HostResult& r, int rank,
                       int world, int64_t max_rows, uint64_t seed) {
  CheckResult res;
  res.nan_count = count_nonfinite(p, r, &res.lse_nonfinite);
  const std::vector<RowRef> rows = pick_rows(p, l, rank, world, max_rows, seed, &res.rows_total);
  res.rows_checked = int64_t(rows.size());
  if (rows.empty()) return res;

  const int64_t tq = l.q_layout.tokens(), D = p.head_dim, H = p.q_heads, S = p.kv_len, group = H / p.kv_heads;
  // Clamped to what can change visibility (core/mask.hpp clamp_offset): row + offset sums cannot overflow.
  const MaskSpec mask = clamp_offset(p.mask(), p.q_len, S);
  const std::vector<int64_t> doc_bounds = p.doc_bounds();  // docs points into it
  const Documents docs = documents_of(doc_bounds);
  // The keys row `global_row` sees (core/mask.hpp): a range under the mask, or within its document.
  auto row_keys = [&](int64_t global_row) {
    return docs.none() ? visible_range(mask, global_row, S) : document_keys(docs, p.causal, global_row, p.window);
  };
  const Tolerance tol = dtype_info(p.dtype).tolerance;
  const int es = dtype_size(p.dtype);
  const float scale = p.resolved_scale();
  std::vector<uint8_t> kslab, vslab, qrows;
  for (size_t g0 = 0; g0 < rows.size();) {
    size_t g1 = g0;
    while (g1 < rows.size() && rows[g1].b == rows[g0].b && rows[g1].h / group == rows[g0].h / group) ++g1;
    const int64_t b = rows[g0].b, hk = rows[g0].h / group;
    int64_t keys = 0;  // the most keys any row of the group sees
    for (size_t i = g0; i < g1; ++i)
      keys = std::max(keys, row_keys(rows[i].global_row).end);
    kslab.resize(size_t(std::max<int64_t>(keys, 1) * D * es));
    vslab.resize(kslab.size());
    if (keys > 0) {
      src.rows(InputTensor::K, b, hk, 0, keys, p.kv_heads, S, D, kslab.data(), p.dtype);
      src.rows(InputTensor::V, b, hk, 0, keys, p.kv_heads, S, D, vslab.data(), p.dtype);
    }
    // The sources are not thread-safe (one file position each): read the query rows first.
    qrows.resize(size_t((g1 - g0) * D * es));
    for (size_t i = g0; i < g1; ++i)
      src.rows(InputTensor::Q, b, rows[i].h, rows[i].global_row, 1, H, p.q_len, D, qrows.data() + (i - g0) * D * es,
               p.dtype);
    double g_abs = 0, g_rel = 0, g_lse = 0;
    int64_t g_viol = 0;
#pragma omp parallel for schedule(dynamic) reduction(max : g_abs, g_rel, g_lse) reduction(+ : g_viol)
    for (size_t i = g0; i < g1; ++i) {
      const RowRef& row = rows[i];
      FlashParams fp;
      fp.q = bhtd_view(qrows.data() + (i - g0) * D * es, p.dtype, 1, 1, 1, D);
      fp.scale = scale;
      if (docs.none()) {
        fp.k = bhtd_view(kslab.data(), p.dtype, 1, 1, std::max<int64_t>(keys, 1), D);
        fp.v = bhtd_view(vslab.data(), p.dtype, 1, 1, std::max<int64_t>(keys, 1), D);
        fp.mask = mask;  // row 0 of the one-row view is global row global_row
        fp.mask.q_offset += row.global_row;
      } else {  // the keys of the row's document up to where it sees: all of them visible
        const KeyRange kr = row_keys(row.global_row);
        fp.k = bhtd_view(kslab.data() + kr.begin * D * es, p.dtype, 1, 1, kr.size(), D);
        fp.v = bhtd_view(vslab.data() + kr.begin * D * es, p.dtype, 1, 1, kr.size(), D);
        fp.mask = MaskSpec{false, 0};
      }
      const int64_t r0 = (row.b * H + row.h) * tq + row.local_row;
      const RowErrors e = compare_row(fp, r.out.data(), p.dtype, r0 * D, r.lse[size_t(r0)], tol);
      g_abs = std::max(g_abs, e.abs);
      g_rel = std::max(g_rel, e.rel);
      g_lse = std::max(g_lse, e.lse);
      g_viol += e.violations;
    }
    res.max_abs = std::max(res.max_abs, g_abs);
    res.max_rel = std::max(res.max_rel, g_rel);
    res.max_lse_abs = std::max(res.max_lse_abs, g_lse);
    res.violations += g_viol;
    g0 = g1;
  }
  return res;
}

}  // namespace ringattn::cli
