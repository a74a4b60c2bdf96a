#include "ringattn/schedule.hpp"

#include "core/mask.hpp"
#include "core/error.hpp"

namespace ringattn {
namespace {

int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

}  // namespace

PairClass classify_pair(const Segment& q, const Segment& k, bool causal) {
  PairClass c;
  if (q.len <= 0 || k.len <= 0) return c;
  if (!causal) {
    c.visibility = PairVisibility::Full;
    c.visible_pairs = PairCount(q.len) * k.len;
    return c;
  }
  // A run of one element has no meaningful stride; take the other's.
  const int64_t S = q.len == 1 ? k.stride : q.stride;
  if (S < 1 || (k.len > 1 && k.stride != S))
    fail_arg("cannot express query run (start {}, stride {}) against key run (start {}, stride {}) as one kernel "
             "call: the strides must be equal and >= 1", q.start, q.stride, k.start, k.stride);
  const int64_t off = floor_div(checked_sub(q.start, k.start, "query position - key position"), S);
  const MaskSpec mask{true, off};
  c.q_offset = off;
  c.visible_pairs = count_visible<PairCount>(mask, 0, q.len, k.len);
  switch (classify_block(clamp_offset(mask, q.len, k.len), 0, q.len, 0, k.len)) {
    case BlockVisibility::Full: c.visibility = PairVisibility::Full; break;  // no mask cost
    case BlockVisibility::Partial: c.visibility = PairVisibility::Diagonal; break;
    case BlockVisibility::Empty: c.visibility = PairVisibility::Invisible; break;
  }
  return c;
}

RingSchedule::RingSchedule(Sharding sharding, int64_t seq_len, bool causal, int rank, int world)
    : local_(shard_layout(sharding, seq_len, rank, world)) {
  hops_.resize(size_t(world));
  for (int s = 0; s < world; ++s) {
    HopPlan& hop = hops_[size_t(s)];
    hop.source_rank = ((rank - s) % world + world) % world;
    const ShardLayout remote = shard_layout(sharding, seq_len, hop.source_rank, world);
    for (size_t a = 0; a < local_.segments.size(); ++a) {
      for (size_t b = 0; b < remote.segments.size(); ++b) {
        const Segment &qs = local_.segments[a], &ks = remote.segments[b];
        const PairClass c = classify_pair(qs, ks, causal);
        if (c.visibility == PairVisibility::Invisible) continue;
        PairCall call;
        call.q_row0 = local_.first_row(a);
        call.q_rows = qs.len;
        call.k_row0 = remote.first_row(b);
        call.k_rows = ks.len;
        call.causal = c.visibility == PairVisibility::Diagonal;
        call.q_offset = call.causal ? c.q_offset : 0;
        call.visible_pairs = c.visible_pairs;
        hop.calls.push_back(call);
        hop.visible_pairs += c.visible_pairs;
      }
    }
  }
}

PairCount RingSchedule::visible_pairs() const {
  PairCount n = 0;
  for (const HopPlan& h : hops_) n += h.visible_pairs;
  return n;
}

int RingSchedule::kernel_calls() const {
  int n = 0;
  for (const HopPlan& h : hops_) n += int(h.calls.size());
  return n;
}

}  // namespace ringattn
