// The ring backward's second ring (ARCHITECTURE.md, "A second ring"): the fp32 dK/dV accumulators
// of the K/V blocks, travelling one hop behind their blocks over a Transport of their own.
//
// Rank r computes hop s's dK/dV (the block of rank r - s, its shipped rows) into a zeroed buffer
// while exchange s moves the accumulators on: rank r sends the one it completed at hop s - 1 and
// receives the block of hop s's accumulator from rank r - 1, which computed on it at hop s - 1.
// After the compute, the received accumulator is added into the new one, which exchange s + 1
// sends on. Exchange P brings every accumulator home (rank r receives its own block's), where it
// is added into the rank's dk and dv. Hop 0's gradients never travel: they go into dk and dv
// directly. An accumulator travels from the first hop that computes on its block (the dK/dV ring
// of ring_plan.hpp), so exchanges carry only accumulators holding something.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.hpp"
#include "runner/diagnostics/flight_recorder.hpp"
#include "runner/ring/ring_channel.hpp"
#include "runner/ring/ring_plan.hpp"

namespace ringattn {

class GradRing {
 public:
  // `t` carries the accumulators only (not the K/V ring's transport). `shape` is a K view of
  // this rank (batch, kv heads, head dim). `plan` (which must outlive the ring) says which
  // exchange sends and receives which accumulator (RingPlan::grad_sends, grad_receives).
  GradRing(Backend& b, Transport& t, const TensorView& shape, const RingPlan& plan, FlightRecorder& recorder);
  ~GradRing();
  GradRing(const GradRing&) = delete;
  GradRing& operator=(const GradRing&) = delete;

  // Whether exchange `s` (1..P) runs: some rank sends in it (the same answer on every rank).
  bool exchanges(int s) const { return plan_.grad_exchange_runs(s); }
  // Posts exchange `s`; returns the bytes the transport sent. Failures name the hop.
  uint64_t post(int s);
  // Completes exchange `s`: then the received accumulator is folded in (fold) or, after
  // exchange P, ready for bring_home.
  void complete(int s);
  double last_exchange_seconds() const { return channel_.last_exchange_seconds(); }

  // The zeroed dK and dV views (the shipped rows of hop s's block) that hop s computes into
  // (s >= 1); their row 0 is row first_row(s) of the source's shard.
  void begin_compute(int s);
  TensorView dk() const { return view(comp_, 0); }
  TensorView dv() const { return view(comp_, 1); }
  // After hop s and exchange s: the accumulator that exchange s + 1 sends on is this hop's
  // computed one (when `computed`) plus the received one (when exchange s received one).
  void fold(int s, bool computed);
  // After exchange P: adds this rank's own accumulator (when one came home) into rows
  // shipped[rank] of `dk` and `dv`.
  void bring_home(const TensorView& dk, const TensorView& dv);
  // (fold and bring_home: a failing add is a RuntimeError that names the hop.)

  size_t send_bytes(int s) const;
  size_t recv_bytes(int s) const;

 private:
  int source(int s) const { return ((rank_ - s) % world_ + world_) % world_; }
  int64_t rows(int q) const { return plan_.routes().shipped[size_t(q)].size(); }
  TensorView view(int buf, int which) const;  // dK (0) or dV (1) of buffer `buf`, shaped for rows_
  void add_received(int s, const TensorView& dk, const TensorView& dv);  // += exchange s's accumulator
  void* data(int buf) const { return bufs_[buf].get(); }

  Backend& b_;
  FlightRecorder& recorder_;
  const RingPlan& plan_;
  TensorView shape_;
  int rank_, world_;
  int64_t buf_rows_[3] = {0, 0, 0};  // rows of the accumulator each buffer holds
  size_t token_bytes_ = 0;   // dK (or dV) of one token in fp32: batch x kv_heads x dim x 4
  DeviceBuffer bufs_[3];
  int send_ = 0, recv_ = 1, comp_ = 2;
  RingChannel channel_;  // after the buffers: destroyed first
};

}  // namespace ringattn
