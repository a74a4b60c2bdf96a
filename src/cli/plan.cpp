// `ringattn plan`: the ring schedule of a problem without running it (no MPI, no data): each
// rank's tokens and segments, its kernel calls and visible query-key pairs over all hops, and
// the load balance of every sharding, so a sharding can be chosen before a long run.
#include <algorithm>

#include <fmt/format.h>

#include "cli/run.hpp"
#include "ringattn/error.hpp"
#include "ringattn/ring.hpp"
#include "ringattn/schedule.hpp"

namespace ringattn::cli {
namespace {

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

// max / mean of the ranks' visible pairs: 1.0 is perfect balance; the slowest rank sets the pace.
double imbalance(Sharding s, int64_t n, bool causal, int world) {
  int64_t mx = 0, sum = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t v = RingSchedule(s, n, causal, r, world).visible_pairs();
    mx = std::max(mx, v);
    sum += v;
  }
  return sum > 0 ? double(mx) * world / double(sum) : 1.0;
}

}  // namespace

int plan_command(const PlanOptions& o) {
  const Sharding sharding = parse_sharding(o.shard);
  check_shardable(sharding, o.seq, o.ranks);
  const double per_bh = double(o.batch) * double(o.heads);
  fmt::print("# ringattn plan: seq {} over {} ranks, {} sharding, {}; batch {} heads {} dim {}\n", o.seq, o.ranks,
             sharding_name(sharding), o.causal ? "causal" : "full", o.batch, o.heads, o.dim);
  fmt::print("# {:>4} {:>10} {:>6} {:>12} {:>10} {:>8}  {}\n", "rank", "tokens", "calls", "GFLOP", "skipped", "share",
             "segments");
  int64_t total = 0;
  std::vector<RingSchedule> scheds;
  for (int r = 0; r < o.ranks; ++r) {
    scheds.emplace_back(sharding, o.seq, o.causal, r, o.ranks);
    total += scheds.back().visible_pairs();
  }
  for (int r = 0; r < o.ranks; ++r) {
    const RingSchedule& s = scheds[size_t(r)];
    int skipped = 0;  // hops that only forward the block
    for (const HopPlan& h : s.hops()) skipped += h.calls.empty();
    fmt::print("  {:>4} {:>10} {:>6} {:>12.3f} {:>10} {:>7.1f}%  {}\n", r, s.local_layout().tokens(), s.kernel_calls(),
               4.0 * per_bh * double(o.dim) * double(s.visible_pairs()) / 1e9, fmt::format("{} hops", skipped),
               total > 0 ? 100.0 * double(s.visible_pairs()) / double(total) : 0.0, segments_text(s.local_layout()));
  }
  fmt::print("# balance (max / mean visible pairs per rank; 1.00 is perfect):");
  for (Sharding s : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped}) {
    if (o.seq % required_multiple(s, o.ranks) != 0) {
      fmt::print(" {} n/a", sharding_name(s));
      continue;
    }
    fmt::print(" {} {:.2f}", sharding_name(s), imbalance(s, o.seq, o.causal, o.ranks));
  }
  fmt::print("\n");
  return kExitOk;
}

}  // namespace ringattn::cli
