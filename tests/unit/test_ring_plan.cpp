// The ring plan (runner/ring/ring_plan.hpp) against brute force: for every sharding at P = 1..5
// over random lengths, masks, windows and documents, and for layouts no sharding names (a
// permuted union of contiguous shards, hybrid groups striped inside), the plan made from the
// layouts keeps the rank's schedule, and its counts, routes, shipped rows, hops, block capacity
// and the bytes of both rings are what the ranks' positions say by definition. check_layouts
// refuses layouts that do not share the sequence out, by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>

#include "common/layouts.hpp"
#include "common/test_util.hpp"
#include "core/error.hpp"
#include "runner/ring/ring_plan.hpp"

namespace ringattn {
namespace {

// What the layouts say by definition (test::visible_by_definition on global positions), without
// the schedule: whether rank q + h sees a key of q's block at hop h, each rank's pairs, the rows of
// each block that ranks at later hops see, and the first such hop.
struct Oracle {
  int P = 0;
  std::vector<char> need;  // [q * P + h]
  std::vector<PairCount> pairs;
  std::vector<KeyRange> shipped;
  std::vector<int> first_remote;
  bool needs(int q, int h) const { return need[size_t(q) * size_t(P) + size_t(h)] != 0; }
};

std::vector<int64_t> positions(const ShardLayout& l) {
  std::vector<int64_t> pos;
  for (const Segment& g : l.segments)
    for (int64_t i = 0; i < g.len; ++i) pos.push_back(g.position(i));
  return pos;
}

Oracle oracle(const std::vector<ShardLayout>& layouts, const GlobalProblem& p) {
  Oracle o;
  o.P = int(layouts.size());
  const size_t P = size_t(o.P);
  o.need.assign(P * P, 0);
  o.pairs.assign(P, 0);
  o.shipped.assign(P, KeyRange{});
  o.first_remote.assign(P, o.P);
  std::vector<std::vector<int64_t>> pos;
  for (const ShardLayout& l : layouts) pos.push_back(positions(l));
  for (size_t q = 0; q < P; ++q)
    for (size_t h = 0; h < P; ++h) {
      const size_t x = (q + h) % P;
      for (int64_t qp : pos[x])
        for (size_t j = 0; j < pos[q].size(); ++j) {
          if (!test::visible_by_definition(p.causal, p.window, p.doc_lens, qp, pos[q][j])) continue;
          o.need[q * P + h] = 1;
          ++o.pairs[x];
          if (h == 0) continue;
          KeyRange& s = o.shipped[q];
          s = s.empty() ? KeyRange{int64_t(j), int64_t(j) + 1}
                        : KeyRange{std::min(s.begin, int64_t(j)), std::max(s.end, int64_t(j) + 1)};
          o.first_remote[q] = std::min(o.first_remote[q], int(h));
        }
    }
  return o;
}

int src_of(int r, int s, int P) { return ((r - s) % P + P) % P; }

// The K/V ring of the plan against the oracle: carried blocks, hops, shipped rows, bytes.
void expect_kv_ring(const RingPlan& plan, const Oracle& o, uint64_t kv_token) {
  const int P = o.P;
  int hops = 1;
  int64_t most = 1;
  for (int q = 0; q < P; ++q) {
    const KeyRange got = plan.routes().shipped[size_t(q)], want = o.shipped[size_t(q)];
    EXPECT_TRUE(got.empty() ? want.empty() : got.begin == want.begin && got.end == want.end)
        << "block of rank " << q << ": rows [" << got.begin << ", " << got.end << ") shipped, [" << want.begin << ", "
        << want.end << ") seen";
    EXPECT_EQ(plan.routes().first_remote_hop[size_t(q)], o.first_remote[size_t(q)]) << "block of rank " << q;
    most = std::max(most, want.size());
    for (int h = 0; h < P; ++h) {
      bool later = false;
      for (int g = h + 1; g < P; ++g) later = later || o.needs(q, g);
      EXPECT_EQ(plan.carries(q, h), later && h + 1 < P) << "block of rank " << q << " at hop " << h;
      if (later && h + 1 < P) hops = std::max(hops, h + 2);
      EXPECT_EQ(plan.computes((q + h) % P, h), o.needs(q, h)) << "rank " << (q + h) % P << " hop " << h;
    }
  }
  EXPECT_EQ(plan.hops(), std::min(hops, P));
  EXPECT_EQ(plan.block_tokens(), most);
  EXPECT_EQ(plan.block_bytes(), kv_token * uint64_t(most));
  for (int r = 0; r < P; ++r) {
    uint64_t bytes = 0;
    for (int s = 0; s + 1 < P; ++s) {
      const int q = src_of(r, s, P);
      if (plan.carries(q, s)) bytes += kv_token * uint64_t(o.shipped[size_t(q)].size());
      EXPECT_EQ(plan.sends_block(r, s), s + 1 < plan.hops() && plan.carries(q, s) && !o.shipped[size_t(q)].empty());
    }
    EXPECT_EQ(plan.ring_bytes(r), bytes) << "rank " << r;
  }
}

// The dK/dV ring: an accumulator travels from its block's first remote hop until it is home.
void expect_grad_ring(const RingPlan& plan, const Oracle& o, uint64_t grad_token) {
  const int P = o.P;
  const auto travels = [&](int q, int s) { return o.first_remote[size_t(q)] <= s - 1; };
  for (int s = 1; s <= P; ++s) {
    bool runs = false;
    for (int q = 0; q < P; ++q) runs = runs || travels(q, s);
    EXPECT_EQ(plan.grad_exchange_runs(s), runs) << "exchange " << s;
    for (int r = 0; r < P; ++r) {
      const int sent = src_of(r, s - 1, P), got = src_of(r, s, P);
      EXPECT_EQ(plan.grad_sends(r, s), travels(sent, s) && !o.shipped[size_t(sent)].empty());
      EXPECT_EQ(plan.grad_receives(r, s), travels(got, s) && !o.shipped[size_t(got)].empty());
    }
  }
  EXPECT_FALSE(plan.grad_exchange_runs(0));
  EXPECT_FALSE(plan.grad_exchange_runs(P + 1));
  for (int r = 0; r < P; ++r) {
    uint64_t bytes = 0;
    for (int s = 1; s <= P; ++s)
      if (travels(src_of(r, s - 1, P), s)) bytes += grad_token * uint64_t(o.shipped[size_t(src_of(r, s - 1, P))].size());
    EXPECT_EQ(plan.grad_bytes(r), bytes) << "rank " << r;
    EXPECT_EQ(plan.backward_bytes(r), plan.ring_bytes(r) + bytes);
  }
  EXPECT_EQ(plan.grad_block_bytes(), grad_token * uint64_t(plan.block_tokens()));
}

bool same_calls(const RingSchedule& a, const RingSchedule& b) {
  if (a.hops().size() != b.hops().size()) return false;
  for (size_t h = 0; h < a.hops().size(); ++h) {
    const HopPlan &x = a.hops()[h], &y = b.hops()[h];
    if (x.source_rank != y.source_rank || x.calls.size() != y.calls.size() || x.visible_pairs != y.visible_pairs)
      return false;
    for (size_t i = 0; i < x.calls.size(); ++i) {
      const PairCall &c = x.calls[i], &d = y.calls[i];
      if (c.q_row0 != d.q_row0 || c.q_rows != d.q_rows || c.k_row0 != d.k_row0 || c.k_rows != d.k_rows ||
          c.visible_pairs != d.visible_pairs || c.mask.causal != d.mask.causal || c.mask.q_offset != d.mask.q_offset ||
          c.mask.window != d.mask.window)
        return false;
    }
  }
  return true;
}

// The plan of `layouts` keeping rank `keep`, against the oracle and against the rank's schedule
// built on its own from the same layouts.
void expect_plan(const GlobalProblem& p, const std::vector<ShardLayout>& layouts, int keep) {
  const RingPlan plan(p, layouts, keep);
  const int P = int(layouts.size());
  ASSERT_EQ(plan.world(), P);
  ASSERT_EQ(plan.kept_rank(), keep);
  const std::vector<int64_t> bounds = p.doc_bounds();
  const Documents docs = documents_of(bounds);
  const Oracle o = oracle(layouts, p);
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(positions(plan.layout(r)), positions(layouts[size_t(r)])) << "rank " << r;
    EXPECT_TRUE(plan.visible_pairs(r) == o.pairs[size_t(r)]) << "rank " << r;
    const RingSchedule own(layouts, r, p.causal, docs, p.window);
    EXPECT_EQ(plan.kernel_calls(r), own.kernel_calls()) << "rank " << r;
    if (r == keep) EXPECT_TRUE(same_calls(plan.schedule(), own)) << "rank " << r << "'s calls";
  }
  const uint64_t per = uint64_t(p.batch * p.kv_heads * p.head_dim);
  expect_kv_ring(plan, o, 2 * per * uint64_t(dtype_size(p.dtype)));
  expect_grad_ring(plan, o, 2 * per * sizeof(float));
}

// A random problem of N tokens: causal or not, a window on half, documents on half.
GlobalProblem random_problem(int64_t N, std::mt19937_64& rng) {
  GlobalProblem p;
  p.batch = 1 + int64_t(rng() % 2);
  p.kv_heads = 1 + int64_t(rng() % 2);
  p.q_heads = p.kv_heads * 2;
  p.head_dim = rng() % 2 ? 4 : 8;
  p.dtype = rng() % 2 ? DType::F32 : DType::BF16;
  p.q_len = p.kv_len = N;
  p.causal = rng() % 2;
  if (rng() % 2) {
    p.window = {int64_t(rng() % 14) - 1, int64_t(rng() % 8) - 1};
    if (p.causal && p.window.right > 0) p.window.right = 0;
  }
  if (rng() % 2)
    for (int64_t left = N; left > 0;) {
      const int64_t n = std::min<int64_t>(left, 1 + int64_t(rng() % 12));
      p.doc_lens.push_back(n);
      left -= n;
    }
  return p;
}

std::string describe(const GlobalProblem& p, int P) {
  return fmt::format("P={} N={} causal={} window {},{} docs {} batch {} kv_heads {} dim {}", P, p.q_len, p.causal,
                     p.window.left, p.window.right, p.doc_lens.size(), p.batch, p.kv_heads, p.head_dim);
}

// Every sharding at P = 1..5: the plan made from the sharding's layouts is the per-rank schedule
// and what the positions say.
TEST(RingPlan, EveryShardingsPlanMatchesItsSchedulesAndPositions) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (const Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped, Sharding::DocZigzag})
    for (int P = 1; P <= 5; ++P)
      for (int trial = 0; trial < 12; ++trial) {
        GlobalProblem p = random_problem(1 + int64_t(rng() % 48), rng);
        p.sharding = sh;
        const std::vector<int64_t> bounds = p.doc_bounds();
        const std::vector<ShardLayout> layouts = shard_layouts(sh, p.q_len, P, documents_of(bounds));
        SCOPED_TRACE(fmt::format("seed {} {} {}", seed, sharding_name(sh), describe(p, P)));
        const int keep = int(rng() % uint64_t(P));
        expect_plan(p, layouts, keep);
        const RingPlan made = ring_plan(p, P, keep);  // the helper: the same layouts, the same plan
        EXPECT_EQ(made.layouts_hash(), RingPlan(p, layouts).layouts_hash());
        EXPECT_TRUE(same_calls(made.schedule(), RingSchedule(layouts, keep, p.causal, documents_of(bounds), p.window)));
      }
}

