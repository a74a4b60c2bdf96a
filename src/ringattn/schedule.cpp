#include "ringattn/schedule.hpp"

#include <algorithm>

#include "ringattn/error.hpp"

namespace ringattn {
namespace {

int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

}  // namespace

PairCount sum_clamped(int64_t rows, int64_t a, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  // Rows below `lo` see nothing, rows from `hi` on see all cols, rows between see i + a. In 128
  // bits: -a and cols - a overflow int64 for extreme a, and the products reach rows x cols.
  const PairCount A = a, R = rows, C = cols;
  const PairCount lo = std::clamp<PairCount>(-A, 0, R);
  const PairCount hi = std::clamp<PairCount>(C - A, lo, R);
  const PairCount n = hi - lo;
  return n * A + (lo + hi - 1) * n / 2 + (R - hi) * C;
}

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
  c.q_offset = off;
  c.visible_pairs = sum_clamped(q.len, checked_add(off, 1, "causal offset + 1"), k.len);
  if (k.len - 1 <= off) {
    c.visibility = PairVisibility::Full;  // the first query already sees the last key
  } else if (off < -(q.len - 1)) {
    c.visibility = PairVisibility::Invisible;  // the last query sees no key
    c.visible_pairs = 0;
  } else {
    c.visibility = PairVisibility::Diagonal;
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
