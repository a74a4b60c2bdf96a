// --cp: how the ranks share the attention. ring: K/V around a ring of every rank (the default);
// ulysses: one all-to-all over heads (every rank attends all tokens of heads / P heads);
// hybrid:U: the all-to-all inside groups of U consecutive ranks and a ring across the P / U
// groups (runner/ring/hybrid.hpp). ring is hybrid:1, ulysses hybrid:P.
#pragma once

#include <memory>
#include <string>

#include "comm/transport.hpp"
#include "runner/problem/problem.hpp"

namespace ringattn::cli {

// The ranks per all-to-all group that --cp `text` asks of a world of `world` ranks: ring 1,
// ulysses `world`, hybrid:U U. Throws InvalidArgument naming the text and what is allowed (U a
// divisor of the world: they are listed). The same on every rank.
int cp_group_size(const std::string& text, int world);

// What a run with groups of U > 1 ranks refuses, naming --cp `text`: a decode (the all-to-all
// splits self-attention's tokens), heads that do not divide by U, device memory (the all-to-all
// moves host memory) and a RINGATTN_FAULT plan (its hops are the ring's of every rank).
void check_cp(const std::string& text, const GlobalProblem& p, int U, bool device_memory, bool fault_plan);

// This rank's transports under groups of U > 1 ranks: its all-to-all group, the ring across the
// groups (the ranks at its place in every group) and a second transport over the ring's ranks for
// the backward's dK/dV accumulators. Split from `world` (collective: every rank calls it at the
// same point). The words of the reports: "2 groups of 2 ranks (hybrid:2)".
struct CpTransports {
  int group_size = 1;
  std::unique_ptr<Transport> group, ring, grad_ring;
};
CpTransports split_cp(Transport& world, int U);
std::string cp_words(int U, int world);
// ", cp <cp_words>" for groups of U > 1 ranks, "" for the ring (the reports' lines stay as they were).
inline std::string cp_suffix(int U, int world) { return U > 1 ? ", cp " + cp_words(U, world) : std::string(); }

}  // namespace ringattn::cli
