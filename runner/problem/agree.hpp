// Problem agreement before the first hop (ranks agree or stop: ARCHITECTURE.md, "Data flow of one
// ring run"), with room for each rank's local verdict on its own tensors, so a rank whose tensors
// are wrong stops every rank instead of leaving the others waiting at the first exchange.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runner/problem/problem.hpp"

namespace ringattn {

// What a rank adds to the shared problem: the layouts of its packed K/V blocks (every rank must
// read incoming blocks the same way), the ring's layouts (every rank must follow the same plan)
// and an error found in its local tensors ("" when none).
struct LocalVerdict {
  uint32_t k_layout = 0, v_layout = 0;
  bool decode = false;  // run_distributed_decode (also of a self-attention shaped problem)
  bool backward = false;  // run_attention_backward: a rank running the forward disagrees
  uint64_t layouts_hash = 0;  // a ring run: its plan's hash of every rank's layout (RingPlan::layouts_hash)
  std::string error;
};

// Allgathers the description of `p` plus `local` and throws InvalidArgument on every rank, with
// the same message, when a rank differs or reported an error.
void agree_on_run(const GlobalProblem& p, const LocalVerdict& local, Transport& t);

// A rank-local step's verdict, agreed before anything depends on it (the C ABI's ring calls, whose
// ranks may each pass anything): allgathers every rank's `error` ("" for none; the first 479 bytes)
// and one `value`, then throws InvalidArgument on every rank with the same text, agree_on_run's
// "ranks stopped before the first hop: rank R: ...", when any rank has an error. Returns the
// values in rank order. Collective over `t`.
std::vector<int64_t> agree_on_local_step(Transport& t, const std::string& error, int64_t value);


}  // namespace ringattn
