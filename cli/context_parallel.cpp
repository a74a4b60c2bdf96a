#include "cli/context_parallel.hpp"

#include <charconv>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"

namespace ringattn::cli {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

}  // namespace

int cp_group_size(const std::string& text, int world) {
  if (text == "ring") return 1;
  if (text == "ulysses") return world;
  constexpr std::string_view kHybrid = "hybrid:";
  const std::string allowed = fmt::format("ring, ulysses or hybrid:U with U ranks per all-to-all group, a divisor of "
                                          "the world of {} ({})", world, fmt::join(divisors(world), ", "));
  if (text.rfind(kHybrid, 0) != 0) fail_arg("--cp {}: not {}", text, allowed);
  const char* b = text.data() + kHybrid.size();
  const char* e = text.data() + text.size();
  int U = 0;
  const auto [end, ec] = std::from_chars(b, e, U);
  if (b == e || ec != std::errc() || end != e || U < 1) fail_arg("--cp {}: not {}", text, allowed);
  if (world % U != 0)
    fail_arg("--cp {}: groups of {} ranks do not divide the world of {}; U must be a divisor of it ({})", text, U,
             world, fmt::join(divisors(world), ", "));
  return U;
}

void check_cp(const std::string& text, const GlobalProblem& p, int U, bool device_memory, bool fault_plan) {
  if (U <= 1) return;
  if (!p.is_ring())
    fail_arg("--cp {} runs self-attention (kv_len = q_len, q_offset 0); this problem is a decode (q_len {}, kv_len "
             "{}, q_offset {}): use --cp ring", text, p.q_len, p.kv_len, p.resolved_q_offset());
  if (p.q_heads % U != 0 || p.kv_heads % U != 0)
    fail_arg("--cp {} over groups of {} ranks: --heads {} and --kv-heads {} must both divide by {} (each rank of a "
             "group attends heads / {} query and kv-heads / {} key/value heads)", text, U, p.q_heads, p.kv_heads, U,
             U, U);
  if (device_memory)
    fail_arg("--cp {} runs on CPU ranks for now (its all-to-all moves host memory): use --device cpu, or --cp ring "
             "on GPUs", text);
  if (fault_plan)
    fail_arg("RINGATTN_FAULT applies to --cp ring (its hops are those of the ring of every rank); unset it for --cp "
             "{}", text);
}

CpTransports split_cp(Transport& world, int U) {
  const int r = world.rank();
  CpTransports t;
  t.group_size = U;
  t.group = world.split(r / U, r % U);
  t.ring = world.split(r % U, r / U);
  t.grad_ring = world.split(r % U, r / U);
  return t;
}

std::string cp_words(int U, int world) {
  if (U <= 1) return "ring";
  if (U == world) return fmt::format("ulysses (one all-to-all group of {} ranks)", world);
  return fmt::format("hybrid:{} ({} groups of {} ranks, a ring across them)", U, world / U, U);
}

}  // namespace ringattn::cli
