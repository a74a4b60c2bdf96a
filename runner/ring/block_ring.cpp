#include "runner/ring/block_ring.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/host.hpp"
#include "runner/diagnostics/log.hpp"

namespace ringattn {

// A transport failure, restated with what the ring was doing: the hop, the peers and the bytes
// (the transport knows its own exchange count, not the runner's hop).
void ring_hop_failed(int r, int P, int s, size_t bytes, const char* stage, const std::exception& e) {
  const std::string who = fmt::format("rank {} on {}: ", r, host_name());
  std::string cause = e.what();
  if (cause.rfind(who, 0) == 0) cause.erase(0, who.size());  // said once is enough
  throw RuntimeError(fmt::format("{}hop {} of {}: {} (send {} bytes to rank {}, receive from rank {}) failed: {}", who,
                                 s, P, stage, bytes, (r + 1) % P, (r + P - 1) % P, cause));
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

BlockRing::BlockRing(Backend& b, Transport& t, const TensorView& k, const TensorView& v, const RingPlan& plan,
                     FlightRecorder& recorder)
    : t_(t), recorder_(recorder), k_(k), v_(v), k_layout_(layout_of(k)), v_layout_(layout_of(v)), plan_(plan),
      rank_(t.rank()), world_(t.size()) {
  if (plan.world() != world_)
    fail_arg("rank {}: the block ring's plan is for {} ranks, but the transport has {}", rank_, plan.world(), world_);
  if (plan.layout(rank_).tokens() != k.len || v.len != k.len)
    fail_arg("rank {}: the block ring needs k and v of this rank's {} tokens (got {} rows of k and {} of v)", rank_,
             plan.layout(rank_).tokens(), k.len, v.len);
  if (b.stream() != nullptr) t.set_stream(b.stream());
  if (world_ <= 1) return;  // nothing to send: hop 0 reads k and v in place
  token_bytes_ = size_t(k.batch * k.heads * k.dim) * size_t(dtype_size(k.dtype));
  const size_t capacity = 2 * token_bytes_ * size_t(plan.block_tokens());  // the largest block that travels
  for (DeviceBuffer& blk : blocks_) blk = DeviceBuffer(b, capacity);
  staging_ = staging_for(b, t, capacity);
  const KeyRange mine = travel(rank_);
  if (mine.empty()) return;  // nothing of this rank travels: its block is empty
  pack_block(b, blocks_[0].get(), k.rows(mine.begin, mine.size()));
  pack_block(b, static_cast<char*>(blocks_[0].get()) + token_bytes_ * size_t(mine.size()),
             v.rows(mine.begin, mine.size()));
}

BlockRing::~BlockRing() {
  if (!outstanding_ || exchange().abandon_exchange()) return;
  for (DeviceBuffer& blk : blocks_) blk.release();  // kept, not freed: a transfer may still write them
}

uint64_t BlockRing::post(int hop) {
  const int next = (rank_ + 1) % world_;
  const uint64_t before = t_.bytes_sent();
  const size_t send = send_bytes(hop), recv = recv_bytes(hop);
  recorder_.record(hop, HopEvent::Posted, next, send);
  outstanding_ = true;  // before the call: a partial post counts
  try {
    // Hop 0 sends this rank's packed block; every later hop passes on the block it received.
    if (hop == 0)
      exchange().start_exchange(block(hop), send, block(hop + 1), recv);
    else
      exchange().forward_exchange(block(hop), send, block(hop + 1), recv);
  } catch (const std::exception& e) {
    recorder_.record(hop, HopEvent::Failed, next, send);
    ring_hop_failed(rank_, world_, hop, send, "posting the exchange", e);
  }
  return t_.bytes_sent() - before;
}

void BlockRing::complete(int hop) {
  const int prev = (rank_ + world_ - 1) % world_;
  try {
    exchange().wait_exchange();
  } catch (const std::exception& e) {
    recorder_.record(hop, HopEvent::Failed, prev);
    ring_hop_failed(rank_, world_, hop, send_bytes(hop), "waiting for the exchange", e);
  }
  outstanding_ = false;
  recorder_.record(hop, HopEvent::Completed, prev, recv_bytes(hop));
}

TensorView BlockRing::shaped(const TensorView& x, int hop) const {
  TensorView s = x;
  s.len = travel(source(hop)).size();
  return s;
}

TensorView BlockRing::k(int hop) const { return hop == 0 ? k_ : block_view(block(hop), shaped(k_, hop), k_layout_); }

TensorView BlockRing::v(int hop) const {
  if (hop == 0) return v_;
  const TensorView shape = shaped(v_, hop);
  return block_view(static_cast<char*>(block(hop)) + token_bytes_ * size_t(shape.len), shape, v_layout_);
}

}  // namespace ringattn
