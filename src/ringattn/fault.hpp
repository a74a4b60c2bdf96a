// Fault injection, always compiled in: RINGATTN_FAULT=RANK:HOP:KIND makes rank RANK misbehave
// at ring hop HOP (0-based, the hop whose exchange is posted), so that tests can prove that every
// failure ends the whole job with a message instead of a hang. Kinds:
//   exit     the process dies (no finalize, no message from it)
//   hang     the rank stops posting exchanges and sleeps
//   corrupt  the rank sends a block of the wrong size
//   error    posting that hop's exchange fails on that rank with a RuntimeError ("injected
//            transport error"), as a failing transport call would
//   throw    the compute of that hop throws std::bad_alloc on that rank (from its flash calls),
//            after the hop's exchange was posted (an exception inside a hop, as a failing backend
//            allocation would)
// The plan is carried out by decorators of the transport and the backend that the CLI and the MPI
// test driver install (ringattn/fault_injection.hpp): the ring runner itself knows nothing of it.
#pragma once

#include <cstdint>
#include <string>

namespace ringattn {

enum class FaultKind : uint8_t { None = 0, Exit, Hang, Corrupt, Error, Throw };

const char* fault_kind_name(FaultKind k);

struct FaultPlan {
  int rank = -1;
  int hop = -1;
  FaultKind kind = FaultKind::None;
  bool active() const { return kind != FaultKind::None; }
  // True when the plan injects `k` on rank `r` at hop `h`.
  bool fires(FaultKind k, int r, int h) const { return kind == k && rank == r && hop == h; }
};

// Parses "RANK:HOP:KIND" (empty text: no fault). Throws InvalidArgument naming the text and the
// allowed form.
FaultPlan parse_fault_plan(const std::string& text);

// Refuses a plan that could never fire, naming RINGATTN_FAULT, its value and the allowed range:
// a rank outside 0..world-1, a hop past the ring's last (exchange hops 0..world-2, compute hops
// 0..world-1 for throw), or any plan when the run has no ring hops (`not_ring` says why, e.g. a
// distributed decode; empty for a ring run). Throws InvalidArgument.
void check_fault_plan(const FaultPlan& plan, int world, const std::string& not_ring);

// The plan from the RINGATTN_FAULT environment variable, parsed once.
const FaultPlan& fault_plan();

}  // namespace ringattn
