#include "runner/ring/ring_plan.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/types.hpp"

namespace ringattn {
namespace {

// FNV-1a over every rank's segments (rank, start, length, stride).
uint64_t hash_layouts(const std::vector<ShardLayout>& layouts) {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](int64_t x) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((uint64_t(x) >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  for (size_t r = 0; r < layouts.size(); ++r) {
    mix(int64_t(r));
    for (const Segment& g : layouts[r].segments) mix(g.start), mix(g.len), mix(g.stride);
  }
  return h;
}

// Checks what the plan reads of `p`: self-attention, and documents that cover the sequence.
void check_plan_problem(const GlobalProblem& p) {
  if (!p.is_ring())
    fail_arg("a ring plan needs self-attention (q_len == kv_len, q_offset 0); got q_len={}, kv_len={}, q_offset={}",
             p.q_len, p.kv_len, p.resolved_q_offset());
  const std::vector<int64_t> bounds = p.doc_bounds();
  if (bounds.size() >= 2 && bounds.back() != p.q_len)
    fail_arg("the documents cover {} tokens but the sequence has {}", bounds.back(), p.q_len);
}

}  // namespace

RingPlan::RingPlan(const GlobalProblem& p, std::span<const ShardLayout> layouts, int keep)
    : problem_(p), bounds_(p.doc_bounds()), layouts_(layouts.begin(), layouts.end()), keep_(keep) {
  check_plan_problem(p);
  check_layouts(layouts, p.q_len);
  const int P = world();
  if (keep < -1 || keep >= P) fail_arg("rank {} is outside the world of {} ranks", keep, P);
  const size_t PP = size_t(P) * size_t(P);
  pairs_.assign(size_t(P), 0);
  calls_.assign(size_t(P), 0);
  computes_.assign(PP, 0);
  routes_.shipped.assign(size_t(P), KeyRange{});
  for (int x = 0; x < P; ++x) {
    RingSchedule s(layouts_, x, p.causal, documents_of(bounds_), p.window);
    add_schedule(x, s);
    if (x == keep) schedule_.emplace(std::move(s));
  }
  finish_routes();
  kv_token_bytes_ = 2ull * uint64_t(p.batch * p.kv_heads * p.head_dim) * uint64_t(dtype_size(p.dtype));
  grad_token_bytes_ = 2ull * uint64_t(p.batch * p.kv_heads * p.head_dim) * sizeof(float);
  layouts_hash_ = hash_layouts(layouts_);
}

void RingPlan::add_schedule(int x, const RingSchedule& s) {
  const size_t P = size_t(world());
  pairs_[size_t(x)] = s.visible_pairs();
  calls_[size_t(x)] = s.kernel_calls();
  for (size_t h = 0; h < P; ++h) {
    const HopPlan& hop = s.hops()[h];
    computes_[size_t(x) * P + h] = !hop.calls.empty();
    if (h == 0) continue;  // hop 0 reads the rank's own tensors in place
    KeyRange& ship = routes_.shipped[size_t(hop.source_rank)];
    for (const PairCall& c : hop.calls)
      ship = ship.empty() ? KeyRange{c.k_row0, c.k_row0 + c.k_rows}
                          : KeyRange{std::min(ship.begin, c.k_row0), std::max(ship.end, c.k_row0 + c.k_rows)};
  }
}

// From the hops that compute: which exchanges carry each block, where its accumulator starts,
// the hops the ring takes, the largest block and the dK/dV exchanges that run.
void RingPlan::finish_routes() {
  const int P = world();
  const auto needs = [&](int q, int h) { return computes((q + h) % P, h); };  // q's block at hop h
  routes_.carried.assign(size_t(P) * size_t(P), 0);
  routes_.first_remote_hop.assign(size_t(P), P);
  for (int q = 0; q < P; ++q) {
    bool later = false;  // some hop after h needs the block
    for (int h = P; h-- > 0;) {
      routes_.carried[size_t(q) * size_t(P) + size_t(h)] = later && h + 1 < P;
      later = later || needs(q, h);
      if (h >= 1 && needs(q, h)) routes_.first_remote_hop[size_t(q)] = h;
    }
  }
  hops_ = 1;
  for (size_t i = 0; i < routes_.carried.size(); ++i)
    if (routes_.carried[i]) hops_ = std::max(hops_, int(i % size_t(P)) + 2);
  hops_ = std::min(hops_, P);
  block_tokens_ = 1;
  for (const KeyRange& r : routes_.shipped) block_tokens_ = std::max(block_tokens_, r.size());
  grad_runs_.assign(size_t(P) + 1, 0);
  for (int s = 1; s <= P; ++s)
    for (int q = 0; q < P; ++q) grad_runs_[size_t(s)] = grad_runs_[size_t(s)] || grad_carries(q, s);
}

const RingSchedule& RingPlan::schedule() const {
  if (!schedule_) fail_arg("this ring plan keeps no rank's calls (it was made with rank -1): make it for the rank that runs");
  return *schedule_;
}

double RingPlan::imbalance() const {
  PairCount max = 0, sum = 0;
  for (const PairCount v : pairs_) {
    max = v > max ? v : max;
    sum += v;
  }
  return sum > 0 ? to_double(max) * world() / to_double(sum) : 1.0;
}

bool RingPlan::sends_block(int rank, int hop) const {
  const int src = source(rank, hop, world());
  return hop + 1 < hops_ && carries(src, hop) && !routes_.shipped[size_t(src)].empty();
}

int64_t RingPlan::kv_tokens_sent(int rank) const {
  int64_t tokens = 0;
  for (int s = 0; s + 1 < world(); ++s) {
    const int q = source(rank, s, world());
    if (carries(q, s)) tokens += routes_.shipped[size_t(q)].size();
  }
  return tokens;
}

bool RingPlan::grad_sends(int rank, int s) const { return grad_travels(source(rank, s - 1, world()), s); }

bool RingPlan::grad_receives(int rank, int s) const { return grad_travels(source(rank, s, world()), s); }

uint64_t RingPlan::grad_bytes(int rank) const {
  uint64_t bytes = 0;
  for (int s = 1; s <= world(); ++s) {
    const int q = source(rank, s - 1, world());
    if (grad_carries(q, s)) bytes += grad_token_bytes_ * uint64_t(routes_.shipped[size_t(q)].size());
  }
  return bytes;
}

void RingPlan::check_fits(const GlobalProblem& p, int world_size, int rank) const {
  if (world_size != world() || rank != keep_)
    fail_arg("the ring plan was made for {} ranks keeping the calls of rank {}, but this is rank {} of {}", world(),
             keep_, rank, world_size);
  const GlobalProblem& m = problem_;
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"q_len", {m.q_len, p.q_len}},       {"kv_len", {m.kv_len, p.kv_len}},
      {"q_offset", {m.resolved_q_offset(), p.resolved_q_offset()}},
      {"causal", {m.causal, p.causal}},    {"window left", {m.window.left, p.window.left}},
      {"window right", {m.window.right, p.window.right}},
      {"batch", {m.batch, p.batch}},       {"kv_heads", {m.kv_heads, p.kv_heads}},
      {"head_dim", {m.head_dim, p.head_dim}}, {"dtype size", {dtype_size(m.dtype), dtype_size(p.dtype)}},
      {"documents", {int64_t(m.doc_lens.size()), int64_t(p.doc_lens.size())}}};
  for (const auto& [name, v] : fields)
    if (v.first != v.second)
      fail_arg("the ring plan was made for {} {}, but the problem has {}: make the plan for the problem it runs", name,
               v.first, v.second);
  if (m.doc_lens != p.doc_lens)
    fail_arg("the ring plan was made for other document lengths than the problem's: make the plan for the problem it "
             "runs");
}

