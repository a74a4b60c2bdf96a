#include "runner/ring/schedule.hpp"

#include <algorithm>
#include <utility>

#include "core/mask.hpp"
#include "core/error.hpp"

namespace ringattn {
PairClass classify_pair(const Segment& q, const Segment& k, bool causal, Window w) {
  PairClass c;
  if (q.len <= 0 || k.len <= 0) return c;
  if (!causal && w.none()) {
    c.visibility = PairVisibility::Full;
    c.visible_pairs = PairCount(q.len) * k.len;
    return c;
  }
  // A run of one element has no meaningful stride; take the other's.
  const int64_t S = q.len == 1 ? k.stride : q.stride;
  if (S < 1 || (k.len > 1 && k.stride != S))
    fail_arg("cannot express query run (start {}, stride {}) against key run (start {}, stride {}) as one kernel "
             "call: the strides must be equal and >= 1", q.start, q.stride, k.start, k.stride);
  bool crossed = false;
  const MaskSpec mask =
      band_mask(causal, w, checked_sub(q.start, k.start, "query position - key position"), S, &crossed);
  if (crossed) return c;  // the window's edges fall between two of the stride's positions
  c.visible_pairs = count_visible<PairCount>(mask, 0, q.len, k.len);
  switch (classify_block(clamp_offset(mask, q.len, k.len), 0, q.len, 0, k.len)) {
    case BlockVisibility::Full: c.visibility = PairVisibility::Full; break;  // no mask cost
    case BlockVisibility::Partial:
      c.visibility = PairVisibility::Diagonal;
      c.mask = mask;
      break;
    case BlockVisibility::Empty: c.visibility = PairVisibility::Invisible; break;
  }
  return c;
}

namespace {

// Indices [i0, i1) of the run g whose positions lie in [lo, hi).
std::pair<int64_t, int64_t> run_within(const Segment& g, int64_t lo, int64_t hi) {
  auto first_at_or_after = [&](int64_t x) {  // the first index i with position(i) >= x, in [0, len]
    if (x <= g.start) return int64_t(0);
    const int64_t i = (x - g.start + g.stride - 1) / g.stride;
    return i < g.len ? i : g.len;
  };
  return {first_at_or_after(lo), first_at_or_after(hi)};
}

// The sub-runs of `g` inside each document it touches: (document, first index, count).
struct DocPiece {
  int64_t doc, i0, n;
};
std::vector<DocPiece> split_by_document(const Segment& g, const Documents& docs) {
  if (docs.none()) return {{0, 0, g.len}};
  std::vector<DocPiece> out;
  const int64_t last = g.position(g.len - 1);
  for (int64_t d = document_of(docs, g.start); d < docs.count && docs.cu[d] <= last; ++d) {
    const auto [i0, i1] = run_within(g, docs.cu[d], docs.cu[d + 1]);
    if (i1 > i0) out.push_back({d, i0, i1 - i0});
  }
  return out;
}

// Cuts a masked call's keys to those some row sees (a window leaves most of a long key segment
// unseen; a block then travels with only those keys, RingRoutes::shipped). The mask moves with the first
// key; a call that becomes fully visible drops its mask.
void trim_keys(PairCall& call, int64_t q_rows) {
  const KeyRange seen = visible_range_of_rows(clamp_offset(call.mask, q_rows, call.k_rows), 0, q_rows, call.k_rows);
  if (seen.begin == 0 && seen.end == call.k_rows) return;
  call.k_row0 += seen.begin;
  call.k_rows = seen.size();
  call.mask.q_offset -= seen.begin;
  if (classify_block(clamp_offset(call.mask, q_rows, call.k_rows), 0, q_rows, 0, call.k_rows) == BlockVisibility::Full)
    call.mask = MaskSpec{};
}

// Adds to `hop` the calls of the local layout's queries against the block of `remote`: one per
// (query segment, key segment) pair with something visible, split at document boundaries.
void add_calls(HopPlan& hop, const ShardLayout& local, const ShardLayout& remote, bool causal, const Documents& docs,
               Window w) {
  std::vector<std::vector<DocPiece>> k_pieces;
  for (const Segment& g : remote.segments) k_pieces.push_back(split_by_document(g, docs));
  for (size_t a = 0; a < local.segments.size(); ++a)
    for (const DocPiece& qp : split_by_document(local.segments[a], docs))
      for (size_t b = 0; b < remote.segments.size(); ++b) {
        // Documents never see each other: only the key piece of the query piece's document.
        const std::vector<DocPiece>& kps = k_pieces[b];
        const auto kp = std::lower_bound(kps.begin(), kps.end(), qp.doc,
                                         [](const DocPiece& x, int64_t d) { return x.doc < d; });
        if (kp == kps.end() || kp->doc != qp.doc) continue;
        const Segment &qa = local.segments[a], &kb = remote.segments[b];
        const Segment qs{qa.position(qp.i0), qp.n, qa.stride}, ks{kb.position(kp->i0), kp->n, kb.stride};
        const PairClass c = classify_pair(qs, ks, causal, w);
        if (c.visibility == PairVisibility::Invisible) continue;
        PairCall call;
        call.q_row0 = local.first_row(a) + qp.i0;
        call.q_rows = qs.len;
        call.k_row0 = remote.first_row(b) + kp->i0;
        call.k_rows = ks.len;
        call.mask = c.mask;
        if (c.visibility == PairVisibility::Diagonal) trim_keys(call, qs.len);
        call.visible_pairs = c.visible_pairs;
        hop.calls.push_back(call);
        hop.visible_pairs += c.visible_pairs;
      }
}

}  // namespace

RingSchedule::RingSchedule(std::span<const ShardLayout> layouts, int rank, bool causal, Documents docs, Window window) {
  const int world = int(layouts.size());
  if (rank < 0 || rank >= world) fail_arg("rank {} is outside the world of {} ranks", rank, world);
  local_ = layouts[size_t(rank)];
  hops_.resize(size_t(world));
  for (int s = 0; s < world; ++s) {
    HopPlan& hop = hops_[size_t(s)];
    hop.source_rank = ((rank - s) % world + world) % world;
    add_calls(hop, local_, layouts[size_t(hop.source_rank)], causal, docs, window);
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
