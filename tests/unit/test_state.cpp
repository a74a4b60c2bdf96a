// The state primitive (core/state.hpp) on the host: the merge's identity, associativity,
// both inputs empty and far-apart lse, and the online-softmax step against a two-pass softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/test_util.hpp"
#include "core/state.hpp"

namespace ringattn {
namespace {

struct State {
  std::vector<float> o;
  float lse;
};

// a := merge(a, b) through the primitive's weights, as every merge site applies them.
State merged(State a, const State& b) {
  float wa, wb, lse;
  if (!merge_weights(a.lse, b.lse, wa, wb, lse)) return a;
  const bool a_empty = a.lse == empty_lse();
  for (size_t d = 0; d < a.o.size(); ++d) a.o[d] = a_empty ? b.o[d] * wb : a.o[d] * wa + b.o[d] * wb;
  a.lse = lse;
  return a;
}

State empty_state(size_t dim) { return {std::vector<float>(dim, 0.f), empty_lse()}; }

State random_state(std::mt19937_64& rng, size_t dim, float lse_spread) {
  std::normal_distribution<float> n(0.f, 1.f);
  State s{std::vector<float>(dim), n(rng) * lse_spread};
  for (float& x : s.o) x = n(rng);
  return s;
}

TEST(State, EmptyIsTheIdentity) {
  std::mt19937_64 rng(test::fresh_seed());
  for (int trial = 0; trial < 50; ++trial) {
    const State a = random_state(rng, 8, 10.f);
    const State l = merged(empty_state(8), a), r = merged(a, empty_state(8));
    EXPECT_EQ(l.lse, a.lse);
    EXPECT_EQ(r.lse, a.lse);
    for (size_t d = 0; d < 8; ++d) {
      EXPECT_EQ(l.o[d], a.o[d]);
      EXPECT_EQ(r.o[d], a.o[d]);
    }
  }
}

TEST(State, BothEmptyStaysEmptyWithoutNaN) {
  State a = empty_state(4);
  a.o = {std::nanf(""), 1.f, 2.f, 3.f};  // an empty state's o is never read
  const State m = merged(a, empty_state(4));
  EXPECT_EQ(m.lse, empty_lse());
  float wa = -1.f, wb = -1.f, lse = 0.f;
  EXPECT_FALSE(merge_weights(empty_lse(), empty_lse(), wa, wb, lse));
  const State e = merged(empty_state(4), empty_state(4));
  EXPECT_EQ(e.lse, empty_lse());
  for (float x : e.o) EXPECT_EQ(x, 0.f);
}

TEST(State, MergeIsAssociativeAndCommutative) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const State a = random_state(rng, 16, 5.f), b = random_state(rng, 16, 5.f), c = random_state(rng, 16, 5.f);
    const State x = merged(merged(a, b), c), y = merged(a, merged(b, c)), z = merged(merged(c, b), a);
    EXPECT_NEAR(x.lse, y.lse, 1e-5f * (1.f + std::abs(x.lse))) << "seed " << seed;
    EXPECT_NEAR(x.lse, z.lse, 1e-5f * (1.f + std::abs(x.lse))) << "seed " << seed;
    for (size_t d = 0; d < 16; ++d) {
      EXPECT_NEAR(x.o[d], y.o[d], 1e-5f) << "seed " << seed;
      EXPECT_NEAR(x.o[d], z.o[d], 1e-5f) << "seed " << seed;
    }
    // Against the definition in double: lse = ln(e^a + e^b + e^c), o their softmax-weighted mean.
    const double la = a.lse, lb = b.lse, lc = c.lse, mx = std::max({la, lb, lc});
    const double sum = std::exp(la - mx) + std::exp(lb - mx) + std::exp(lc - mx);
    EXPECT_NEAR(x.lse, mx + std::log(sum), 1e-5 * (1.0 + std::abs(mx))) << "seed " << seed;
    for (size_t d = 0; d < 16; ++d) {
      const double want = (a.o[d] * std::exp(la - mx) + b.o[d] * std::exp(lb - mx) + c.o[d] * std::exp(lc - mx)) / sum;
      EXPECT_NEAR(x.o[d], want, 1e-5) << "seed " << seed;
    }
  }
}

TEST(State, FarApartLseKeepsTheLargerExactly) {
  // exp(-200) underflows in fp32: the smaller state weighs exactly nothing, and nothing is NaN.
  const State big{{1.f, -2.f}, 150.f}, small{{7.f, 9.f}, -50.f};
  for (const State& m : {merged(big, small), merged(small, big)}) {
    EXPECT_EQ(m.lse, 150.f);
    EXPECT_EQ(m.o[0], 1.f);
    EXPECT_EQ(m.o[1], -2.f);
  }
  float wa, wb, lse;
  ASSERT_TRUE(merge_weights(1e30f, -1e30f, wa, wb, lse));
  EXPECT_EQ(wa, 1.f);
  EXPECT_EQ(wb, 0.f);
  EXPECT_EQ(lse, 1e30f);
}

// The (m, l, acc) online form in natural and in log2 units gives the softmax of the whole row,
// with tiles that are entirely masked (-inf) before and between the visible ones.
TEST(State, OnlineStepMatchesTwoPassSoftmax) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 3.f);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<std::vector<float>> tiles(4);
    for (auto& t : tiles) {
      t.resize(5);
      for (float& x : t) x = n(rng);
    }
    tiles[0].assign(5, -INFINITY);
    if (trial % 2) tiles[2].assign(5, -INFINITY);
    double mx = -INFINITY;
    for (const auto& t : tiles)
      for (float x : t) mx = std::max<double>(mx, x);
    double want = 0;
    for (const auto& t : tiles)
      for (float x : t) want += std::exp(double(x) - mx);
    const double want_lse = mx + std::log(want);
    for (bool log2_units : {false, true}) {
      const float u = log2_units ? kLog2e : 1.f;
      auto ex = [&](float x) { return log2_units ? std::exp2(x) : std::exp(x); };
      float m = -INFINITY, l = 0.f;
      for (const auto& t : tiles) {
        float tmax = -INFINITY;
        for (float x : t) tmax = std::max(tmax, x * u);
        const OnlineStep st = online_step(m, tmax, ex);
        EXPECT_FALSE(std::isnan(st.alpha));
        float sum = 0.f;
        for (float x : t) sum += ex(x * u - st.base);
        l = l * st.alpha + sum;
      }
      const float lse = log2_units ? lse_from_stats_log2(m, l) : lse_from_stats(m, l);
      EXPECT_NEAR(lse, want_lse, 1e-4 * (1.0 + std::abs(want_lse))) << "seed " << seed << " log2 " << log2_units;
    }
  }
  float m = -INFINITY, l = 0.f;  // a row that saw only masked keys stays empty
  const OnlineStep st = online_step(m, -INFINITY, [](float x) { return std::exp(x); });
  EXPECT_EQ(st.base, 0.f);
  EXPECT_EQ(st.alpha, 0.f);
  EXPECT_EQ(lse_from_stats(m, l), empty_lse());
  EXPECT_EQ(rescale_factor(-INFINITY, 3.f, [](float x) { return std::exp(x); }), 0.f);
}

}  // namespace
}  // namespace ringattn
