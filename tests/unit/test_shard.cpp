// Sharding layouts, the lengths each scheme accepts, and the problem checks.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "ringattn/ring.hpp"

namespace ringattn {
namespace {

TEST(Shard, LayoutsPartitionTheSequence) {
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped})
    for (int P = 1; P <= 6; ++P) {
      const int64_t N = required_multiple(sh, P) * 5;
      std::vector<int> owner(size_t(N), -1);
      for (int r = 0; r < P; ++r) {
        const ShardLayout l = shard_layout(sh, N, r, P);
        EXPECT_EQ(l.tokens(), N / P);
        for (int64_t i = 0; i < l.tokens(); ++i) {
          const int64_t pos = l.global_position(i);
          ASSERT_GE(pos, 0);
          ASSERT_LT(pos, N);
          ASSERT_EQ(owner[size_t(pos)], -1) << sharding_name(sh) << " token " << pos << " held twice";
          owner[size_t(pos)] = r;
        }
      }
      for (int64_t t = 0; t < N; ++t) {
        ASSERT_NE(owner[size_t(t)], -1);
        const int r = owner[size_t(t)];
        if (sh == Sharding::Contiguous) EXPECT_EQ(r, t / (N / P));
        if (sh == Sharding::Striped) EXPECT_EQ(r, t % P);
        if (sh == Sharding::Zigzag) {
          const int64_t chunk = t / (N / (2 * P));
          EXPECT_TRUE(chunk == r || chunk == 2 * P - 1 - r);
        }
      }
    }
}

TEST(Shard, ZigzagRowOrderIsChunkRThenMirror) {
  const ShardLayout l = shard_layout(Sharding::Zigzag, 24, 1, 3);  // chunks of 4: 1 and 4
  ASSERT_EQ(l.segments.size(), 2u);
  EXPECT_EQ(l.global_position(0), 4);
  EXPECT_EQ(l.global_position(4), 16);
  EXPECT_EQ(l.first_row(1), 4);
  EXPECT_THROW(l.global_position(8), InvalidArgument);
}

TEST(Shard, AdjacentChunksBecomeOneSegment) {
  // The last zigzag rank holds chunks P-1 and P, which continue each other.
  const ShardLayout last = shard_layout(Sharding::Zigzag, 16, 1, 2);  // chunks of 4: 1 and 2
  ASSERT_EQ(last.segments.size(), 1u);
  EXPECT_EQ(last.segments[0].start, 4);
  EXPECT_EQ(last.segments[0].len, 8);
  EXPECT_EQ(last.global_position(7), 11);
  // A world of one is one run under every scheme.
  for (Sharding s : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped}) {
    const ShardLayout one = shard_layout(s, 12, 0, 1);
    ASSERT_EQ(one.segments.size(), 1u) << sharding_name(s);
    EXPECT_EQ(one.segments[0].len, 12);
    EXPECT_EQ(one.global_position(11), 11);
  }
}

TEST(Shard, IndivisibleLengthsNameTheRequiredMultiple) {
  try {
    check_shardable(Sharding::Zigzag, 100, 4);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 2 x ranks = 8"), std::string::npos) << e.what();
  }
  try {
    check_shardable(Sharding::Striped, 10, 3);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the rank count 3"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_shardable(Sharding::Contiguous, 12, 3));
  EXPECT_THROW(shard_layout(Sharding::Contiguous, 13, 0, 3), InvalidArgument);
}

TEST(Shard, ParseSharding) {
  EXPECT_EQ(parse_sharding("zigzag"), Sharding::Zigzag);
  EXPECT_EQ(parse_sharding("striped"), Sharding::Striped);
  EXPECT_EQ(parse_sharding("contiguous"), Sharding::Contiguous);
  EXPECT_THROW(parse_sharding("zig-zag"), InvalidArgument);
}

TEST(Shard, KvShardsCoverAnyLength) {
  for (int P = 1; P <= 5; ++P)
    for (int64_t S : {1, 2, 3, 7, 40}) {
      int64_t next = 0;
      for (int r = 0; r < P; ++r) {
        const Segment s = kv_shard(S, r, P);
        EXPECT_EQ(s.start, next);
        EXPECT_GE(s.len, 0);
        next += s.len;
      }
      EXPECT_EQ(next, S);
    }
}

TEST(Shard, ProblemValidation) {
  GlobalProblem p;
  p.batch = 1, p.q_heads = 6, p.kv_heads = 4, p.q_len = p.kv_len = 16, p.head_dim = 8;
  EXPECT_THROW(validate_problem(p, 2), InvalidArgument);  // 6 is not a multiple of 4
  p.kv_heads = 3;
  EXPECT_NO_THROW(validate_problem(p, 2));
  EXPECT_TRUE(p.is_ring());
  p.q_len = 1;
  EXPECT_FALSE(p.is_ring());
  EXPECT_EQ(p.resolved_q_offset(), 15);
  p.causal = true;
  p.q_offset = -1;
  EXPECT_THROW(validate_problem(p, 2), InvalidArgument);
}

}  // namespace
}  // namespace ringattn
