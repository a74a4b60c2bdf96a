#include "ringattn/fault.hpp"

#include <chrono>
#include <cstdlib>
#include <thread>

#include <spdlog/spdlog.h>

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

bool fault_fires(FaultKind kind, int rank, int hop) {
  const FaultPlan& p = fault_plan();
  return p.kind == kind && p.rank == rank && p.hop == hop;
}

void maybe_die_or_hang(int rank, int hop) {
  if (fault_fires(FaultKind::Exit, rank, hop)) {
    spdlog::warn("injected fault (RINGATTN_FAULT): rank {} exits at hop {}", rank, hop);
    spdlog::default_logger()->flush();
    std::_Exit(3);
  }
  if (fault_fires(FaultKind::Hang, rank, hop)) {
    spdlog::warn("injected fault (RINGATTN_FAULT): rank {} stops posting at hop {} and hangs", rank, hop);
    spdlog::default_logger()->flush();
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace ringattn
