// The ring schedule's classification of (query segment, key segment) pairs, checked against a
// brute-force walk over absolute positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "common/test_util.hpp"
#include "core/error.hpp"
#include "runner/ring/ring_plan.hpp"
#include "runner/ring/schedule.hpp"

namespace ringattn {
namespace {

// For random runs of a shared stride, the class, the q_offset and the pair count reproduce the
// causal mask on absolute positions exactly.
TEST(RingSchedule, ClassifyPairMatchesPositions) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  int seen[3] = {0, 0, 0};
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t S = 1 + int64_t(rng() % 5);
    Segment q{int64_t(rng() % 40), 1 + int64_t(rng() % 9), S};
    Segment k{int64_t(rng() % 40), 1 + int64_t(rng() % 9), S};
    if (trial % 3 == 0) k.len = q.len;  // striped shards have equal lengths
    // A window on half the trials: each side unbounded or 0..12 tokens (right ignored when causal).
    const Window w = trial % 2 ? Window{} : Window{int64_t(rng() % 14) - 1, int64_t(rng() % 8) - 1};
    for (bool causal : {false, true}) {
      const PairClass c = classify_pair(q, k, causal, w);
      const int64_t right = causal ? 0 : w.right;
      int64_t visible = 0;
      bool all = true;
      for (int64_t i = 0; i < q.len; ++i)
        for (int64_t j = 0; j < k.len; ++j) {
          const int64_t pq = q.position(i), pk = k.position(j);
          const bool vis = (right < 0 || pk <= pq + right) && (w.left < 0 || pk >= pq - w.left);
          visible += vis;
          all = all && vis;
          if (c.visibility == PairVisibility::Diagonal)
            ASSERT_EQ(vis, is_visible(c.mask, i, j)) << "seed " << seed << " q " << q.start << "/" << q.len << " k "
                                                    << k.start << "/" << k.len << " S " << S << " window " << w.left
                                                    << "," << w.right;
        }
      ASSERT_EQ(c.visible_pairs, visible) << "seed " << seed;
      const PairVisibility want = visible == 0 ? PairVisibility::Invisible
                                  : all        ? PairVisibility::Full
                                               : PairVisibility::Diagonal;
      ASSERT_EQ(int(c.visibility), int(want)) << "seed " << seed << " q " << q.start << " k " << k.start;
      ++seen[int(c.visibility)];
    }
  }
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
}

TEST(RingSchedule, StripedOffsetsAreZeroOrMinusOne) {
  const int P = 4;
  const int64_t n = 6;
  for (int r = 0; r < P; ++r)
    for (int rs = 0; rs < P; ++rs) {
      const PairClass c = classify_pair({r, n, P}, {rs, n, P}, true);
      EXPECT_EQ(c.visibility, PairVisibility::Diagonal);
      EXPECT_EQ(c.mask.q_offset, rs <= r ? 0 : -1) << r << " " << rs;
    }
}

TEST(RingSchedule, UnequalStridesAreRejected) {
  EXPECT_THROW(classify_pair({0, 4, 1}, {0, 4, 2}, true), InvalidArgument);
}

// The self-attention problem of N tokens under sharding `sh`, with documents `lens` and window `w`.
GlobalProblem problem_of(Sharding sh, int64_t N, bool causal, const std::vector<int64_t>& lens = {}, Window w = {}) {
  GlobalProblem p;
  p.q_len = p.kv_len = N;
  p.causal = causal;
  p.sharding = sh;
  p.doc_lens = lens;
  p.window = w;
  return p;
}