// Layouts no sharding names: each rank's plan computes every visible pair exactly once over the
// ranks, none invisible, and its routes and bytes are what the positions say.
TEST(RingPlan, LayoutsNoShardingNamesArePlansLikeAnyOther) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int P = 1; P <= 5; ++P)
    for (int trial = 0; trial < 16; ++trial) {
      const GlobalProblem p = random_problem(1 + int64_t(rng() % 60), rng);
      const int group = P % 2 == 0 ? 2 : trial % 3 == 0 ? P : 1;
      const std::vector<ShardLayout> layouts = trial % 2 ? test::permuted_chunks(p.q_len, P, 1 + int(rng() % 3), rng)
                                                         : test::striped_groups(p.q_len, P, group);
      SCOPED_TRACE(fmt::format("seed {} {} {}", seed, trial % 2 ? "permuted chunks" : "striped groups", describe(p, P)));
      std::map<std::pair<int64_t, int64_t>, int> count;
      for (int r = 0; r < P; ++r) {
        expect_plan(p, layouts, r);
        const RingPlan plan(p, layouts, r);
        for (const HopPlan& hop : plan.schedule().hops())
          for (const PairCall& c : hop.calls)
            for (int64_t i = 0; i < c.q_rows; ++i)
              for (int64_t j = 0; j < c.k_rows; ++j)
                if (is_visible(c.mask, i, j))
                  ++count[{layouts[size_t(r)].global_position(c.q_row0 + i),
                           layouts[size_t(hop.source_rank)].global_position(c.k_row0 + j)}];
      }
      for (int64_t q = 0; q < p.q_len; ++q)
        for (int64_t k = 0; k < p.q_len; ++k) {
          const auto it = count.find({q, k});
          ASSERT_EQ(it == count.end() ? 0 : it->second,
                    test::visible_by_definition(p.causal, p.window, p.doc_lens, q, k) ? 1 : 0)
              << "query " << q << " key " << k;
        }
    }
}

