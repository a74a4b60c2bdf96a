// Layouts that no Sharding names, for ring plans made from layouts (tests/unit/test_ring_plan.cpp,
// tests/mpi/test_ring.cpp, tests/mpi/test_ring_backward.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "runner/problem/sharding.hpp"

namespace ringattn::test {

// A permuted union of contiguous shards: [0, N) cut into per_rank x P near-equal chunks, dealt
// to the ranks by a permutation drawn from `rng` (per_rank each), every rank's chunks in the order
// drawn, so a rank's rows are neither in position order nor next to each other. Empty chunks
// (N < per_rank x P) are left out.
inline std::vector<ShardLayout> permuted_chunks(int64_t N, int P, int per_rank, std::mt19937_64& rng) {
  const int64_t n = int64_t(P) * per_rank;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<ShardLayout> layouts(static_cast<size_t>(P));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = order[size_t(i)], b = c * N / n, e = (c + 1) * N / n;
    if (e > b) layouts[size_t(i / per_rank)].segments.push_back({b, e - b, 1});
  }
  return layouts;
}

// Hybrid groups: the ranks in groups of `group` (which divides P), [0, N) cut into P / group
// contiguous parts, and the ranks of group g striped over part g (rank j of the group holds the
// part's tokens j, j + group, ...): inside a group striped, across groups contiguous.
inline std::vector<ShardLayout> striped_groups(int64_t N, int P, int group) {
  const int64_t parts = P / group;
  std::vector<ShardLayout> layouts(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    const int64_t g = r / group, j = r % group, b = g * N / parts, len = (g + 1) * N / parts - b;
    if (j < len) layouts[size_t(r)].segments.push_back({b + j, (len - j - 1) / group + 1, group});
  }
  return layouts;
}

// The layouts of a ring test's custom case, the same on every rank for the same seed: kind 1 a
// permuted union of contiguous shards (two a rank), kind 2 striped groups of two (at odd P, of one:
// contiguous parts, dealt in order).
inline std::vector<ShardLayout> custom_layouts(int kind, int64_t N, int P, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return kind == 1 ? permuted_chunks(N, P, 2, rng) : striped_groups(N, P, P % 2 ? 1 : 2);
}

inline const char* custom_name(int kind) { return kind == 1 ? "permuted" : kind == 2 ? "groups" : ""; }

}  // namespace ringattn::test
