#include "ringattn/block_ring.hpp"

#include <string>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/host.hpp"
#include "ringattn/log.hpp"

namespace ringattn {
namespace {

// A transport failure, restated with what the ring was doing: the hop, the peers and the bytes
// (the transport knows its own exchange count, not the runner's hop).
[[noreturn]] void hop_failed(int r, int P, int s, size_t bytes, const char* stage, const std::exception& e) {
  const std::string who = fmt::format("rank {} on {}: ", r, host_name());
  std::string cause = e.what();
  if (cause.rfind(who, 0) == 0) cause.erase(0, who.size());  // said once is enough
  throw RuntimeError(fmt::format("{}hop {} of {}: {} (send {} bytes to rank {}, receive from rank {}) failed: {}", who,
                                 s, P, stage, bytes, (r + 1) % P, (r + P - 1) % P, cause));
}

}  // namespace

BlockRing::BlockRing(Backend& b, Transport& t, const TensorView& k, const TensorView& v, FlightRecorder& recorder)
    : t_(t), recorder_(recorder), k_(k), v_(v), k_layout_(layout_of(k)), v_layout_(layout_of(v)), rank_(t.rank()),
      world_(t.size()) {
  if (b.stream() != nullptr) t.set_stream(b.stream());
  if (world_ <= 1) return;  // nothing to send: hop 0 reads k and v in place
  const size_t es = size_t(dtype_size(k.dtype));
  k_bytes_ = size_t(block_elems(k)) * es;
  block_bytes_ = 2 * k_bytes_;
  for (DeviceBuffer& blk : blocks_) blk = DeviceBuffer(b, block_bytes_);
  if (b.device_memory() && !t.accepts_device_memory()) {
    DeviceCopies copies{[&b](void* host, const void* dev, size_t n) { b.copy_to_host(host, dev, n); },
                        [&b](void* dev, const void* host, size_t n) {
                          b.copy_from_host(dev, host, n);
                          b.synchronize();
                        }};
    staging_ = std::make_unique<StagingTransport>(t, std::move(copies), block_bytes_);
  }
  pack_block(b, blocks_[0].get(), k);
  pack_block(b, static_cast<char*>(blocks_[0].get()) + k_bytes_, v);
}

BlockRing::~BlockRing() {
  if (!outstanding_ || exchange().abandon_exchange()) return;
  for (DeviceBuffer& blk : blocks_) blk.release();  // kept, not freed: a transfer may still write them
}

uint64_t BlockRing::post(int hop) {
  const int next = (rank_ + 1) % world_;
  const uint64_t before = t_.bytes_sent();
  recorder_.record(hop, HopEvent::Posted, next, block_bytes_);
  outstanding_ = true;  // before the call: a partial post counts
  try {
    // Hop 0 sends this rank's packed block; every later hop passes on the block it received.
    if (hop == 0)
      exchange().start_exchange(block(hop), block(hop + 1), block_bytes_);
    else
      exchange().forward_exchange(block(hop), block(hop + 1), block_bytes_);
  } catch (const std::exception& e) {
    recorder_.record(hop, HopEvent::Failed, next, block_bytes_);
    hop_failed(rank_, world_, hop, block_bytes_, "posting the exchange", e);
  }
  return t_.bytes_sent() - before;
}

void BlockRing::complete(int hop) {
  const int prev = (rank_ + world_ - 1) % world_;
  try {
    exchange().wait_exchange();
  } catch (const std::exception& e) {
    recorder_.record(hop, HopEvent::Failed, prev);
    hop_failed(rank_, world_, hop, block_bytes_, "waiting for the exchange", e);
  }
  outstanding_ = false;
  recorder_.record(hop, HopEvent::Completed, prev, block_bytes_);
}

TensorView BlockRing::k(int hop) const { return hop == 0 ? k_ : block_view(block(hop), k_, k_layout_); }

TensorView BlockRing::v(int hop) const {
  return hop == 0 ? v_ : block_view(static_cast<char*>(block(hop)) + k_bytes_, v_, v_layout_);
}

}  // namespace ringattn