// Every (query position, key position) pair that the calls of `s` compute, counted into `count`
// (for the rank's hops in order; `remote(rank)` is the layout of a block's source).
using PairTally = std::map<std::pair<int64_t, int64_t>, int>;
void tally_calls(const RingSchedule& s, Sharding sh, int64_t N, int P, int r, PairTally& count,
                 const RingPlan* plan = nullptr, Documents docs = {}) {
  ASSERT_EQ(int(s.hops().size()), P);
  for (int h = 0; h < P; ++h) {
    const HopPlan& hop = s.hops()[size_t(h)];
    ASSERT_EQ(hop.source_rank, ((r - h) % P + P) % P);
    const ShardLayout remote = shard_layout(sh, N, hop.source_rank, P, docs);
    for (const PairCall& c : hop.calls) {
      ASSERT_GT(c.visible_pairs, 0);
      for (int64_t i = 0; i < c.q_rows; ++i)
        for (int64_t j = 0; j < c.k_rows; ++j)
          if (is_visible(c.mask, i, j))
            ++count[{s.local_layout().global_position(c.q_row0 + i), remote.global_position(c.k_row0 + j)}];
      // A hop computes only on a block that reached it: the ring takes it (RingPlan::hops) and
      // the previous holder carried it on (RingPlan::carries).
      if (plan != nullptr && h > 0) {
        ASSERT_LT(h, plan->hops()) << "hop " << h << " computes past the ring's last hop";
        ASSERT_TRUE(plan->carries(hop.source_rank, h - 1)) << "hop " << h << " block not carried";
      }
    }
  }
}

// Over all ranks and hops, every visible (query, key) position pair is computed exactly once,
// no invisible pair is computed, and no call is made for a pair with nothing visible.
TEST(RingSchedule, CoversTheMaskExactlyOnce) {
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped})
    for (int P = 1; P <= 5; ++P)
      for (const int64_t N : {int64_t(1), int64_t(2), int64_t(3), int64_t(7), int64_t(6 * P), int64_t(6 * P + 5)})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(testing::Message() << sharding_name(sh) << " P=" << P << " N=" << N << " causal=" << causal);
        PairTally count;
        int64_t total = 0;
        const std::vector<ShardLayout> layouts = shard_layouts(sh, N, P);
        for (int r = 0; r < P; ++r) {
          const RingSchedule s(layouts, r, causal);
          tally_calls(s, sh, N, P, r, count);
          total += s.visible_pairs();
        }
        for (const auto& [pair, n] : count) ASSERT_TRUE(!causal || pair.second <= pair.first);
        const int64_t want = causal ? N * (N + 1) / 2 : N * N;
        EXPECT_EQ(int64_t(count.size()), want);
        EXPECT_EQ(total, want);
        for (const auto& [pair, n] : count) ASSERT_EQ(n, 1) << pair.first << "," << pair.second;
      }
}

// Packed documents: over every sharding, P = 1..4 and packings with documents of length 1,
// documents shorter than a shard and documents spanning several ranks, every pair of one
// document that the mask shows is computed exactly once, and no pair across documents is.
TEST(RingSchedule, DocumentsAreCoveredExactlyOnceAndNeverCrossed) {
  const std::vector<std::vector<int64_t>> packings = {
      {1}, {5, 1, 1, 9, 3}, {1, 1, 1, 1, 1, 1, 1}, {17}, {2, 30, 1, 4}, {40, 3}};
  for (const std::vector<int64_t>& lens : packings) {
    std::vector<int64_t> cu{0};
    for (int64_t n : lens) cu.push_back(cu.back() + n);
    const int64_t N = cu.back();
    std::vector<int64_t> doc_of(size_t(N), 0);
    for (size_t d = 0; d + 1 < cu.size(); ++d)
      for (int64_t t = cu[d]; t < cu[d + 1]; ++t) doc_of[size_t(t)] = int64_t(d);
    const Documents docs{cu.data(), int64_t(cu.size()) - 1};
    for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped, Sharding::DocZigzag})
      for (int P = 1; P <= 4; ++P)
        for (bool causal : {false, true}) {
          SCOPED_TRACE(testing::Message() << sharding_name(sh) << " P=" << P << " N=" << N << " causal=" << causal);
          PairTally count;
          int64_t total = 0;
          const std::vector<ShardLayout> layouts = shard_layouts(sh, N, P, docs);
          for (int r = 0; r < P; ++r) {
            const RingSchedule s(layouts, r, causal, docs);
            tally_calls(s, sh, N, P, r, count, nullptr, docs);
            total += int64_t(s.visible_pairs());
          }
          for (const auto& [pair, n] : count) {
            ASSERT_EQ(doc_of[size_t(pair.first)], doc_of[size_t(pair.second)]) << pair.first << "," << pair.second;
            ASSERT_TRUE(!causal || pair.second <= pair.first);
          }
          int64_t want = 0;
          for (int64_t n : lens) want += causal ? n * (n + 1) / 2 : n * n;
          EXPECT_EQ(int64_t(count.size()), want);
          EXPECT_EQ(total, want);
          for (const auto& [pair, n] : count) ASSERT_EQ(n, 1) << pair.first << "," << pair.second;
        }
  }
}

