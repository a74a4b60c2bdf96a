#include "runner/faults/fault.hpp"


#include <fmt/format.h>

#include "core/error.hpp"
#include "core/settings.hpp"
#include "runner/ring/ring_plan.hpp"

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

// The dK/dV ring's hops of rank `rank` (FaultHops' grads meanings; the plan's dK/dV ring).
FaultHops grad_fault_hops(const RingPlan& plan, int rank) {
  const int world = plan.world();
  FaultHops h;
  h.ring_hops = plan.hops();
  for (int s = 1; s <= world && world > 1; ++s) {
    if (!plan.grad_exchange_runs(s)) continue;
    h.posts.push_back(s);
    if (plan.grad_sends(rank, s)) h.sends.push_back(s);
    // Hop s < P folds what it received into the accumulator it computed; exchange P brings
    // this rank's own accumulator home, into dk and dv.
    const bool folds = s == world || plan.computes(rank, s);
    if (folds && plan.grad_receives(rank, s)) h.computes.push_back(s);
  }
  return h;
}

}  // namespace

FaultHops fault_hops(const RingPlan& plan, int rank, FaultPhase phase) {
  if (phase == FaultPhase::Grads) return grad_fault_hops(plan, rank);
  FaultHops h;
  h.ring_hops = plan.hops();
  for (int s = 0; s + 1 < h.ring_hops; ++s) {
    h.posts.push_back(s);
    if (plan.sends_block(rank, s)) h.sends.push_back(s);
  }
  for (int s = 0; s < h.ring_hops; ++s)
    if (plan.computes(rank, s)) h.computes.push_back(s);
  return h;
}

void check_fault_plan(const FaultPlan& plan, const GlobalProblem& p, const RingPlan* ring, int world, bool backward) {
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
  if (ring == nullptr) fail_arg("{}: checking a plan for a ring run needs the run's ring plan", value);
  const bool grads = plan.phase == FaultPhase::Grads;
  const FaultHops h = fault_hops(*ring, plan.rank, plan.phase);
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
  const std::string travel =
      grads ? fmt::format("the dK/dV accumulators of this problem travel at {} over {} rank{}", hop_list(h.posts),
                          world, world == 1 ? "" : "s")
            : fmt::format("this problem's ring takes {} hop{} over {} rank{}", h.ring_hops, h.ring_hops == 1 ? "" : "s",
                          world, world == 1 ? "" : "s");
  fail_arg("{} can never fire: rank {} {} at hop {} of the {} ring ({}); on rank {}, {} can fire at {}", value,
           plan.rank, does, plan.hop, phase, travel, plan.rank, fault_kind_name(plan.kind), hop_list(*at));
}

const FaultPlan& fault_plan() {
  static const FaultPlan plan = parse_fault_plan(settings().fault.get());
  return plan;
}

}  // namespace ringattn