std::string refusal(const std::vector<ShardLayout>& layouts, int64_t N) {
  try {
    check_layouts(layouts, N);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

ShardLayout of(std::vector<Segment> segments) { return ShardLayout{std::move(segments)}; }

TEST(RingPlan, LayoutsThatDoNotShareTheSequenceOutAreRefusedByName) {
  EXPECT_EQ(refusal({of({{0, 4, 1}}), of({{3, 5, 1}})}, 8),
            "position 3 is held twice: by rank 0 (segment 0) and by rank 1 (segment 0); every position must be on "
            "exactly one rank");
  EXPECT_EQ(refusal({of({{0, 4, 2}}), of({{1, 1, 1}, {3, 2, 3}, {5, 1, 1}, {7, 1, 1}})}, 8),
            "position 6 is held twice: by rank 0 (segment 0) and by rank 1 (segment 1); every position must be on "
            "exactly one rank");
  EXPECT_EQ(refusal({of({{0, 3, 1}}), of({{4, 4, 1}})}, 8),
            "the layouts of the 2 ranks hold 7 of the 8 positions: every position must be on exactly one rank");
  EXPECT_EQ(refusal({of({{0, 4, 1}}), of({{4, 5, 1}})}, 8),
            "rank 1 segment 0 (start 4, 5 tokens, stride 1): its positions 4 to 8 leave the sequence [0, 8)");
  EXPECT_EQ(refusal({of({{0, 4, 1}, {4, 0, 1}}), of({{4, 4, 1}})}, 8),
            "rank 0 segment 1 (start 4, 0 tokens, stride 1): a segment holds at least one token");
  EXPECT_EQ(refusal({of({{0, 2, 0}})}, 2), "rank 0 segment 0 (start 0, 2 tokens, stride 0): the stride must be >= 1");
  EXPECT_EQ(refusal({of({{-1, 2, 1}})}, 2),
            "rank 0 segment 0 (start -1, 2 tokens, stride 1): its positions -1 to 0 leave the sequence [0, 2)");
  EXPECT_EQ(refusal({}, 2), "the world must have at least one rank (got 0)");
  // Interleaved runs that share nothing pass: two stripes of stride 3 and one of 6 and 6.
  EXPECT_EQ(refusal({of({{0, 4, 3}}), of({{1, 4, 3}}), of({{2, 2, 6}, {5, 2, 6}})}, 12), "");
  // The plan refuses them with the same words; a rank with an empty layout is a plan.
  GlobalProblem p;
  p.q_len = p.kv_len = 8;
  try {
    const std::vector<ShardLayout> bad = {of({{0, 3, 1}}), of({{4, 4, 1}})};
    (void)RingPlan(p, bad, 0);
    ADD_FAILURE() << "a layout leaving position 3 out made a plan";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "the layouts of the 2 ranks hold 7 of the 8 positions: every position must be on exactly one rank");
  }
  const std::vector<ShardLayout> with_empty = {of({{0, 8, 1}}), ShardLayout{}};
  EXPECT_EQ(RingPlan(p, with_empty, 1).layout(1).tokens(), 0);
}

// A causal call needs its query and key runs at one stride: layouts that mix strides so that a
// call would need two are refused by the plan, naming the runs.
TEST(RingPlan, MixedStridesUnderAMaskAreRefused) {
  GlobalProblem p;
  p.q_len = p.kv_len = 7;
  p.causal = true;
  const std::vector<ShardLayout> layouts = {of({{0, 3, 2}}), of({{1, 1, 1}, {3, 1, 1}, {5, 2, 1}})};
  try {
    (void)RingPlan(p, layouts, 0);
    ADD_FAILURE() << "mixed strides made a causal plan";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "cannot express query run (start 0, stride 2) against key run (start 5, stride 1) as one "
                           "kernel call: the strides must be equal and >= 1");
  }
  p.causal = false;  // full attention needs no mask: any strides
  EXPECT_EQ(RingPlan(p, layouts, 0).hops(), 2);
}