// Windows, with and without documents: over every sharding, P = 1..4, odd lengths and windows
// narrower and wider than a shard, every pair inside the band (and the document) is computed
// exactly once and none outside; every hop that computes received its block (RingPlan::carries),
// and the ring stops after the last one (RingPlan::hops).
TEST(RingSchedule, WindowsAreCoveredExactlyOnceAndHopsStopEarly) {
  const std::vector<std::vector<int64_t>> packings = {{}, {5, 1, 9, 3, 13}};
  const std::vector<Window> windows = {{0, 0}, {1, -1}, {3, 2}, {-1, 1}, {6, 0}, {20, -1}, {2, 5}};
  for (const std::vector<int64_t>& lens : packings)
    for (const Window& w : windows)
      for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped, Sharding::DocZigzag})
        for (int P = 1; P <= 4; ++P)
          for (bool causal : {false, true}) {
            if (causal && w.right > 0) continue;  // refused by validate_problem
            std::vector<int64_t> cu{0};
            for (int64_t n : lens) cu.push_back(cu.back() + n);
            const int64_t N = lens.empty() ? 31 : cu.back();
            const Documents docs = lens.empty() ? Documents{} : Documents{cu.data(), int64_t(lens.size())};
            SCOPED_TRACE(testing::Message() << sharding_name(sh) << " P=" << P << " N=" << N << " causal=" << causal
                                            << " window " << w.left << "," << w.right << " docs " << lens.size());
            const RingPlan plan = ring_plan(problem_of(sh, N, causal, lens, w), P);
            PairTally count;
            int64_t total = 0;
            for (int r = 0; r < P; ++r) {
              const RingSchedule s(plan.layouts(), r, causal, docs, w);
              tally_calls(s, sh, N, P, r, count, &plan, docs);
              total += int64_t(s.visible_pairs());
            }
            int64_t want = 0;
            for (int64_t q = 0; q < N; ++q) {
              const KeyRange keys = document_keys(docs, causal, q, w, N);
              for (int64_t k = 0; k < N; ++k) {
                const bool in = k >= keys.begin && k < keys.end;
                want += in;
                const auto it = count.find({q, k});
                ASSERT_EQ(it == count.end() ? 0 : it->second, in ? 1 : 0) << "query " << q << " key " << k;
              }
            }
            EXPECT_EQ(total, want);
          }
}

// Contiguous shards with a window no longer than a shard: rank r needs only its own block and
// rank r - 1's, so the ring takes two hops and sends each block once (the last rank's not at all
// when causal).
TEST(RingSchedule, ContiguousWindowTakesOneHop) {
  for (int P = 2; P <= 6; ++P)
    for (const int64_t left : {int64_t(1), int64_t(16), int64_t(100)}) {
      const int64_t N = 100 * P + 3;
      const RingPlan plan = ring_plan(problem_of(Sharding::Contiguous, N, true, {}, {left, 0}), P);
      EXPECT_EQ(plan.hops(), 2) << "P=" << P << " left " << left;
      for (int q = 0; q < P; ++q) EXPECT_EQ(plan.carries(q, 0), q + 1 < P) << "block of " << q;
      // A window longer than a shard reaches two ranks back.
      EXPECT_EQ(ring_plan(problem_of(Sharding::Contiguous, N, true, {}, {150, 0}), P).hops(), std::min(P, 3));
      // Zigzag needs the whole ring: each rank's second chunk borders the next rank's.
      EXPECT_EQ(ring_plan(problem_of(Sharding::Zigzag, N, true, {}, {left, 0}), P).hops(), P);
      // Auto: contiguous is balanced (its first rank's ramp is short) and sends the least. A
      // window as long as a shard makes rank 0 light (imbalance ~1.2): auto then balances work.
      const GlobalProblem windowed = problem_of(Sharding::Zigzag, N, true, {}, {left, 0});
      if (left <= 16) EXPECT_EQ(best_sharding(windowed, P), Sharding::Contiguous) << "P=" << P;
      else EXPECT_NE(best_sharding(windowed, P), Sharding::Contiguous) << "P=" << P;
    }
}

