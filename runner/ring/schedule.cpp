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
// unseen; a block then travels with only those keys, ring_routes). The mask moves with the first
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

RingSchedule::RingSchedule(Sharding sharding, int64_t seq_len, bool causal, int rank, int world, Documents docs,
                           Window window)
    : local_(shard_layout(sharding, seq_len, rank, world, docs)) {
  if (!docs.none() && docs.cu[docs.count] != seq_len)
    fail_arg("the documents cover {} tokens but the sequence has {}", docs.cu[docs.count], seq_len);
  hops_.resize(size_t(world));
  for (int s = 0; s < world; ++s) {
    HopPlan& hop = hops_[size_t(s)];
    hop.source_rank = ((rank - s) % world + world) % world;
    add_calls(hop, local_, shard_layout(sharding, seq_len, hop.source_rank, world, docs), causal, docs, window);
  }
}

std::vector<char> block_routes(Sharding sharding, int64_t seq_len, bool causal, int world, Documents docs,
                               Window window) {
  return ring_routes(sharding, seq_len, causal, world, docs, window).carried;
}

std::vector<int64_t> RingRoutes::shipped_tokens() const {
  std::vector<int64_t> n;
  for (const KeyRange& r : shipped) n.push_back(r.size());
  return n;
}

RingRoutes ring_routes(Sharding sharding, int64_t seq_len, bool causal, int world, Documents docs, Window window) {
  const size_t P = size_t(world);
  std::vector<char> need(P * P, 0), carried(P * P, 0);
  RingRoutes routes;
  routes.shipped.assign(P, KeyRange{});
  for (int x = 0; x < world; ++x) {
    const RingSchedule s(sharding, seq_len, causal, x, world, docs, window);
    for (size_t h = 0; h < P; ++h) {
      const HopPlan& hop = s.hops()[h];
      need[size_t(hop.source_rank) * P + h] = !hop.calls.empty();
      KeyRange& ship = routes.shipped[size_t(hop.source_rank)];
      for (const PairCall& c : hop.calls) {
        if (h == 0) continue;  // hop 0 reads the rank's own tensors in place
        ship = ship.empty() ? KeyRange{c.k_row0, c.k_row0 + c.k_rows}
                            : KeyRange{std::min(ship.begin, c.k_row0), std::max(ship.end, c.k_row0 + c.k_rows)};
      }
    }
  }
  for (size_t q = 0; q < P; ++q) {
    bool later = false;  // some hop after h needs the block
    for (size_t h = P; h-- > 0;) {
      carried[q * P + h] = later && h + 1 < P;
      later = later || need[q * P + h];
    }
  }
  routes.carried = std::move(carried);
  routes.first_remote_hop.assign(P, world);
  for (size_t q = 0; q < P; ++q)
    for (size_t h = P; h-- > 1;)
      if (need[q * P + h]) routes.first_remote_hop[q] = int(h);
  return routes;
}

int ring_hops(const std::vector<char>& carried, int world) {
  int hops = 1;
  for (size_t i = 0; i < carried.size(); ++i)
    if (carried[i]) hops = std::max(hops, int(i % size_t(world)) + 2);
  return std::min(hops, world);
}

double sharding_imbalance(Sharding sharding, int64_t seq_len, bool causal, int world, Documents docs, Window window) {
  PairCount max = 0, sum = 0;
  for (int r = 0; r < world; ++r) {
    const PairCount v = RingSchedule(sharding, seq_len, causal, r, world, docs, window).visible_pairs();
    max = v > max ? v : max;
    sum += v;
  }
  return sum > 0 ? to_double(max) * world / to_double(sum) : 1.0;
}

Sharding pick_balanced(const double (&imbalance)[kShardings], const double (*traffic)[kShardings]) {
  int best = 0;
  for (int i = 1; i < kShardings; ++i)
    if (imbalance[i] < imbalance[best] - 1e-12) best = i;
  if (traffic == nullptr) return kAutoOrder[best];
  int pick = -1;
  for (int i = 0; i < kShardings; ++i)
    if (imbalance[i] <= imbalance[best] * kTrafficTolerance + 1e-12 && (pick < 0 || (*traffic)[i] < (*traffic)[pick]))
      pick = i;
  return kAutoOrder[pick];
}

Sharding best_sharding(int64_t seq_len, bool causal, int world, Documents docs, Window window) {
  double imb[kShardings], traffic[kShardings];
  for (int i = 0; i < kShardings; ++i) {
    imb[i] = sharding_imbalance(kAutoOrder[i], seq_len, causal, world, docs, window);
    if (window.none()) continue;
    const RingRoutes routes = ring_routes(kAutoOrder[i], seq_len, causal, world, docs, window);
    const std::vector<int64_t> tokens = routes.shipped_tokens();
    traffic[i] = 0;
    for (int r = 0; r < world; ++r) traffic[i] += double(ring_bytes_sent(routes.carried, tokens, 1, r, world));
  }
  return window.none() ? pick_balanced(imb) : pick_balanced(imb, &traffic);
}

uint64_t ring_bytes_sent(const std::vector<char>& carried, const std::vector<int64_t>& tokens, uint64_t token_bytes,
                         int rank, int world) {
  uint64_t bytes = 0;
  for (int s = 0; s + 1 < world; ++s) {
    const int q = ((rank - s) % world + world) % world;
    if (carried[size_t(q) * size_t(world) + size_t(s)]) bytes += token_bytes * uint64_t(tokens[size_t(q)]);
  }
  return bytes;
}

bool grad_exchange_carries(const RingRoutes& routes, int source, int exchange) {
  return routes.first_remote_hop[size_t(source)] <= exchange - 1;
}

bool grad_exchange_runs(const RingRoutes& routes, int exchange, int world) {
  for (int q = 0; q < world; ++q)
    if (grad_exchange_carries(routes, q, exchange)) return true;
  return false;
}

uint64_t grad_bytes_sent(const RingRoutes& routes, uint64_t token_bytes, int rank, int world) {
  uint64_t bytes = 0;
  for (int s = 1; s <= world; ++s) {
    const int q = ((rank - s + 1) % world + world) % world;
    if (grad_exchange_carries(routes, q, s)) bytes += token_bytes * uint64_t(routes.shipped[size_t(q)].size());
  }
  return bytes;
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
