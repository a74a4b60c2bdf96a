#include "ringattn/fault.hpp"

#include <cstdlib>

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

const FaultPlan& fault_plan() {
  static const FaultPlan plan = [] {
    const char* env = std::getenv("RINGATTN_FAULT");
    return parse_fault_plan(env ? env : "");
  }();
  return plan;
}

}  // namespace ringattn
