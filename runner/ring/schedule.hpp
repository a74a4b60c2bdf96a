// The ring schedule of one rank: for every hop, which (query segment, key segment) pairs of this
// rank are computed and how. Pure logic over absolute positions (no tensors, no communication),
// so the classification is unit-tested on its own (tests/unit/test_schedule.cpp). The ring plan
// (ring_plan.hpp) builds every rank's schedule once and derives the routes from them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/mask.hpp"
#include "runner/problem/checked.hpp"
#include "runner/problem/problem.hpp"
#include "runner/problem/sharding.hpp"

namespace ringattn {

enum class PairVisibility : uint8_t {
  Full,       // every key visible to every query: no mask
  Diagonal,   // some keys visible: causal mask with q_offset
  Invisible,  // no key visible to any query: never computed
};

struct PairClass {
  PairVisibility visibility = PairVisibility::Invisible;
  MaskSpec mask;                // Diagonal: the call's mask (core/mask.hpp); Full: no mask
  PairCount visible_pairs = 0;  // query-key pairs the call computes (128-bit: up to seq^2)
};

// Classifies queries at positions q.start + q.stride*i against keys at k.start + k.stride*j under
// the causal rule and the window `w` (core/mask.hpp band_mask). Both runs must share a stride S
// (contiguous: 1, striped: P): key j is visible to query i iff k.start + S*j <= q.start + S*i,
// i.e. j <= i + floor((q.start - k.start) / S), and likewise for the window's edges: one kernel
// call. Unwindowed non-causal pairs are always Full.
PairClass classify_pair(const Segment& q, const Segment& k, bool causal, Window w = {});

// One flash call: local query rows [q_row0, q_row0 + q_rows) against rows [k_row0, k_row0 + k_rows)
// of the K/V block that this hop holds (rows of the source's shard; a masked call's keys are cut
// to those some of its rows see).
struct PairCall {
  int64_t q_row0 = 0, q_rows = 0, k_row0 = 0, k_rows = 0;
  MaskSpec mask;  // MaskSpec{} (full) for Full pairs: the kernel pays no masking cost
  PairCount visible_pairs = 0;
};

struct HopPlan {
  int source_rank = 0;          // where the K/V block of this hop originated: (r - s) mod P
  std::vector<PairCall> calls;  // empty: the hop only forwards the block
  PairCount visible_pairs = 0;
};

class RingSchedule {
 public:
  // The hops of rank `rank` against the blocks of every rank: layouts[q] is the rows rank q
  // holds (its local row order), layouts.size() the world. The layouts must share the sequence
  // out (check_layouts in sharding.hpp; RingPlan checks them, and is what builds schedules). With
  // packed documents (`docs`, core/mask.hpp; boundaries in absolute positions), every (query
  // segment, key segment) pair is split at the document boundaries: a call never spans two
  // documents, and pairs of different documents are never computed. With a window, pairs
  // outside the band are never computed.
  RingSchedule(std::span<const ShardLayout> layouts, int rank, bool causal, Documents docs = {}, Window window = {});

  // One plan per hop, P of them; hops past the ring's last needed one (RingPlan::hops) have no calls.
  const std::vector<HopPlan>& hops() const { return hops_; }
  const ShardLayout& local_layout() const { return local_; }
  PairCount visible_pairs() const;  // over all hops, per (batch, head)
  int kernel_calls() const;

 private:
  ShardLayout local_;
  std::vector<HopPlan> hops_;
};

}  // namespace ringattn
