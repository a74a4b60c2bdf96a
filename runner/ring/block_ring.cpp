#include "runner/ring/block_ring.hpp"

#include "core/error.hpp"

namespace ringattn {

BlockRing::BlockRing(Backend& b, Transport& t, const TensorView& k, const TensorView& v, const RingPlan& plan,
                     FlightRecorder& recorder)
    : k_(k), v_(v), k_layout_(layout_of(k)), v_layout_(layout_of(v)), plan_(plan), rank_(t.rank()), world_(t.size()),
      channel_(t, recorder, "exchange") {
  if (plan.world() != world_)
    fail_arg("rank {}: the block ring's plan is for {} ranks, but the transport has {}", rank_, plan.world(), world_);
  if (plan.layout(rank_).tokens() != k.len || v.len != k.len)
    fail_arg("rank {}: the block ring needs k and v of this rank's {} tokens (got {} rows of k and {} of v)", rank_,
             plan.layout(rank_).tokens(), k.len, v.len);
  channel_.order_after(b);
  if (world_ <= 1) return;  // nothing to send: hop 0 reads k and v in place
  token_bytes_ = size_t(k.batch * k.heads * k.dim) * size_t(dtype_size(k.dtype));
  const size_t capacity = 2 * token_bytes_ * size_t(plan.block_tokens());  // the largest block that travels
  for (DeviceBuffer& blk : blocks_) blk = DeviceBuffer(b, capacity);
  channel_.stage(b, capacity);
  const KeyRange mine = travel(rank_);
  if (mine.empty()) return;  // nothing of this rank travels: its block is empty
  pack_block(b, blocks_[0].get(), k.rows(mine.begin, mine.size()), k_layout_);
  pack_block(b, static_cast<char*>(blocks_[0].get()) + token_bytes_ * size_t(mine.size()),
             v.rows(mine.begin, mine.size()), v_layout_);
}

BlockRing::~BlockRing() {
  if (channel_.end()) return;
  for (DeviceBuffer& blk : blocks_) blk.release();  // kept, not freed: a transfer may still write them
}

// Hop 0 sends this rank's packed block; every later hop passes on the block it received.
uint64_t BlockRing::post(int hop) {
  return channel_.post(hop, block(hop), send_bytes(hop), block(hop + 1), recv_bytes(hop), hop > 0);
}

void BlockRing::complete(int hop) { channel_.complete(hop, send_bytes(hop), recv_bytes(hop)); }

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
