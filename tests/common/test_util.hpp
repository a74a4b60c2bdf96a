// Helpers shared by the tests: fresh random inputs, poisoned outputs and error norms.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/params.hpp"

namespace ringattn::test {

// The text of the E that `f` throws, or "(no E)" when it throws none (another exception passes).
template <class E, class F>
std::string thrown_text(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception of the expected type)";
}

// A fresh seed per call, so every run draws new inputs; printed by the failing assertion's caller.
// RINGATTN_TEST_SEED=<decimal> replays a printed seed instead (every call returns it).
inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("RINGATTN_TEST_SEED"); env != nullptr && *env != '\0')
    return std::strtoull(env, nullptr, 10);
  static std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

// Owns the bytes of a [B, H, T, D] tensor in `dtype` with normal(0, 1) entries.
struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
  HostTensor(DType dtype, int64_t b, int64_t h, int64_t t, int64_t d, std::mt19937_64& rng, bool bthd = false)
      : bytes(static_cast<size_t>(b * h * t * d * dtype_size(dtype))) {
    view = bthd ? bthd_view(bytes.data(), dtype, b, h, t, d) : bhtd_view(bytes.data(), dtype, b, h, t, d);
    std::normal_distribution<float> n(0.f, 1.f);
    for (int64_t i = 0; i < b * h * t * d; ++i) store_from_float(bytes.data(), dtype, i, n(rng));
  }
};

// An fp32 (o, lse) state, poisoned with NaN so unwritten elements are caught.
struct HostState {
  std::vector<float> o, lse;
  StateView view;
  HostState(int64_t b, int64_t h, int64_t t, int64_t d)
      : o(static_cast<size_t>(b * h * t * d), std::numeric_limits<float>::quiet_NaN()),
        lse(static_cast<size_t>(b * h * t), std::numeric_limits<float>::quiet_NaN()) {
    view = contiguous_state(o.data(), lse.data(), b, h, t, d);
  }
};

// ||a - ref|| / ||ref|| over all elements; NaN anywhere in `a` gives +inf.
template <typename A>
double rel_error(const A& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = double(a[i]);
    if (std::isnan(x)) return std::numeric_limits<double>::infinity();
    if (std::isinf(ref[i]) || std::isinf(x)) {
      if (x != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    num += (x - ref[i]) * (x - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Max |a - ref| over finite entries; infinities must match exactly, NaN gives +inf.
template <typename A>
double max_abs_error(const A& a, const std::vector<double>& ref) {
  double m = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = double(a[i]);
    if (std::isnan(x)) return std::numeric_limits<double>::infinity();
    if (std::isinf(ref[i]) || std::isinf(x)) {
      if (x != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    m = std::max(m, std::abs(x - ref[i]));
  }
  return m;
}

// Key position k visible to query position q by the definition, not the mask code: same packed
// document (the lengths `docs`, scanned; none: one document), k <= q when causal, and
// q - left <= k <= q + right for a window (-1: unbounded).
inline bool visible_by_definition(bool causal, Window w, const std::vector<int64_t>& docs, int64_t q, int64_t k) {
  if (causal && k > q) return false;
  if (w.left >= 0 && k < q - w.left) return false;
  if (w.right >= 0 && k > q + w.right) return false;
  int64_t a = 0;
  for (int64_t n : docs) {
    if ((q < a + n) != (k < a + n)) return false;  // one of them is in this document, the other later
    if (q < a + n) return true;
    a += n;
  }
  return true;
}

}  // namespace ringattn::test
