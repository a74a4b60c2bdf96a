// The reference check: rows of this rank's output against the fp64 naive oracle, rebuilt from
// the seed or the files for any global row.
#pragma once

#include <cstdint>
#include <vector>

#include "cli/problem.hpp"

namespace ringattn::cli {

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
// the same output) to the input dtype's bounds (dtype_info(p.dtype).tolerance; core/dtype.hpp,
// Tolerance, says what they mean). `max_rows` > 0 caps the rows; 0 checks all when the work is
// small and a sample seeded by `seed` and the rank otherwise.
CheckResult check_rows(const GlobalProblem& p, InputSource& src, const LocalProblem& l, const HostResult& r, int rank,
                       int world, int64_t max_rows, uint64_t seed);

}  // namespace ringattn::cli
