// The ring plan of one problem over P ranks (ARCHITECTURE.md, "Data flow of one ring run"): every
// rank's calls, the routes, the rows each block ships, the block capacity, the hops the ring
// takes and the bytes each rank sends, computed once from the problem and the ranks' layouts and
// shared by the forward ring, the ring backward (its K/V ring and its dK/dV ring), `plan`, the dry
// run and the fault checks. Pure logic (no tensors, no communication): every rank derives the
// same plan from the same problem and layouts.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/mask.hpp"
#include "runner/problem/checked.hpp"
#include "runner/problem/problem.hpp"
#include "runner/problem/sharding.hpp"
#include "runner/ring/schedule.hpp"

namespace ringattn {

// Which exchanges carry which block, and what travels on them. carried[q * P + h], for source
// rank q and hop h < P - 1, is true when some rank after the block's holder at hop h computes on
// it at a later hop, so the holder passes it on; a block that no later rank needs is not sent
// (causal contiguous shards, packed documents, windows). shipped[q] is the rows of rank q's shard
// that any hop after the first computes on (a contiguous range: [0, 0) when none): a block
// travels with those rows only, so a window sends only the keys a neighbour's window reaches, not
// the whole shard. The block a hop holds then starts at row shipped[source].begin of its source's
// shard.
struct RingRoutes {
  std::vector<char> carried;
  std::vector<KeyRange> shipped;  // per source rank
  // Per source rank q: the first hop h >= 1 at which rank q + h computes on q's block; P when
  // none does. The ring backward's dK/dV accumulator of q's block travels from there on.
  std::vector<int> first_remote_hop;
};

class RingPlan {
 public:
  // Every rank's schedule, built once (P schedules of P hops, one in memory at a time), for the
  // mask and documents of `p` (self-attention: p.is_ring(); p.sharding is not read) and
  // `layouts` (layouts[q]: the rows rank q holds, in its local row order; any layouts that
  // check_layouts accepts, so a layout no Sharding names is a plan like any other). Keeps the
  // calls of rank `keep` (the rank that runs; -1: none, for a plan that only counts). Throws
  // InvalidArgument naming what does not fit.
  RingPlan(const GlobalProblem& p, std::span<const ShardLayout> layouts, int keep = -1);

  int world() const { return int(layouts_.size()); }
  int kept_rank() const { return keep_; }
  const std::vector<ShardLayout>& layouts() const { return layouts_; }
  const ShardLayout& layout(int q) const { return layouts_[size_t(q)]; }
  // The kept rank's hops. Throws InvalidArgument when the plan keeps none.
  const RingSchedule& schedule() const;

  // Per rank q, over all hops and per (batch, head): the query-key pairs and the kernel calls;
  // whether its hop `hop` computes (has a call).
  PairCount visible_pairs(int q) const { return pairs_[size_t(q)]; }
  int kernel_calls(int q) const { return calls_[size_t(q)]; }
  bool computes(int q, int hop) const { return computes_[size_t(q) * size_t(world()) + size_t(hop)] != 0; }
  // Load balance: max / mean over ranks of the visible pairs (1.0 is perfect; the slowest rank
  // sets the pace).
  double imbalance() const;

  // The K/V ring. The hops it takes: one more than the last exchange that carries any block, 1
  // when none does (hop 0 computes on the rank's own block); every later hop would only pass
  // empty blocks and compute nothing, so the ring stops there (P at most).
  const RingRoutes& routes() const { return routes_; }
  int hops() const { return hops_; }
  static int source(int rank, int hop, int world) { return ((rank - hop) % world + world) % world; }
  bool carries(int src, int hop) const { return routes_.carried[size_t(src) * size_t(world()) + size_t(hop)] != 0; }
  // Whether exchange `hop` (< hops() - 1) of rank `rank` sends a block holding rows.
  bool sends_block(int rank, int hop) const;
  // The rows of the largest block that travels (at least 1: never a 0-byte buffer), and its
  // bytes (K and V): the BlockRing's buffers and the warm-up's exchange.
  int64_t block_tokens() const { return block_tokens_; }
  uint64_t block_bytes() const { return kv_token_bytes_ * uint64_t(block_tokens_); }
  // What rank `rank` sends over the K/V ring: hop s (s < P - 1) passes on the block of rank
  // (rank - s) mod P, its shipped tokens, when carried. In bytes: what a run reports.
  int64_t kv_tokens_sent(int rank) const;
  uint64_t ring_bytes(int rank) const { return kv_token_bytes_ * uint64_t(kv_tokens_sent(rank)); }

