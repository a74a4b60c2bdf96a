// The K/V block ring of one rank: this rank's K and V packed into one block that travels around
// the ring, one hop at a time, in a double buffer (the block of hop s computes while the block of
// hop s + 1 arrives into the other buffer). Its RingChannel (ring_channel.hpp) posts and
// completes each hop's exchange, writes the flight recorder, restates transport failures with the
// hop, and owns the error path of an exchange: an exception while one is outstanding ends it
// (Transport::abandon_exchange) before the buffers are freed, and the ring keeps them allocated
// for good when the transport gave up.
//
// A BlockRing holds no static or global state: two can exist at once (the ring backward sends dK/dV
// around while K/V travel). A Transport runs one exchange at a time, and forward_exchange assumes
// the transport's previous exchange was this ring's, so each ring needs a Transport of its own
// (for MPI: a transport over its own communicator, e.g. a duplicate of MPI_COMM_WORLD).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.hpp"
#include "runner/diagnostics/flight_recorder.hpp"
#include "runner/ring/ring_buffers.hpp"
#include "runner/ring/ring_channel.hpp"
#include "runner/ring/ring_plan.hpp"

namespace ringattn {

class BlockRing {
 public:
  // Packs `k` and `v` into the first block when the world has more than one rank (a world of one
  // reads them in place). `plan` (ring_plan.hpp; it must outlive the ring) says how many tokens
  // each rank holds (shards may be uneven, and empty; k.len must be this rank's), which hop's
  // exchange carries which block on (a block that is not carried is sent and received as 0
  // bytes, and no later hop may compute on it), the rows of its source's shard each block travels
  // with (RingRoutes::shipped: hop 0 reads this rank's whole k and v, a later hop's block holds
  // only the shipped rows of its source), and the buffers' size (RingPlan::block_tokens). Device
  // blocks travel through host memory (StagingTransport) when `t` cannot take device pointers;
  // device-side exchanges are ordered after `b`'s stream.
  BlockRing(Backend& b, Transport& t, const TensorView& k, const TensorView& v, const RingPlan& plan,
            FlightRecorder& recorder);
  ~BlockRing();
  BlockRing(const BlockRing&) = delete;
  BlockRing& operator=(const BlockRing&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  // The hops the ring takes: one more than the last that carries a block (RingPlan::hops).
  int hops() const { return plan_.hops(); }
  // Whether hop `hop` passes its block on (every hop but the last).
  bool exchanges(int hop) const { return hop + 1 < hops(); }
  // Posts hop `hop`'s exchange: the block held now goes to rank r + 1, the next one arrives from
  // rank r - 1. Returns the bytes the transport sent. Failures name the hop (RuntimeError).
  uint64_t post(int hop);
  // The rank whose block hop `hop` holds: (r - hop) mod P.
  int source(int hop) const { return ((rank_ - hop) % world_ + world_) % world_; }
  // The bytes of the block that hop `hop` holds (K and V of its source's shipped tokens).
  size_t block_bytes(int hop) const { return 2 * token_bytes_ * size_t(travel(source(hop)).size()); }
  // The row of its source's shard at which the block of hop `hop` starts (0 at hop 0).
  int64_t first_row(int hop) const { return hop == 0 ? 0 : travel(source(hop)).begin; }
  // The bytes hop `hop`'s exchange sends (the block held, when it is carried on) and receives
  // (the next hop's block, when its holder carries it).
  size_t send_bytes(int hop) const { return carries(source(hop), hop) ? block_bytes(hop) : 0; }
  size_t recv_bytes(int hop) const { return carries(source(hop + 1), hop) ? block_bytes(hop + 1) : 0; }
  // Completes hop `hop`'s exchange: the next hop's block is then ready.
  void complete(int hop);
  // The transport's measure of the last completed exchange (-1: unknown).
  double last_exchange_seconds() const { return channel_.last_exchange_seconds(); }

  // The K and V that hop `hop` computes on: this rank's own tensors at hop 0 (read in place; the
  // packed copy only travels), else the block received.
  TensorView k(int hop) const;
  TensorView v(int hop) const;

 private:
  void* block(int hop) const { return blocks_[hop % 2].get(); }
  TensorView shaped(const TensorView& x, int hop) const;  // x with the token count of hop's source
  // The rows of rank q's shard that its block travels with.
  KeyRange travel(int q) const { return plan_.routes().shipped[size_t(q)]; }
  bool carries(int src, int hop) const { return plan_.carries(src, hop); }

  TensorView k_, v_;
  BlockLayout k_layout_, v_layout_;
  const RingPlan& plan_;
  int rank_, world_;
  size_t token_bytes_ = 0;  // bytes of one token of K (or of V): batch x kv_heads x dim x dtype size
  DeviceBuffer blocks_[2];
  RingChannel channel_;  // after the blocks: destroyed first
};

}  // namespace ringattn
