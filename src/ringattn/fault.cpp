#include "ringattn/fault.hpp"

#include <cstdlib>

#include <fmt/format.h>

#include "core/error.hpp"

namespace ringattn {

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

FaultPlan parse_fault_plan(const std::string& text) {
  FaultPlan plan;
  if (text.empty()) return plan;
  const auto bad = [&]() {
    fail_arg("RINGATTN_FAULT='{}' is not RANK:HOP:KIND with RANK, HOP >= 0 and KIND one of exit, hang, corrupt, "
             "error, throw", text);
  };
  const size_t a = text.find(':'), b = a == std::string::npos ? a : text.find(':', a + 1);
  if (b == std::string::npos) bad();
  const auto to_int = [&](const std::string& s) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) bad();
    return std::stoi(s);
  };
  plan.rank = to_int(text.substr(0, a));
  plan.hop = to_int(text.substr(a + 1, b - a - 1));
  const std::string kind = text.substr(b + 1);
  if (kind == "exit") plan.kind = FaultKind::Exit;
  else if (kind == "hang") plan.kind = FaultKind::Hang;
  else if (kind == "corrupt") plan.kind = FaultKind::Corrupt;
  else if (kind == "error") plan.kind = FaultKind::Error;
  else if (kind == "throw") plan.kind = FaultKind::Throw;
  else bad();
  return plan;
}

void check_fault_plan(const FaultPlan& plan, int world, const std::string& not_ring) {
  if (!plan.active()) return;
  const std::string value = fmt::format("RINGATTN_FAULT={}:{}:{}", plan.rank, plan.hop, fault_kind_name(plan.kind));
  if (plan.rank >= world)
    fail_arg("{} names rank {}, but the world has {} rank{} (0..{})", value, plan.rank, world, world == 1 ? "" : "s",
             world - 1);
  if (!not_ring.empty()) fail_arg("{} applies to ring runs; this is {}", value, not_ring);
  const bool compute = plan.kind == FaultKind::Throw;
  const int last = compute ? world - 1 : world - 2;
  if (plan.hop > last) {
    const std::string exchange = world == 1 ? std::string("no exchange hops") : fmt::format("exchange hops 0..{}", world - 2);
    fail_arg("{} names hop {}, but a ring of {} rank{} has {} (kind throw: 0..{})", value, plan.hop, world,
             world == 1 ? "" : "s", exchange, world - 1);
  }
}

const FaultPlan& fault_plan() {
  static const FaultPlan plan = [] {
    const char* env = std::getenv("RINGATTN_FAULT");
    return parse_fault_plan(env ? env : "");
  }();
  return plan;
}

}  // namespace ringattn