// --shard auto: the pick has the smallest imbalance of the three (ties to the earlier in
// kAutoOrder), over dense and packed problems; dense causal picks zigzag, and a packing whose
// documents make zigzag lopsided picks another.
TEST(RingSchedule, BestShardingIsTheBestBalanced) {
  const std::vector<std::vector<int64_t>> packings = {{}, {100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 1000, 1000},
                                                      {1, 2999}, {1500, 1500}, {7, 7, 7, 2979}};
  for (const std::vector<int64_t>& lens : packings)
    for (int P = 1; P <= 4; ++P)
      for (bool causal : {false, true}) {
        int64_t N = lens.empty() ? 3000 : 0;
        for (int64_t n : lens) N += n;
        double imb[kShardings];
        for (int i = 0; i < kShardings; ++i) imb[i] = ring_plan(problem_of(kAutoOrder[i], N, causal, lens), P).imbalance();
        const Sharding best = best_sharding(problem_of(Sharding::Zigzag, N, causal, lens), P);
        int bi = 0;
        while (kAutoOrder[bi] != best) ++bi;
        for (int i = 0; i < kShardings; ++i) {
          EXPECT_LE(imb[bi], imb[i] + 1e-12) << "P=" << P << " docs " << lens.size();
          if (i < bi) EXPECT_GT(imb[i], imb[bi] + 1e-12) << "a tie goes to the earlier sharding";
        }
        if (lens.empty() && P > 1) EXPECT_EQ(best, Sharding::Zigzag);
      }
  // Twelve documents, two of them long, over three ranks: zigzag is lopsided, striped is not.
  EXPECT_GT(ring_plan(problem_of(Sharding::Zigzag, 3000, true, packings[1]), 3).imbalance(), 1.05);
  EXPECT_EQ(best_sharding(problem_of(Sharding::Zigzag, 3000, true, packings[1]), 3), Sharding::Striped);
}

TEST(RingSchedule, ContiguousCausalOnlyForwardsBlocksFromLaterRanks) {
  const int P = 4;
  for (int r = 0; r < P; ++r) {
    const RingSchedule s(shard_layouts(Sharding::Contiguous, 64, P), r, true);
    for (const HopPlan& h : s.hops()) {
      EXPECT_EQ(h.calls.empty(), h.source_rank > r) << "rank " << r << " source " << h.source_rank;
      if (h.source_rank == r) {
        ASSERT_EQ(h.calls.size(), 1u);
        EXPECT_TRUE(h.calls[0].mask.causal);
        EXPECT_EQ(h.calls[0].mask.q_offset, 0);
      }
      if (h.source_rank < r) {
        ASSERT_EQ(h.calls.size(), 1u);
        EXPECT_FALSE(h.calls[0].mask.causal);  // fully visible: no mask cost
      }
    }
  }
}

// Zigzag balances causal work exactly: every rank computes the same number of visible pairs;
// contiguous does not (rank P-1 does 2P-1 times the work of rank 0).
TEST(RingSchedule, ZigzagBalancesCausalWork) {
  for (int P : {2, 3, 4, 8}) {
    const int64_t N = 2 * P * 16;
    std::set<int64_t> zig;
    int64_t cmin = INT64_MAX, cmax = 0;
    for (int r = 0; r < P; ++r) {
      zig.insert(RingSchedule(shard_layouts(Sharding::Zigzag, N, P), r, true).visible_pairs());
      const int64_t c = RingSchedule(shard_layouts(Sharding::Contiguous, N, P), r, true).visible_pairs();
      cmin = std::min(cmin, c);
      cmax = std::max(cmax, c);
    }
    EXPECT_EQ(zig.size(), 1u) << "P=" << P;
    const int64_t C = N / P;
    EXPECT_EQ(cmin, C * (C + 1) / 2);
    EXPECT_EQ(cmax, (P - 1) * C * C + C * (C + 1) / 2);
  }
}

}  // namespace
}  // namespace ringattn
