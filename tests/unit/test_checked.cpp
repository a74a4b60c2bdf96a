// Checked arithmetic on positions, lengths and pair counts (runner/problem/checked.hpp), and the
// places that used to overflow (issue 12): causal offsets near the int64 limits, 128-bit pair
// counts, shard and KV-split boundaries of the longest sequences.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "runner/problem/checked.hpp"
#include "core/error.hpp"
#include "runner/ring/schedule.hpp"

namespace ringattn {
namespace {

std::string thrown(const std::function<void()>& f) { return test::thrown_text<InvalidArgument>(f); }

TEST(Checked, ExactOrNothing) {
  EXPECT_EQ(try_add(kInt64Max - 1, 1), kInt64Max);
  EXPECT_FALSE(try_add(kInt64Max, 1));
  EXPECT_FALSE(try_add(kInt64Min, -1));
  EXPECT_EQ(try_sub(kInt64Min + 1, 1), kInt64Min);
  EXPECT_FALSE(try_sub(0, kInt64Min));
  EXPECT_EQ(try_mul(int64_t(1) << 31, int64_t(1) << 31), int64_t(1) << 62);
  EXPECT_FALSE(try_mul(int64_t(1) << 32, int64_t(1) << 31));
  EXPECT_FALSE(try_mul(-1, kInt64Min));
}

TEST(Checked, ThrowsNamingWhatAndTheOperands) {
  EXPECT_EQ(checked_add(40, 2, "x"), 42);
  EXPECT_EQ(thrown([] { checked_add(kInt64Max, 1, "the last position"); }),
            "the last position: 9223372036854775807 + 1 does not fit in a 64-bit integer (at most 9223372036854775807)");
  EXPECT_EQ(thrown([] { checked_sub(kInt64Min, 1, "d"); }),
            "d: -9223372036854775808 - 1 does not fit in a 64-bit integer (at most 9223372036854775807)");
  EXPECT_EQ(thrown([] { checked_mul(int64_t(1) << 40, int64_t(1) << 30, "bytes"); }),
            "bytes: 1099511627776 x 1073741824 does not fit in a 64-bit integer (at most 9223372036854775807)");
  EXPECT_EQ(checked_product({2, 3, 7}, "n"), 42);
  EXPECT_NE(thrown([] { checked_product({int64_t(1) << 21, int64_t(1) << 21, int64_t(1) << 21}, "elements"); })
                .find("elements: "),
            std::string::npos);
}

// The mask's closed-form pair count (core/mask.hpp count_visible) against a direct 128-bit sum on
// small random arguments, then at the extremes where an int64 formula wraps (seq 3.1e9 squared is
// past 2^63) and at offsets whose sums would overflow without the clamp.
TEST(Checked, PairCountsAreExact) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t rows = int64_t(rng() % 40), cols = int64_t(rng() % 40), off = int64_t(rng() % 120) - 61;
    PairCount want = 0;
    for (int64_t i = 0; i < rows; ++i) want += std::clamp<int64_t>(i + off + 1, 0, cols);
    ASSERT_TRUE(count_visible<PairCount>(MaskSpec{true, off}, 0, rows, cols) == want)
        << "seed " << seed << ": " << rows << " " << off << " " << cols;
  }
  const int64_t n = 3100000000, m = 4000000000;
  EXPECT_TRUE(count_visible<PairCount>(MaskSpec{true, 0}, 0, n, n) == PairCount(n) * (n + 1) / 2);
  EXPECT_TRUE(count_visible<PairCount>(MaskSpec{true, kInt64Max}, 0, n, n) == PairCount(n) * n);  // every key
  EXPECT_TRUE(count_visible<PairCount>(MaskSpec{true, kInt64Min}, 0, n, n) == 0);                 // none
  EXPECT_TRUE(count_visible<PairCount>(MaskSpec{true, kInt64Max}, 0, m, m) == PairCount(m) * m);  // past 2^63
  EXPECT_GT(to_double(RingSchedule(shard_layouts(Sharding::Contiguous, n, 1), 0, true).visible_pairs()), 4.8e18);
}

