// What a run reports: per-hop and per-rank timings, bytes and work.
#pragma once

#include <cstdint>
#include <vector>

namespace ringattn {

// ---------------------------------------------------------------------------------------------
// Statistics one rank returns from a run. Times are seconds of wall clock on this rank.

struct HopStats {
  int hop = 0;
  int source_rank = 0;         // the rank the K/V block of this hop originated on
  int kernel_calls = 0;        // flash calls (visible segment pairs); 0 = forwarded only
  int64_t visible_pairs = 0;   // query-key pairs this hop computes (causal mask applied)
  double compute_s = 0;        // kernels of this hop, to completion
  double exposed_comm_s = 0;   // waiting for the exchange after the compute finished (this includes
                               // waiting for a slower neighbour: load imbalance shows up here)
  double transfer_s = -1;      // the exchange itself, post to completion (-1 when not measurable;
                               // the MPI helper thread measures it, the nonblocking mode cannot)
  uint64_t bytes_sent = 0;     // bytes this hop sent to the next rank
};

struct RankStats {
  int rank = 0, world = 1;
  double total_s = 0;          // the whole call, agreement included
  double agree_s = 0;          // problem agreement
  double setup_s = 0;          // packing K/V, emptying the state
  double compute_s = 0;        // sum over hops (decode: the local split-KV decode)
  double exposed_comm_s = 0;   // communication the compute did not hide (decode: the allgather)
  double transfer_s = -1;      // sum of measured exchange times (-1 when the transport cannot tell)
  double merge_s = 0;          // decode: merging the gathered states
  double finalize_s = 0;       // the cast to the output dtype
  uint64_t bytes_sent = 0;     // through Transport::start_exchange (decode: its allgather bytes;
                               // hybrid: the ring's and the all-to-alls')
  uint64_t group_bytes_sent = 0;  // hybrid: what its all-to-alls sent to the other ranks of the group
  double group_s = 0;          // hybrid: the all-to-alls, packing included (also in exposed_comm_s)
  int64_t visible_pairs = 0;   // query-key pairs computed: the deterministic cost of this rank
  int kernel_calls = 0;
  std::vector<HopStats> hops;  // ring: one per hop (P of them); decode: empty

  // Fraction of the measured exchange time hidden behind compute: 1 - exposed / transfer,
  // clamped to [0, 1]; -1 when the transfer time is unknown or there was no exchange.
  double hidden_fraction() const;
  // Adds one hop to the totals (compute, exposed time, pairs, calls, bytes) and to `hops`; the
  // transfer time is the caller's (the forward sums it, the backward measures it whole).
  void add_hop(const HopStats& hs);
};

}  // namespace ringattn
