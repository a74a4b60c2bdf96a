// Sharding layouts, the lengths each scheme accepts, and the problem checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "runner/ring/ring.hpp"

namespace ringattn {
namespace {

// Every length over every world: the shards partition [0, N); chunk sizes differ by at most one
// token; each token is where its scheme puts it; segments are never empty.
TEST(Shard, LayoutsPartitionEveryLength) {
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped})
    for (int P = 1; P <= 6; ++P)
      for (int64_t N = 1; N <= 40; ++N) {
        SCOPED_TRACE(fmt::format("{} P={} N={}", sharding_name(sh), P, N));
        const int64_t chunks = sh == Sharding::Zigzag ? 2 * P : P;
        std::vector<int> owner(size_t(N), -1);
        int64_t min_tokens = N, max_tokens = 0;
        for (int r = 0; r < P; ++r) {
          const ShardLayout l = shard_layout(sh, N, r, P);
          for (const Segment& g : l.segments) ASSERT_GT(g.len, 0);
          min_tokens = std::min(min_tokens, l.tokens());
          max_tokens = std::max(max_tokens, l.tokens());
          for (int64_t i = 0; i < l.tokens(); ++i) {
            const int64_t pos = l.global_position(i);
            ASSERT_GE(pos, 0);
            ASSERT_LT(pos, N);
            ASSERT_EQ(owner[size_t(pos)], -1) << "token " << pos << " held twice";
            owner[size_t(pos)] = r;
          }
        }
        // One token per chunk at most: P chunks (contiguous, striped) or two per rank (zigzag).
        EXPECT_LE(max_tokens - min_tokens, sh == Sharding::Zigzag ? 2 : 1);
        std::vector<int64_t> chunk_size(size_t(chunks), 0);
        for (int64_t t = 0; t < N; ++t) {
          ASSERT_NE(owner[size_t(t)], -1) << "token " << t << " held by no rank";
          const int r = owner[size_t(t)];
          // Chunk c of n is [floor(c N / n), floor((c + 1) N / n)): found by scanning, as defined.
          int64_t c = 0;
          while (c + 1 < chunks && (c + 1) * N / chunks <= t) ++c;
          ++chunk_size[size_t(c)];
          if (sh == Sharding::Contiguous) EXPECT_EQ(r, c);
          if (sh == Sharding::Striped) EXPECT_EQ(r, t % P);
          if (sh == Sharding::Zigzag) EXPECT_TRUE(c == r || c == 2 * P - 1 - r) << "token " << t;
        }
        if (sh != Sharding::Striped)
          for (int64_t n : chunk_size) EXPECT_TRUE(n == N / chunks || n == N / chunks + 1) << n;
        if (P == 1) ASSERT_EQ(shard_layout(sh, N, 0, 1).segments.size(), 1u);  // a world of one never shards
      }
}

TEST(Shard, RanksBeyondTheTokensHoldNothing) {
  // Three tokens over four ranks: one rank holds none under every scheme, and still has a layout.
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped}) {
    const std::vector<int64_t> n = shard_tokens(sh, 3, 4);
    ASSERT_EQ(n.size(), 4u);
    EXPECT_EQ(n[0] + n[1] + n[2] + n[3], 3);
    EXPECT_EQ(*std::min_element(n.begin(), n.end()), 0) << sharding_name(sh);
  }
  const ShardLayout empty = shard_layout(Sharding::Striped, 3, 3, 4);
  EXPECT_TRUE(empty.segments.empty());
  EXPECT_EQ(empty.tokens(), 0);
  EXPECT_THROW(empty.global_position(0), InvalidArgument);
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

// doc-zigzag: every document is cut into 2P near-equal chunks and rank r holds chunks r and
// 2P-1-r of each, in document order; together the ranks hold every token once; without documents
// it is zigzag.
TEST(Shard, DocZigzagCutsEveryDocument) {
  const std::vector<std::vector<int64_t>> packings = {{1}, {5, 1, 1, 9, 3}, {17}, {2, 30, 1, 4}, {40, 3}};
  for (const std::vector<int64_t>& lens : packings)
    for (int P = 1; P <= 4; ++P) {
      std::vector<int64_t> cu{0};
      for (int64_t n : lens) cu.push_back(cu.back() + n);
      const Documents docs{cu.data(), int64_t(lens.size())};
      const int64_t N = cu.back();
      std::vector<int> owner(size_t(N), -1);
      for (int r = 0; r < P; ++r) {
        const ShardLayout l = shard_layout(Sharding::DocZigzag, N, r, P, docs);
        std::vector<int64_t> want;  // the positions rank r should hold, in row order
        for (size_t d = 0; d < lens.size(); ++d)
          for (const int64_t c : {int64_t(r), int64_t(2 * P - 1 - r)})
            for (int64_t t = c * lens[d] / (2 * P); t < (c + 1) * lens[d] / (2 * P); ++t) want.push_back(cu[d] + t);
        ASSERT_EQ(l.tokens(), int64_t(want.size())) << "P=" << P << " rank " << r;
        for (int64_t i = 0; i < l.tokens(); ++i) {
          const int64_t pos = l.global_position(i);
          ASSERT_EQ(pos, want[size_t(i)]) << "P=" << P << " rank " << r << " row " << i;
          ASSERT_EQ(owner[size_t(pos)], -1) << "token " << pos << " held twice";
          owner[size_t(pos)] = r;
        }
        for (const Segment& g : l.segments) ASSERT_GT(g.len, 0);
      }
      for (int64_t t = 0; t < N; ++t) ASSERT_GE(owner[size_t(t)], 0) << "token " << t << " held by no rank";
    }
  for (int P = 1; P <= 4; ++P)
    for (int r = 0; r < P; ++r)
      EXPECT_EQ(shard_layout(Sharding::DocZigzag, 77, r, P).tokens(), shard_layout(Sharding::Zigzag, 77, r, P).tokens());
  EXPECT_EQ(parse_sharding("doc-zigzag"), Sharding::DocZigzag);
  EXPECT_STREQ(sharding_name(Sharding::DocZigzag), "doc-zigzag");
}

TEST(Shard, ValuesThatCannotWorkAreNamed) {
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message([] { check_shardable(Sharding::Zigzag, 0, 4); }), "sequence length must be >= 1 (got 0)");
  EXPECT_EQ(message([] { check_shardable(Sharding::Striped, 10, 0); }), "the world must have at least one rank (got 0)");
  EXPECT_EQ(message([] { shard_layout(Sharding::Contiguous, 13, 3, 3); }), "rank 3 is outside the world of 3 ranks");
  EXPECT_EQ(message([] { check_shardable(Sharding::Zigzag, 100, 8); }), "");  // 100 is not a multiple of 16
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

// The output dtype defaults to the input's; another one can be said but is refused, since no
// kernel writes it yet.
TEST(Shard, OutputDtypeIsTheInputsUntilAKernelWritesAnother) {
  GlobalProblem p;
  p.batch = 1, p.q_heads = 2, p.kv_heads = 1, p.q_len = p.kv_len = 16, p.head_dim = 8;
  p.dtype = DType::F16;
  EXPECT_EQ(p.resolved_out_dtype(), DType::F16);
  p.out_dtype = DType::F16;
  EXPECT_NO_THROW(validate_problem(p, 2));
  p.out_dtype = DType::BF16;
  try {
    validate_problem(p, 2);
    ADD_FAILURE() << "accepted an output dtype other than the input's";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "output dtype bf16 differs from the input dtype fp16: no kernel writes an output in another "
                           "dtype than its input's yet; the output dtype must be fp16");
  }
}

}  // namespace
}  // namespace ringattn