TEST(Checked, VisibleKeysAtTheOffsetLimits) {
  for (int64_t i : {int64_t(0), int64_t(5), int64_t(1) << 40}) {
    const int64_t q_len = i + 1, kv_len = 100;  // row i is the last row
    EXPECT_EQ(visible_range(clamp_offset(MaskSpec{true, kInt64Max}, q_len, kv_len), i, kv_len).size(), 100);
    EXPECT_EQ(visible_range(clamp_offset(MaskSpec{true, kInt64Min}, q_len, kv_len), i, kv_len).size(), 0);
    // the row's own position is key 0
    EXPECT_EQ(visible_range(clamp_offset(MaskSpec{true, -i}, q_len, kv_len), i, kv_len).size(), 1);
  }
  EXPECT_EQ(clamp_offset(MaskSpec{true, kInt64Max}, 64, 100).q_offset, 100);
  EXPECT_EQ(clamp_offset(MaskSpec{true, kInt64Min}, 64, 100).q_offset, -64);
  EXPECT_EQ(clamp_offset(MaskSpec{true, -7}, 64, 100).q_offset, -7);
}

// The CPU engine with the largest and smallest offsets: every key visible (the unmasked result)
// and no key visible (the empty state), on fresh random inputs with poisoned outputs.
TEST(Checked, FlashAtTheOffsetLimits) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t T = 37, S = 53, D = 16;
  test::HostTensor q(DType::F32, 1, 2, T, D, rng), k(DType::F32, 1, 1, S, D, rng), v(DType::F32, 1, 1, S, D, rng);
  FlashParams p;
  p.q = q.view, p.k = k.view, p.v = v.view, p.scale = 0.25f, p.tile_q = 8, p.tile_k = 16;
  test::HostState full(1, 2, T, D);
  p.state = full.view;
  cpu::flash_forward(p);
  for (int64_t off : {kInt64Max, kInt64Max - (T - 1), int64_t(S - 1)}) {
    test::HostState st(1, 2, T, D);
    p.state = st.view, p.mask = MaskSpec{true, off};
    cpu::flash_forward(p);
    EXPECT_EQ(st.o, full.o) << "seed " << seed << " q_offset " << off;
    EXPECT_EQ(st.lse, full.lse) << "seed " << seed << " q_offset " << off;
    const auto ref = cpu::naive_attention(p);
    EXPECT_LT(test::rel_error(st.o, ref.o), 1e-5) << "seed " << seed;
  }
  for (int64_t off : {kInt64Min, -T}) {
    test::HostState st(1, 2, T, D);
    p.state = st.view, p.mask = MaskSpec{true, off};
    cpu::flash_forward(p);
    for (float x : st.o) EXPECT_EQ(x, 0.f) << "q_offset " << off;
    for (float x : st.lse) EXPECT_EQ(x, -INFINITY) << "q_offset " << off;
  }
}

TEST(Checked, ProblemsWhosePositionsDoNotFitAreRefused) {
  GlobalProblem p;
  p.q_len = 64, p.kv_len = 64, p.head_dim = 8, p.causal = true;
  p.q_offset = kInt64Max - 63;
  EXPECT_NO_THROW(validate_problem(p, 1));
  p.q_offset = kInt64Max - 62;
  EXPECT_EQ(thrown([&] { validate_problem(p, 1); }),
            "q_offset (--q-offset) 9223372036854775745 puts the last query at position 9223372036854775745 + 64 - 1, "
            "which does not fit in a 64-bit integer: with q_len 64 the allowed q_offset is -9223372036854775808 to "
            "9223372036854775744");
  p.q_offset.reset();
  p.q_len = p.kv_len = int64_t(1) << 60;
  EXPECT_NE(thrown([&] { validate_problem(p, 1); }).find("the bytes of q (batch x heads x q_len x dim x dtype size)"),
            std::string::npos);
}

TEST(Checked, ShardsOfTheLongestSequences) {
  const int64_t n = 9223372036854775800;  // a multiple of 8 near INT64_MAX
  const ShardLayout c = shard_layout(Sharding::Contiguous, n, 3, 4);
  ASSERT_EQ(c.segments.size(), 1u);
  EXPECT_EQ(c.segments[0].start, 3 * (n / 4));
  EXPECT_EQ(c.segments[0].start + c.segments[0].len, n);
  const ShardLayout z = shard_layout(Sharding::Zigzag, n, 0, 4);
  ASSERT_EQ(z.segments.size(), 2u);
  EXPECT_EQ(z.segments[1].start + z.segments[1].len, n);
  const Segment s = kv_shard(n, 3, 4);
  EXPECT_EQ(s.start, 3 * (n / 4));
  EXPECT_EQ(s.start + s.len, n);
}

}  // namespace
}  // namespace ringattn
