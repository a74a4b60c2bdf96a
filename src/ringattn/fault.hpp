// Fault injection, always compiled in: RINGATTN_FAULT=RANK:HOP:KIND makes rank RANK misbehave
// at ring hop HOP (0-based, the hop whose exchange is posted), so that tests can prove that every
// failure ends the whole job with a message instead of a hang. Kinds:
//   exit     the process dies (no finalize, no message from it)
//   hang     the rank stops posting exchanges and sleeps
//   corrupt  the rank sends a block of the wrong size
//   error    posting that hop's exchange fails on that rank with a RuntimeError ("injected
//            transport error"), as a failing transport call would
//   throw    the compute of that hop throws std::bad_alloc on that rank, after the hop's exchange
//            was posted (an exception inside a hop, as a failing backend allocation would)
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
};

// Parses "RANK:HOP:KIND" (empty text: no fault). Throws InvalidArgument naming the text and the
// allowed form.
FaultPlan parse_fault_plan(const std::string& text);

// The plan from the RINGATTN_FAULT environment variable, parsed once.
const FaultPlan& fault_plan();

// True when the plan injects `kind` on `rank` at `hop`.
bool fault_fires(FaultKind kind, int rank, int hop);

// Carries out an Exit or Hang fault if one fires here (logs first); returns otherwise.
void maybe_die_or_hang(int rank, int hop);

}  // namespace ringattn
