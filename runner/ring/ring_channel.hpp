// One ring's recorded channel over a Transport, written once for the K/V block ring
// (block_ring.hpp) and the ring backward's dK/dV ring (grad_ring.hpp): it posts hop s's exchange
// (the ring hop of the transport: to rank r + 1, from rank r - 1) and completes it, writes the
// flight recorder's events, restates transport failures with the hop, stages device buffers
// through host memory when the transport cannot take them (StagingTransport), and owns the error
// path: an exchange still outstanding when the ring ends is ended (Transport::abandon_exchange)
// before the owner frees its buffers, and end() says when the owner must keep them instead.
//
// The owner holds its buffers before the channel (so the channel, with its staging, is destroyed
// first) and calls end() from its destructor. A Transport runs one exchange at a time, and a
// forwarded exchange assumes the transport's previous exchange was this channel's, so each
// channel needs a Transport of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "comm/staging_transport.hpp"
#include "kernels/backend.hpp"
#include "runner/diagnostics/flight_recorder.hpp"

namespace ringattn {

// A transport failure at hop `hop` of rank `rank` (posting or waiting: `stage`), restated as a
// RuntimeError naming the rank, its host, the hop, the peers and the bytes.
[[noreturn]] void ring_hop_failed(int rank, int world, int hop, size_t bytes, const char* stage,
                                  const std::exception& e);

// Host staging over `t` for device buffers of up to `capacity` bytes when `b`'s memory is a
// device's and `t` cannot take device pointers; null otherwise.
std::unique_ptr<StagingTransport> staging_for(Backend& b, Transport& t, size_t capacity);

class RingChannel {
 public:
  // `what` names the exchange in failures ("exchange": "posting the exchange", "waiting for the
  // exchange").
  RingChannel(Transport& t, FlightRecorder& recorder, const char* what);
  RingChannel(const RingChannel&) = delete;
  RingChannel& operator=(const RingChannel&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  // Orders device-side exchanges after `b`'s stream (Transport::set_stream), when it has one.
  void order_after(Backend& b) {
    if (b.stream() != nullptr) t_.set_stream(b.stream());
  }
  // Stages exchanges of up to `capacity` bytes through host memory when they need it (staging_for).
  void stage(Backend& b, size_t capacity) { staging_ = staging_for(b, t_, capacity); }
  // Posts hop `hop`'s exchange; `forward`: `send` is the previous exchange's `recv`, unchanged
  // (Transport::forward_exchange). Returns the bytes the transport sent. Failures name the hop.
  uint64_t post(int hop, const void* send, size_t send_bytes, void* recv, size_t recv_bytes, bool forward);
  // Completes hop `hop`'s exchange (the sizes are the ones it was posted with, for the recorder
  // and the failure).
  void complete(int hop, size_t send_bytes, size_t recv_bytes);
  // The transport's measure of the last completed exchange (-1: unknown).
  double last_exchange_seconds() const { return exchange().last_exchange_seconds(); }
  // The error path, from the owner's destructor: ends an outstanding exchange. True when the
  // owner may free the exchange's buffers; false when the transport gave up, and then it must
  // keep them allocated for good (a transfer may still touch them).
  bool end() noexcept { return !outstanding_ || exchange().abandon_exchange(); }

 private:
  Transport& exchange() const { return staging_ ? *staging_ : t_; }

  Transport& t_;
  FlightRecorder& recorder_;
  std::string posting_, waiting_;  // the stages of failures
  int rank_, world_;
  std::unique_ptr<StagingTransport> staging_;
  bool outstanding_ = false;  // posting started and no wait returned yet
};

}  // namespace ringattn
