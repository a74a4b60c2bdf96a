// Checked integer arithmetic for positions, lengths, offsets, element counts and pair counts:
// every such computation goes through these, so a value too large for 64 bits is refused with a
// message instead of wrapping into a wrong (often negative) number. Pair counts, which reach
// seq^2, use a 128-bit integer (exact up to seq ~ 1.3e19, beyond any int64 length).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

#include "core/error.hpp"

namespace ringattn {

inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
inline constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

// Exact results, or nullopt when they do not fit in int64.
inline std::optional<int64_t> try_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> try_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> try_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The same, throwing InvalidArgument "WHAT: A op B does not fit in a 64-bit integer" on overflow.
inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  if (auto r = try_add(a, b)) return *r;
  fail_arg("{}: {} + {} does not fit in a 64-bit integer (at most {})", what, a, b, kInt64Max);
}
inline int64_t checked_sub(int64_t a, int64_t b, std::string_view what) {
  if (auto r = try_sub(a, b)) return *r;
  fail_arg("{}: {} - {} does not fit in a 64-bit integer (at most {})", what, a, b, kInt64Max);
}
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  if (auto r = try_mul(a, b)) return *r;
  fail_arg("{}: {} x {} does not fit in a 64-bit integer (at most {})", what, a, b, kInt64Max);
}

// The product of non-negative factors (a tensor's element count), checked.
inline int64_t checked_product(std::initializer_list<int64_t> factors, std::string_view what) {
  int64_t r = 1;
  for (int64_t f : factors) r = checked_mul(r, f, what);
  return r;
}

// Pair counts (query-key pairs, up to seq^2 per head): exact in 128 bits for any int64 lengths
// up to 2^63 (the square is below 2^126). Sums of them stay exact while below 2^127.
using PairCount = __int128;

// A pair count as a double (for FLOPs, shares and printing): rounds, never wraps.
inline double to_double(PairCount n) { return static_cast<double>(n); }

}  // namespace ringattn
