#include "runner/ring/ring_channel.hpp"

#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/host.hpp"

namespace ringattn {

// A transport failure, restated with what the ring was doing: the hop, the peers and the bytes
// (the transport knows its own exchange count, not the runner's hop).
void ring_hop_failed(int r, int P, int s, size_t bytes, const char* stage, const std::exception& e) {
  const std::string who = fmt::format("rank {} on {}: ", r, host_name());
  std::string cause = e.what();
  if (cause.rfind(who, 0) == 0) cause.erase(0, who.size());  // said once is enough
  throw RuntimeError(fmt::format("{}hop {} of the {}-rank ring: {} (send {} bytes to rank {}, receive from rank {}) "
                                 "failed: {}", who, s, P, stage, bytes, (r + 1) % P, (r + P - 1) % P, cause));
}

std::unique_ptr<StagingTransport> staging_for(Backend& b, Transport& t, size_t capacity) {
  if (!b.device_memory() || t.accepts_device_memory()) return nullptr;
  DeviceCopies copies{[&b](void* host, const void* dev, size_t n) { b.copy_to_host(host, dev, n); },
                      [&b](void* dev, const void* host, size_t n) {
                        b.copy_from_host(dev, host, n);
                        b.synchronize();
                      },
                      [&b](size_t n) { return b.allocate_host(n); }, [&b](void* p) { b.free_host(p); }};
  return std::make_unique<StagingTransport>(t, std::move(copies), capacity);
}

RingChannel::RingChannel(Transport& t, FlightRecorder& recorder, const char* what)
    : t_(t), recorder_(recorder), posting_(fmt::format("posting the {}", what)),
      waiting_(fmt::format("waiting for the {}", what)), rank_(t.rank()), world_(t.size()) {}

uint64_t RingChannel::post(int hop, const void* send, size_t send_bytes, void* recv, size_t recv_bytes, bool forward) {
  const int next = (rank_ + 1) % world_;
  const uint64_t before = t_.bytes_sent();
  recorder_.record(hop, HopEvent::Posted, next, send_bytes);
  outstanding_ = true;  // before the call: a partial post counts
  try {
    if (forward)
      exchange().forward_exchange(send, send_bytes, recv, recv_bytes);
    else
      exchange().start_exchange(send, send_bytes, recv, recv_bytes);
  } catch (const std::exception& e) {
    recorder_.record(hop, HopEvent::Failed, next, send_bytes);
    ring_hop_failed(rank_, world_, hop, send_bytes, posting_.c_str(), e);
  }
  return t_.bytes_sent() - before;
}

void RingChannel::complete(int hop, size_t send_bytes, size_t recv_bytes) {
  const int prev = (rank_ + world_ - 1) % world_;
  try {
    exchange().wait_exchange();
  } catch (const std::exception& e) {
    recorder_.record(hop, HopEvent::Failed, prev);
    ring_hop_failed(rank_, world_, hop, send_bytes, waiting_.c_str(), e);
  }
  outstanding_ = false;
  recorder_.record(hop, HopEvent::Completed, prev, recv_bytes);
}

}  // namespace ringattn
