// The ring schedule: for every hop, which (query segment, key segment) pairs of this rank are
// computed and how. Pure logic over absolute positions (no tensors, no communication), so the
// classification is unit-tested on its own (tests/unit/test_schedule.cpp).
#pragma once

#include <cstdint>
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
  // Validates the sharding of seq_len (check_shardable) first. With packed documents (`docs`,
  // core/mask.hpp; boundaries in absolute positions), every (query segment, key segment) pair is
  // split at the document boundaries: a call never spans two documents, and pairs of different
  // documents are never computed. With a window, pairs outside the band are never computed.
  RingSchedule(Sharding sharding, int64_t seq_len, bool causal, int rank, int world, Documents docs = {},
               Window window = {});

  // One plan per hop, P of them; hops past the ring's last needed one (ring_hops) have no calls.
  const std::vector<HopPlan>& hops() const { return hops_; }
  const ShardLayout& local_layout() const { return local_; }
  PairCount visible_pairs() const;  // over all hops, per (batch, head)
  int kernel_calls() const;

 private:
  ShardLayout local_;
  std::vector<HopPlan> hops_;
};

// Load balance of a sharding: max / mean over ranks of the visible query-key pairs each rank
// computes (1.0 is perfect; the slowest rank sets the pace). O(P) schedules.
double sharding_imbalance(Sharding sharding, int64_t seq_len, bool causal, int world, Documents docs = {},
                          Window window = {});

// The shardings in the order `--shard auto` prefers them on a tie, and the pick itself: the
// smallest imbalance (given in that order), the earlier on a tie. With `traffic` (windowed
// masks, where the bytes depend on the sharding: tokens all ranks send): among the shardings
// within kTrafficTolerance of the best imbalance, the least traffic (contiguous shards send a
// block one hop for a window no longer than a shard; zigzag sends blocks the whole ring).
// doc-zigzag comes last: without documents it is zigzag, which the tie then keeps.
inline constexpr int kShardings = 4;
inline constexpr Sharding kAutoOrder[kShardings] = {Sharding::Zigzag, Sharding::Contiguous, Sharding::Striped,
                                                    Sharding::DocZigzag};
inline constexpr double kTrafficTolerance = 1.05;
Sharding pick_balanced(const double (&imbalance)[kShardings], const double (*traffic)[kShardings] = nullptr);

// The sharding with the best balance for this mask and these documents (`--shard auto`):
// pick_balanced over sharding_imbalance (and, with a window, the tokens block_routes sends).
// Every rank picks the same one.
Sharding best_sharding(int64_t seq_len, bool causal, int world, Documents docs = {}, Window window = {});

// Which exchanges carry which block. carried[q * P + h], for source rank q and hop h < P - 1, is
// true when some rank after the block's holder at hop h computes on it at a later hop, so the
// holder passes it on; a block that no later rank needs is not sent (causal contiguous shards,
// packed documents, windows). Every rank derives the same table from the problem alone (P
// schedules).
std::vector<char> block_routes(Sharding sharding, int64_t seq_len, bool causal, int world, Documents docs = {},
                               Window window = {});

// The routes and what travels on them. shipped[q] is the rows of rank q's shard that any hop
// after the first computes on (a contiguous range: [0, 0) when none): a block travels with those
// rows only, so a window sends only the keys a neighbour's window reaches, not the whole shard.
// The block a hop holds then starts at row shipped[source].begin of its source's shard.
struct RingRoutes {
  std::vector<char> carried;     // block_routes
  std::vector<KeyRange> shipped;  // per source rank
  // Per source rank q: the first hop h >= 1 at which rank q + h computes on q's block; P when
  // none does. The ring backward's dK/dV accumulator of q's block travels from there on.
  std::vector<int> first_remote_hop;
  std::vector<int64_t> shipped_tokens() const;
};
RingRoutes ring_routes(Sharding sharding, int64_t seq_len, bool causal, int world, Documents docs = {},
                       Window window = {});

// The hops the ring takes with these routes: one more than the last exchange that carries any
// block, 1 when none does (hop 0 computes on the rank's own block). Every later hop would only
// pass empty blocks and compute nothing, so the ring stops there (P at most).
int ring_hops(const std::vector<char>& carried, int world);

// The bytes rank `rank` sends over the ring with these routes: hop s (s < P - 1) passes on the
// block of rank (r - s) mod P, tokens[q] tokens of token_bytes each (K and V), when carried
// (tokens: RingRoutes::shipped_tokens).
uint64_t ring_bytes_sent(const std::vector<char>& carried, const std::vector<int64_t>& tokens, uint64_t token_bytes,
                         int rank, int world);

// The ring backward's second ring (ARCHITECTURE.md, "A second ring"): the fp32 dK/dV accumulator
// of rank q's block holds its shipped rows; it starts at the holder of hop f = first_remote_hop[q]
// and moves one rank on per exchange until it is home at rank q (P - f exchanges). Exchange s
// (1 <= s <= P) of rank r sends the accumulator of block (r - s + 1) on when f <= s - 1: the one
// rank r computed into at hop s - 1. Whether exchange s of any rank sends anything (every rank
// posts it then, or none does).
bool grad_exchange_carries(const RingRoutes& routes, int source, int exchange);
bool grad_exchange_runs(const RingRoutes& routes, int exchange, int world);
// The bytes rank `rank` sends over the dK/dV ring: per exchange, shipped rows x token_bytes (dK
// and dV of one token in fp32).
uint64_t grad_bytes_sent(const RingRoutes& routes, uint64_t token_bytes, int rank, int world);

}  // namespace ringattn