RingPlan ring_plan(const GlobalProblem& p, int world, int keep) {
  const std::vector<int64_t> bounds = p.doc_bounds();
  return RingPlan(p, shard_layouts(p.sharding, p.q_len, world, documents_of(bounds)), keep);
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

std::vector<RingPlan> candidate_plans(const GlobalProblem& p, int world, int keep) {
  std::vector<RingPlan> plans;
  plans.reserve(kShardings);
  for (const Sharding s : kAutoOrder) {
    GlobalProblem q = p;
    q.sharding = s;
    plans.push_back(ring_plan(q, world, keep));
  }
  return plans;
}

int best_of(std::span<const RingPlan> candidates, bool windowed) {
  if (candidates.size() != size_t(kShardings))
    fail_arg("--shard auto picks among {} plans, one per sharding (got {})", kShardings, candidates.size());
  double imb[kShardings], traffic[kShardings];
  for (int i = 0; i < kShardings; ++i) {
    const RingPlan& c = candidates[size_t(i)];
    imb[i] = c.imbalance();
    traffic[i] = 0;
    for (int r = 0; windowed && r < c.world(); ++r) traffic[i] += double(c.kv_tokens_sent(r));
  }
  const Sharding pick = windowed ? pick_balanced(imb, &traffic) : pick_balanced(imb);
  return int(std::find(kAutoOrder, kAutoOrder + kShardings, pick) - kAutoOrder);
}

Sharding best_sharding(const GlobalProblem& p, int world) {
  return kAutoOrder[best_of(candidate_plans(p, world), !p.window.none())];
}

}  // namespace ringattn
