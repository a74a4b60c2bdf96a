// The reference check: rows of this rank's output against the fp64 naive oracle, rebuilt from
// the seed or the files for any global row.
#pragma once

#include <cstdint>
#include <vector>

#include "cli/problem.hpp"

namespace ringattn::cli {

// allclose-style bounds per dtype: |o - ref| <= atol + rtol * |ref| + score_rtol * M elementwise,
// and |lse - ref| <= lse_atol + lse_rtol * |ref| + D * 2^-24 * M, where M is the row's score
// magnitude: max(|lse_ref|, scale * max over its visible keys of sum_d |q_d k_d|). Each fp32 score
// carries roundoff of up to D units of that dot-product magnitude (not of the score itself: a small
// score can be the difference of large products), and the lse and the softmax weights move by as
// much (q, k ~ N(0, 30^2) give magnitudes in the thousands and output errors near 2e-4 in correct
// fp32 arithmetic; a row whose one visible score cancels to near 0 still has its lse off by ~1e-3).
// fp32 compute is far inside these otherwise; the half dtypes pay one rounding of the output (and
// on GPUs the half-precision P in P·V).
struct Tolerance {
  double atol, rtol, lse_atol, lse_rtol, score_rtol;
};
Tolerance tolerance_for(DType t);

// This rank's output copied to the host (out in the problem dtype, lse fp32; local row order).
struct HostResult {
  std::vector<uint8_t> out;
  std::vector<float> lse;
};
HostResult copy_result(const GlobalProblem& p, const LocalProblem& l, Backend& b);

struct CheckResult {
  int64_t rows_checked = 0, rows_total = 0;  // of the rows this rank is responsible for
  double max_abs = 0;       // max |o - ref|
  double max_rel = 0;       // max over rows of ||o - ref|| / ||ref||
  double max_lse_abs = 0;   // max |lse - ref|
  int64_t nan_count = 0;    // NaN/inf in all of this rank's out and lse (poison left = unwritten)
  int64_t lse_nonfinite = 0;  // of nan_count, those in lse
  int64_t violations = 0;   // elements outside the tolerance
  bool pass() const { return nan_count == 0 && violations == 0; }
};

// Counts non-finite values in this rank's whole result (cheap; run and bench report it always):
// the total, and in `lse_only` those of the lse.
int64_t count_nonfinite(const GlobalProblem& p, const HostResult& r, int64_t* lse_only = nullptr);

// Checks this rank's rows (ring: its shard; decode: every world-th query, since all ranks hold
// the same output). `max_rows` > 0 caps the rows; 0 checks all when the work is small and a
// sample seeded by `seed` and the rank otherwise.
CheckResult check_rows(const GlobalProblem& p, InputSource& src, const LocalProblem& l, const HostResult& r, int rank,
                       int world, int64_t max_rows, uint64_t seed);

}  // namespace ringattn::cli
