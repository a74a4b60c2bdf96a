// Fault injection, always compiled in: RINGATTN_FAULT=RANK:HOP:KIND[:PHASE] makes rank RANK
// misbehave at hop HOP (0-based, the hop whose exchange is posted) of the ring PHASE:
//   forward   (the default) the forward's K/V ring and its computes
//   backward  the ring backward's K/V ring and its computes
//   grads     the ring backward's second ring, the dK/dV accumulators (GradRing, grad_ring.hpp):
//             its exchange s is posted at hop s of the backward (1..P, where P brings every
//             accumulator home), and its compute is the fold of a received accumulator
// so that tests can prove that every failure ends the whole job with a message instead of a hang.
// Kinds:
//   exit     the process dies (no finalize, no message from it)
//   hang     the rank stops posting exchanges and sleeps
//   corrupt  the rank sends a block (grads: an accumulator) of the wrong size
//   error    posting that hop's exchange fails on that rank with a RuntimeError ("injected
//            transport error"), as a failing transport call would
//   throw    the compute of that hop throws std::bad_alloc on that rank (from its flash or
//            flash_backward calls), after the hop's exchange was posted (an exception inside a
//            hop, as a failing backend allocation would); grads: the fold of the accumulator
//            received at that hop (its Backend::add_f32), after both rings' exchanges completed
// The plan is carried out by decorators of the transports and the backend that the CLI and the MPI
// test driver install (runner/faults/fault_injection.hpp): the ring runner itself knows nothing of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runner/problem/problem.hpp"
#include "runner/ring/ring_plan.hpp"

namespace ringattn {

enum class FaultKind : uint8_t { None = 0, Exit, Hang, Corrupt, Error, Throw };

const char* fault_kind_name(FaultKind k);

// The ring a plan aims at (PHASE above).
enum class FaultPhase : uint8_t { Forward, Backward, Grads };

const char* fault_phase_name(FaultPhase ph);  // "forward", "backward", "grads"

struct FaultPlan {
  int rank = -1;
  int hop = -1;
  FaultKind kind = FaultKind::None;
  FaultPhase phase = FaultPhase::Forward;
  bool active() const { return kind != FaultKind::None; }
  // True when the plan injects `k` on rank `r` at hop `h` of ring `ph`.
  bool fires(FaultKind k, int r, int h, FaultPhase ph) const {
    return kind == k && rank == r && hop == h && phase == ph;
  }
  // "RINGATTN_FAULT=R:H:KIND", with ":backward" or ":grads" for those phases.
  std::string text() const;
};

// Parses "RANK:HOP:KIND[:PHASE]" (empty text: no fault). Throws InvalidArgument naming the text
// and the allowed form.
FaultPlan parse_fault_plan(const std::string& text);

// The hops of a ring run with the ring plan `plan` at which a fault plan for rank `rank` fires in
// ring `phase` (the backward's K/V ring follows the forward's routes, so both have the same ones;
// the dK/dV ring's are those of the same routes' accumulators, RingPlan::grad_sends):
struct FaultHops {
  int ring_hops = 1;          // the hops the K/V ring takes (RingPlan::hops)
  std::vector<int> posts;     // exit, hang, error: the exchanges the rank posts, 0..ring_hops-2
                              //   (grads: the dK/dV exchanges that run, within 1..P)
  std::vector<int> sends;     // corrupt: those in which it sends a block (grads: an accumulator)
                              //   that is not empty
  std::vector<int> computes;  // throw: the hops at which it computes on a block (grads: at which
                              //   it folds a received accumulator into its own or into dk, dv)
};
FaultHops fault_hops(const RingPlan& plan, int rank, FaultPhase phase = FaultPhase::Forward);

// Refuses a plan that could never fire in a run of `p` over `world` ranks (`backward`: the run
// has a ring backward; `ring`: the run's ring plan, null only for a problem that is no ring), naming RINGATTN_FAULT, its value and what is allowed: a rank outside
// 0..world-1, a backward or grads plan without a backward, any plan when the run has no ring hops
// (a distributed decode), or a hop at which the rank does nothing the kind hooks into (fault_hops:
// the message lists the hops it could fire at). Throws InvalidArgument; the same text on every
// rank (it depends on the plan and the problem only).
void check_fault_plan(const FaultPlan& plan, const GlobalProblem& p, const RingPlan* ring, int world, bool backward);

// The process's plan: RINGATTN_FAULT of settings() (core/settings.hpp), parsed once (the default of
// the decorators' installers; the CLI parses its own Settings' text).
const FaultPlan& fault_plan();

}  // namespace ringattn