// A plan runs only the problem and the rank it was made for; one made to count keeps no calls.
TEST(RingPlan, APlanFitsOnlyItsProblemAndRank) {
  GlobalProblem p;
  p.q_len = p.kv_len = 12;
  p.batch = 2, p.q_heads = 2, p.kv_heads = 1, p.head_dim = 8;
  p.causal = true;
  const RingPlan plan = ring_plan(p, 3, 1);
  EXPECT_NO_THROW(plan.check_fits(p, 3, 1));
  const auto refusal_of = [&](const GlobalProblem& q, int world, int rank) {
    try {
      plan.check_fits(q, world, rank);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal_of(p, 3, 2), "the ring plan was made for 3 ranks keeping the calls of rank 1, but this is rank 2 of 3");
  GlobalProblem q = p;
  q.causal = false;
  EXPECT_EQ(refusal_of(q, 3, 1),
            "the ring plan was made for causal 1, but the problem has 0: make the plan for the problem it runs");
  q = p;
  q.head_dim = 16;
  EXPECT_EQ(refusal_of(q, 3, 1),
            "the ring plan was made for head_dim 8, but the problem has 16: make the plan for the problem it runs");
  try {
    (void)ring_plan(p, 3).schedule();
    ADD_FAILURE() << "a counting plan handed out calls";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "this ring plan keeps no rank's calls (it was made with rank -1): make it for the rank that runs");
  }
  q = p;
  q.kv_len = 13;
  try {
    (void)RingPlan(q, shard_layouts(Sharding::Zigzag, 12, 3));
    ADD_FAILURE() << "a decode problem made a ring plan";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "a ring plan needs self-attention (q_len == kv_len, q_offset 0); got q_len=12, kv_len=13, q_offset=1");
  }
}

}  // namespace
}  // namespace ringattn