  // The ring backward's dK/dV ring (ARCHITECTURE.md, "A second ring"): the fp32 accumulator of
  // rank q's block holds its shipped rows; it starts at the holder of hop f = first_remote_hop[q]
  // and moves one rank on per exchange until it is home at rank q (P - f exchanges). Exchange s
  // (1 <= s <= P) of rank r sends the accumulator of block r - s + 1 (computed into at hop s - 1)
  // and receives that of block r - s. Whether exchange s runs (some rank sends in it: every rank
  // posts it then, or none does), and whether rank `rank` sends, or receives, an accumulator
  // holding rows in it: the GradRing's sizes and the hops at which a fault plan on the dK/dV
  // ring can fire (runner/faults/fault.hpp).
  bool grad_exchange_runs(int s) const { return s >= 1 && s <= world() && grad_runs_[size_t(s)] != 0; }
  bool grad_sends(int rank, int s) const;
  bool grad_receives(int rank, int s) const;
  // The bytes of the largest accumulator (dK and dV in fp32 of block_tokens rows), the bytes rank
  // `rank` sends over the dK/dV ring, and over both rings of a backward.
  uint64_t grad_block_bytes() const { return grad_token_bytes_ * uint64_t(block_tokens_); }
  uint64_t grad_bytes(int rank) const;
  uint64_t backward_bytes(int rank) const { return ring_bytes(rank) + grad_bytes(rank); }

  // Throws InvalidArgument unless this plan was made for `p` (its shape, mask and documents)
  // over `world` ranks keeping rank `rank`'s calls, naming what differs.
  void check_fits(const GlobalProblem& p, int world, int rank) const;
  // A hash of every rank's layout: the agreement compares it (ranks with different layouts stop).
  uint64_t layouts_hash() const { return layouts_hash_; }

 private:
  bool grad_carries(int src, int s) const { return routes_.first_remote_hop[size_t(src)] <= s - 1; }
  bool grad_travels(int src, int s) const { return grad_carries(src, s) && !routes_.shipped[size_t(src)].empty(); }
  void add_schedule(int rank, const RingSchedule& s);  // its calls into the counts and the routes
  void finish_routes();

  GlobalProblem problem_;  // the fields the plan depends on (check_fits)
  std::vector<int64_t> bounds_;
  std::vector<ShardLayout> layouts_;
  int keep_ = -1;
  std::optional<RingSchedule> schedule_;
  std::vector<PairCount> pairs_;
  std::vector<int> calls_;
  std::vector<char> computes_;  // [rank * P + hop]
  RingRoutes routes_;
  std::vector<char> grad_runs_;  // per dK/dV exchange 0..P
  int hops_ = 1;
  int64_t block_tokens_ = 1;
  uint64_t kv_token_bytes_ = 0, grad_token_bytes_ = 0;  // K and V of one token; dK and dV in fp32
  uint64_t layouts_hash_ = 0;
};

// The plan of `p` over `world` ranks with the layouts of p.sharding (shard_layouts), keeping rank
// `keep`'s calls.
RingPlan ring_plan(const GlobalProblem& p, int world, int keep = -1);

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

// The plans of `p` under every sharding of kAutoOrder, in that order (keeping rank `keep`'s
// calls), and the index of the one `--shard auto` takes: pick_balanced over their imbalances
// (and, with a window, the tokens their rings send). Every rank picks the same one.
std::vector<RingPlan> candidate_plans(const GlobalProblem& p, int world, int keep = -1);
int best_of(std::span<const RingPlan> candidates, bool windowed);
// The sharding with the best balance for the mask and documents of `p` over `world` ranks.
Sharding best_sharding(const GlobalProblem& p, int world);

}  // namespace ringattn
