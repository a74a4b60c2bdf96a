#include "runner/faults/fault.hpp"


#include <fmt/format.h>

#include "core/error.hpp"
#include "core/settings.hpp"
#include "runner/ring/grad_ring.hpp"
#include "runner/ring/schedule.hpp"

namespace ringattn {
namespace {

// "0..2, 4" for {0, 1, 2, 4}; "no hop" when empty.
std::string hop_list(const std::vector<int>& hops) {
  if (hops.empty()) return "no hop";
  std::string s = hops.size() == 1 ? "hop " : "hops ";
  for (size_t i = 0; i < hops.size();) {
    size_t j = i;
    while (j + 1 < hops.size() && hops[j + 1] == hops[j] + 1) ++j;
    if (i > 0) s += ", ";
    s += j == i ? fmt::format("{}", hops[i]) : fmt::format("{}..{}", hops[i], hops[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace

const char* fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::None: return "none";
    case FaultKind::Exit: return "exit";
    case FaultKind::Hang: return "hang";
    case FaultKind::Corrupt: return "corrupt";
    case FaultKind::Error: return "error";
    case FaultKind::Throw: return "throw";
  }
  return "?";
}

const char* fault_phase_name(FaultPhase ph) {
  switch (ph) {
    case FaultPhase::Forward: return "forward";
    case FaultPhase::Backward: return "backward";
    case FaultPhase::Grads: return "grads";
  }
  return "?";
}

std::string FaultPlan::text() const {
  return fmt::format("RINGATTN_FAULT={}:{}:{}{}{}", rank, hop, fault_kind_name(kind),
                     phase == FaultPhase::Forward ? "" : ":", phase == FaultPhase::Forward ? "" : fault_phase_name(phase));
}

FaultPlan parse_fault_plan(const std::string& text) {
  FaultPlan plan;
  if (text.empty()) return plan;
  const auto bad = [&]() {
    fail_arg("RINGATTN_FAULT='{}' is not RANK:HOP:KIND[:PHASE] with RANK, HOP >= 0, KIND one of exit, hang, "
             "corrupt, error, throw and PHASE one of forward (the default), backward, grads", text);
  };
  const size_t a = text.find(':'), b = a == std::string::npos ? a : text.find(':', a + 1);
  if (b == std::string::npos) bad();
  const auto to_int = [&](const std::string& s) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) bad();
    return std::stoi(s);
  };
  plan.rank = to_int(text.substr(0, a));
  plan.hop = to_int(text.substr(a + 1, b - a - 1));
  const size_t c = text.find(':', b + 1);
  const std::string kind = text.substr(b + 1, c == std::string::npos ? std::string::npos : c - b - 1);
  if (kind == "exit") plan.kind = FaultKind::Exit;
  else if (kind == "hang") plan.kind = FaultKind::Hang;
  else if (kind == "corrupt") plan.kind = FaultKind::Corrupt;
  else if (kind == "error") plan.kind = FaultKind::Error;
  else if (kind == "throw") plan.kind = FaultKind::Throw;
  else bad();
  if (c != std::string::npos) {
    const std::string phase = text.substr(c + 1);
    if (phase == "forward") plan.phase = FaultPhase::Forward;
    else if (phase == "backward") plan.phase = FaultPhase::Backward;
    else if (phase == "grads") plan.phase = FaultPhase::Grads;
    else
      fail_arg("RINGATTN_FAULT='{}' is not RANK:HOP:KIND[:PHASE]: unknown phase '{}' (allowed: forward, the default, "
               "backward, the ring backward's K/V ring, and grads, its dK/dV ring)", text, phase);
  }
  return plan;
}

namespace {

// The dK/dV ring's hops of rank `rank` (FaultHops' grads meanings; grad_ring.hpp's routes).
FaultHops grad_fault_hops(const RingRoutes& routes, const RingSchedule& sched, int rank, int world) {
  FaultHops h;
  h.ring_hops = ring_hops(routes.carried, world);
  for (int s = 1; s <= world && world > 1; ++s) {
    if (!grad_exchange_runs(routes, s, world)) continue;
    h.posts.push_back(s);
    if (grad_sends(routes, rank, world, s)) h.sends.push_back(s);
    // Hop s < P folds what it received into the accumulator it computed; exchange P brings
    // this rank's own accumulator home, into dk and dv.
    const bool folds = s == world || !sched.hops()[size_t(s)].calls.empty();
    if (folds && grad_receives(routes, rank, world, s)) h.computes.push_back(s);
  }
  return h;
}

}  // namespace

FaultHops fault_hops(const GlobalProblem& p, int rank, int world, FaultPhase phase) {
  const std::vector<int64_t> bounds = p.doc_bounds();
  const RingRoutes routes = ring_routes(p.sharding, p.q_len, p.causal, world, documents_of(bounds), p.window);
  const RingSchedule sched(p.sharding, p.q_len, p.causal, rank, world, documents_of(bounds), p.window);
  if (phase == FaultPhase::Grads) return grad_fault_hops(routes, sched, rank, world);
  FaultHops h;
  h.ring_hops = ring_hops(routes.carried, world);
  for (int s = 0; s + 1 < h.ring_hops; ++s) {
    h.posts.push_back(s);
    const int src = ((rank - s) % world + world) % world;  // the block this hop holds and passes on
    if (routes.carried[size_t(src) * size_t(world) + size_t(s)] && !routes.shipped[size_t(src)].empty())
      h.sends.push_back(s);
  }
  for (int s = 0; s < h.ring_hops; ++s)
    if (!sched.hops()[size_t(s)].calls.empty()) h.computes.push_back(s);
  return h;
}

void check_fault_plan(const FaultPlan& plan, const GlobalProblem& p, int world, bool backward) {
  if (!plan.active()) return;
  const std::string value = plan.text();
  const char* phase = fault_phase_name(plan.phase);
  if (plan.rank >= world)
    fail_arg("{} names rank {}, but the world has {} rank{} (0..{})", value, plan.rank, world, world == 1 ? "" : "s",
             world - 1);
  if (plan.phase != FaultPhase::Forward && !backward)
    fail_arg("{} names the {} ring, but this run has none (the phase {} needs --backward)", value, phase, phase);
  if (p.q_len != p.kv_len)
    fail_arg("{} applies to ring runs; this is a distributed decode (q_len {} != kv_len {})", value, p.q_len,
             p.kv_len);
  if (!p.is_ring())
    fail_arg("{} applies to ring runs; this is a distributed decode (q_offset {} != 0)", value, p.resolved_q_offset());
  const bool grads = plan.phase == FaultPhase::Grads;
  const FaultHops h = fault_hops(p, plan.rank, world, plan.phase);
  const std::vector<int>* at = &h.posts;
  const char* does = grads ? "posts no dK/dV exchange" : "posts no exchange";
  if (plan.kind == FaultKind::Corrupt) {
    at = &h.sends;
    does = grads ? "sends no accumulator" : "sends no block";
  } else if (plan.kind == FaultKind::Throw) {
    at = &h.computes;
    does = grads ? "folds in no received accumulator" : "computes on no block";
  }
  for (int s : *at)
    if (s == plan.hop) return;
  const std::string ring =
      grads ? fmt::format("the dK/dV accumulators of this problem travel at {} over {} rank{}", hop_list(h.posts),
                          world, world == 1 ? "" : "s")
            : fmt::format("this problem's ring takes {} hop{} over {} rank{}", h.ring_hops, h.ring_hops == 1 ? "" : "s",
                          world, world == 1 ? "" : "s");
  fail_arg("{} can never fire: rank {} {} at hop {} of the {} ring ({}); on rank {}, {} can fire at {}", value,
           plan.rank, does, plan.hop, phase, ring, plan.rank, fault_kind_name(plan.kind), hop_list(*at));
}

const FaultPlan& fault_plan() {
  static const FaultPlan plan = parse_fault_plan(settings().fault.get());
  return plan;
}

}  // namespace ringattn
