// `ringattn plan`: the ring schedule of a problem without running it (no MPI, no data): each
// rank's tokens and segments, its kernel calls, visible query-key pairs and bytes sent over all
// hops, the hops the ring takes, and the load balance of every sharding, so a sharding can be
// chosen before a long run.
//
// Memory and time stay linear in the ranks beyond kPlanRowRanks: a rank's visible pairs come from
// its positions alone (rank_pairs), and the table is a summary. Up to kPlanRowRanks ranks the
// table has a row per rank from the ring plan (ring_plan.hpp: every rank's schedule built once, P
// hops each, one rank's in memory at a time), which a run follows too. Pair counts are 128-bit,
// so no length the flags allow wraps them. A window (--window) or documents have no closed form
// here: their pairs come from the plans of every sharding, so such a plan is limited to
// kPlanRowRanks ranks.
#include <algorithm>

#include <fmt/format.h>

#include "cli/context_parallel.hpp"
#include "cli/problem.hpp"
#include "cli/report.hpp"
#include "cli/run.hpp"
#include "runner/problem/checked.hpp"
#include "core/error.hpp"
#include "runner/ring/hybrid.hpp"
#include "runner/ring/ring.hpp"
#include "runner/ring/ring_plan.hpp"

namespace ringattn::cli {
namespace {

// Up to this many ranks the plan prints one row per rank (with its kernel calls, which need every
// rank's schedule: P^2 work in all); beyond it, a summary of the ranks.
constexpr int kPlanRowRanks = 1024;

std::string segments_text(const ShardLayout& l) {
  std::string s;
  for (const Segment& g : l.segments) {
    if (!s.empty()) s += ' ';
    if (g.stride == 1)
      s += fmt::format("[{},{})", g.start, g.start + g.len);
    else
      s += fmt::format("{}+{}k (k<{})", g.start, g.stride, g.len);
  }
  return s;
}

// The query-key pairs a rank computes over the whole ring, per (batch, head), from its positions
// alone: causal self-attention lets the query at position t see the t + 1 keys 0..t; without the
// mask each query sees all seq keys. Equals RingPlan::visible_pairs (tests/unit).
PairCount rank_pairs(const ShardLayout& l, int64_t seq, bool causal) {
  PairCount n = 0;
  for (const Segment& g : l.segments) {
    if (!causal) {
      n += PairCount(g.len) * seq;
      continue;
    }
    // sum over i < len of (start + i * stride + 1); stride * len <= seq keeps it below seq^2.
    n += PairCount(g.len) * (PairCount(g.start) + 1) + PairCount(g.stride) * g.len * (g.len - 1) / 2;
  }
  return n;
}

// The ranks' pair counts of one sharding: the largest, the smallest and the sum.
struct PairStats {
  PairCount max = 0, min = 0, sum = 0;
  int max_rank = 0, min_rank = 0;
  int64_t min_tokens = 0, max_tokens = 0;  // shards may be uneven (by one token per chunk)
};

void add_rank(PairStats& st, int r, int64_t tokens, PairCount v) {
  if (r == 0 || tokens < st.min_tokens) st.min_tokens = tokens;
  if (r == 0 || tokens > st.max_tokens) st.max_tokens = tokens;
  if (r == 0 || v > st.max) st.max = v, st.max_rank = r;
  if (r == 0 || v < st.min) st.min = v, st.min_rank = r;
  st.sum += v;
}

// From the closed form (dense attention over one document), one rank's layout at a time.
PairStats pair_stats(Sharding s, int64_t seq, bool causal, int world) {
  PairStats st;
  for (int r = 0; r < world; ++r) {
    const ShardLayout l = shard_layout(s, seq, r, world);
    add_rank(st, r, l.tokens(), rank_pairs(l, seq, causal));
  }
  return st;
}

// From a plan's schedules.
PairStats pair_stats(const RingPlan& plan) {
  PairStats st;
  for (int r = 0; r < plan.world(); ++r) add_rank(st, r, plan.layout(r).tokens(), plan.visible_pairs(r));
  return st;
}

// max / mean of the ranks' visible pairs: 1.0 is perfect balance; the slowest rank sets the pace.
double imbalance(const PairStats& st, int world) {
  return st.sum > 0 ? to_double(st.max) * world / to_double(st.sum) : 1.0;
}

// GFLOP as a fixed-point figure while it fits the column, in exponent form beyond (a long
// sequence's 3.1e+17 GFLOP printed 21 digits and pushed the columns apart).
std::string gflop_text(double gflop) { return gflop < 1e8 ? fmt::format("{:.3f}", gflop) : fmt::format("{:.4e}", gflop); }

double share_percent(PairCount v, PairCount total) { return total > 0 ? 100.0 * to_double(v) / to_double(total) : 0.0; }

// One row per rank: tokens, kernel calls, GFLOP, the hops (of those the ring takes) that only
// forward, the share of the pairs, the K/V bytes it sends (RingPlan::ring_bytes: what a run reports).
void print_rank_rows(const GlobalProblem& p, const RingPlan& plan, PairCount total, double flop_per_pair) {
  const int ranks = plan.world(), hops = plan.hops();
  fmt::print("# ring hops: {} of {} (the ring stops after the last hop that carries a block); sent: K/V bytes of "
             "batch x kv_heads x dim x {} per token\n", hops, ranks, dtype_name(p.dtype));
  fmt::print("# {:>4} {:>10} {:>6} {:>12} {:>10} {:>8} {:>11}  {}\n", "rank", "tokens", "calls", "GFLOP", "skipped",
             "share", "sent", "segments");
  uint64_t all_bytes = 0;
  for (int r = 0; r < ranks; ++r) {
    int skipped = 0;  // hops taken that only forward the block
    for (int h = 0; h < hops; ++h) skipped += !plan.computes(r, h);
    const PairCount pairs = plan.visible_pairs(r);
    const uint64_t sent = plan.ring_bytes(r);
    all_bytes += sent;
    fmt::print("  {:>4} {:>10} {:>6} {:>12} {:>10} {:>7.1f}% {:>11}  {}\n", r, plan.layout(r).tokens(),
               plan.kernel_calls(r), gflop_text(flop_per_pair * to_double(pairs) / 1e9), fmt::format("{} hops", skipped),
               share_percent(pairs, total), sent, segments_text(plan.layout(r)));
  }
  fmt::print("# sent in all: {} bytes ({})\n", all_bytes, human_bytes(double(all_bytes)));
}

void print_summary(const PlanOptions& o, const PairStats& st, double flop_per_pair) {
  fmt::print("# {} ranks: one row per rank is printed up to {} ranks; the ranks in summary:\n", o.ranks, kPlanRowRanks);
  if (st.min_tokens == st.max_tokens)
    fmt::print("  tokens per rank {}\n", st.min_tokens);
  else
    fmt::print("  tokens per rank {} to {} (uneven shards)\n", st.min_tokens, st.max_tokens);
  fmt::print("  GFLOP per rank: max {} (rank {}), min {} (rank {}), mean {}\n",
             gflop_text(flop_per_pair * to_double(st.max) / 1e9), st.max_rank,
             gflop_text(flop_per_pair * to_double(st.min) / 1e9), st.min_rank,
             gflop_text(flop_per_pair * to_double(st.sum) / 1e9 / o.ranks));
  fmt::print("  share per rank: max {:.4f}%, min {:.4f}%\n", share_percent(st.max, st.sum), share_percent(st.min, st.sum));
}

// The problem of `plan`'s flags, checked as the runner checks the window and the documents.
GlobalProblem plan_problem(const PlanOptions& o) {
  check_shardable(Sharding::Zigzag, o.seq, o.ranks);
  check_head_counts(o.heads, o.kv_heads);  // as run and bench (plan accepted --heads 3 --kv-heads 2)
  GlobalProblem p;
  p.batch = o.batch;
  p.q_heads = o.heads;
  p.kv_heads = o.kv_heads;
  p.q_len = p.kv_len = o.seq;
  p.head_dim = o.dim;
  p.dtype = parse_dtype(o.dtype);
  p.causal = o.causal;
  p.window = parse_window(o.window);
  p.doc_lens = parse_doc_lens(o.doc_lens);
  validate_window(p.window, p.causal);  // plan counts pairs in 128 bits
  check_documents(p);
  // The byte figures are 64-bit, as the runner's buffers are: the whole of q, k and v must fit.
  checked_product({p.batch, std::max(p.q_heads, p.kv_heads), o.seq, p.head_dim, 3, int64_t(dtype_size(p.dtype))},
                  "plan's bytes (batch x heads x seq x dim x 3 tensors x dtype bytes)");
  if ((!p.window.none() || !p.doc_lens.empty()) && o.ranks > kPlanRowRanks)
    fail_arg("plan {} builds every rank's schedule: up to {} ranks (got --ranks {})",
             p.doc_lens.empty() ? "--window" : "--doc-lens", kPlanRowRanks, o.ranks);
  return p;
}

// The plans of every sharding (kAutoOrder), when a window or documents leave no closed form for
// the pairs; none otherwise.
std::vector<RingPlan> scheduled_plans(const GlobalProblem& p, int ranks) {
  if (p.window.none() && p.doc_lens.empty()) return {};
  return candidate_plans(p, ranks);
}

// --shard auto: the runner's rule (best_of over the plans of every sharding, with their traffic
// under a window), or pick_balanced over the closed-form counts without a window or documents.
Sharding plan_sharding(const PlanOptions& o, const GlobalProblem& p, const std::vector<RingPlan>& plans) {
  if (o.shard != "auto") return parse_sharding(o.shard);
  if (!plans.empty()) return kAutoOrder[best_of(plans, !p.window.none())];
  double imb[kShardings];
  for (int i = 0; i < kShardings; ++i) imb[i] = imbalance(pair_stats(kAutoOrder[i], o.seq, o.causal, o.ranks), o.ranks);
  return pick_balanced(imb);
}

// The pairs of sharding `s`: from its plan when there are plans, else by the closed form.
PairStats stats_of(Sharding s, const PlanOptions& o, const std::vector<RingPlan>& plans) {
  if (plans.empty()) return pair_stats(s, o.seq, o.causal, o.ranks);
  return pair_stats(plans[size_t(std::find(kAutoOrder, kAutoOrder + kShardings, s) - kAutoOrder)]);
}

// The sharding of the ring across G groups: --shard, or the runner's auto rule over them.
Sharding group_sharding(const PlanOptions& o, const GlobalProblem& p, int G) {
  if (o.shard != "auto") return parse_sharding(o.shard);
  const std::vector<RingPlan> plans = candidate_plans(p, G);
  return kAutoOrder[best_of(plans, !p.window.none())];
}

// One row per rank of --cp's groups of U > 1 ranks: its group and place, its tokens and the bytes
// it sends inside the group (the all-to-alls) and across the groups (the ring), in the forward and
// in the backward (run --json's bytes_sent and backward_bytes_sent).
void print_cp_rows(const PlanOptions& o, GlobalProblem p, int U) {
  const int G = o.ranks / U;
  p.sharding = group_sharding(o, p, G);
  const std::vector<HybridBytes> f = hybrid_bytes(p, U, o.ranks, false), b = hybrid_bytes(p, U, o.ranks, true);
  fmt::print("# --cp {}: {} groups of {} ranks, {} sharding over the groups; bytes sent inside the group (all-to-all) "
             "and across the groups (ring), forward and backward\n", o.cp, G, U, sharding_name(p.sharding));
  fmt::print("# {:>4} {:>6} {:>6} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", "rank", "group", "place", "tokens",
             "fwd_group", "fwd_ring", "fwd_sent", "bwd_group", "bwd_ring", "bwd_sent");
  for (int r = 0; r < o.ranks; ++r) {
    const HybridBytes& x = f[size_t(r)];
    const HybridBytes& y = b[size_t(r)];
    fmt::print("  {:>4} {:>6} {:>6} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", r, r / U, r % U,
               hybrid_layout(p, U, r, o.ranks).tokens(), x.group, x.ring, x.total(), y.group, y.ring, y.total());
  }
}

// Every layout the heads allow (groups of U | ranks, U | heads and kv_heads): the largest rank's
// bytes inside its group and across the groups, forward and backward, the ring's hops and its
// balance (max / mean visible pairs per rank).
void print_cp_layouts(const PlanOptions& o, const GlobalProblem& p0) {
  fmt::print("# layouts (--cp): the largest bytes any rank sends, inside its group | across the groups\n");
  fmt::print("# {:<12} {:>8} {:>6} {:>14} {:>14} {:>14} {:>14} {:>8}\n", "cp", "groups", "hops", "fwd_group", "fwd_ring",
             "bwd_group", "bwd_ring", "balance");
  for (int U = 1; U <= o.ranks; ++U) {
    if (o.ranks % U != 0 || p0.q_heads % U != 0 || p0.kv_heads % U != 0) continue;
    const int G = o.ranks / U;
    GlobalProblem p = p0;
    p.sharding = group_sharding(o, p, G);
    const std::vector<HybridBytes> f = hybrid_bytes(p, U, o.ranks, false), b = hybrid_bytes(p, U, o.ranks, true);
    uint64_t m[4] = {0, 0, 0, 0};
    for (int r = 0; r < o.ranks; ++r) {
      m[0] = std::max(m[0], f[size_t(r)].group);
      m[1] = std::max(m[1], f[size_t(r)].ring);
      m[2] = std::max(m[2], b[size_t(r)].group);
      m[3] = std::max(m[3], b[size_t(r)].ring);
    }
    const RingPlan ring = ring_plan(p, G);
    const std::string name = U == 1 ? "ring" : U == o.ranks ? "ulysses" : fmt::format("hybrid:{}", U);
    fmt::print("  {:<12} {:>8} {:>6} {:>14} {:>14} {:>14} {:>14} {:>8.2f}\n", name, fmt::format("{}x{}", G, U),
               ring.hops(), m[0], m[1], m[2], m[3], imbalance(pair_stats(ring), G));
  }
}

}  // namespace

int plan_command(const PlanOptions& o) {
  GlobalProblem p = plan_problem(o);
  const Window w = p.window;
  const std::vector<RingPlan> plans = scheduled_plans(p, o.ranks);  // each sharding's, built once
  const Sharding sharding = p.sharding = plan_sharding(o, p, plans);
  const double flop_per_pair = 4.0 * double(o.batch) * double(o.heads) * double(o.dim);
  const int U = cp_group_size(o.cp, o.ranks);
  if (U > 1) {
    check_cp(o.cp, p, U, false, false);
    if (o.ranks > kPlanRowRanks)
      fail_arg("plan --cp {} prints one row per rank: up to {} ranks (got --ranks {})", o.cp, kPlanRowRanks, o.ranks);
  }
  fmt::print("# ringattn plan: seq {} over {} ranks, {} sharding{}, {}{}{}; batch {} heads {}/{} dim {}\n", o.seq,
             o.ranks, sharding_name(sharding), o.shard == "auto" ? " (auto: the best balanced)" : "",
             o.causal ? "causal" : "full", w.none() ? "" : fmt::format(", window {},{}", w.left, w.right),
             p.doc_lens.empty() ? "" : fmt::format(", {} packed documents", p.doc_lens.size()), o.batch, o.heads,
             o.kv_heads, o.dim);
  const PairStats mine = stats_of(sharding, o, plans);
  if (o.ranks <= kPlanRowRanks) {
    const size_t i = size_t(std::find(kAutoOrder, kAutoOrder + kShardings, sharding) - kAutoOrder);
    print_rank_rows(p, plans.empty() ? ring_plan(p, o.ranks) : plans[i], mine.sum, flop_per_pair);
  } else {
    print_summary(o, mine, flop_per_pair);
  }
  fmt::print("# balance (max / mean visible pairs per rank; 1.00 is perfect):");
  for (Sharding s : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped, Sharding::DocZigzag}) {
    if (s == Sharding::DocZigzag && p.doc_lens.empty()) continue;  // zigzag without documents
    fmt::print(" {} {:.2f}", sharding_name(s), imbalance(s == sharding ? mine : stats_of(s, o, plans), o.ranks));
  }
  fmt::print("\n");
  if (U > 1) print_cp_rows(o, p, U);
  if (o.ranks <= kPlanRowRanks) print_cp_layouts(o, p);
  return kExitOk;
}

}  // namespace ringattn::cli
