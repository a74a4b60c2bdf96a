#include "runner/ring/grad_ring.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "core/host.hpp"

namespace ringattn {
GradRing::GradRing(Backend& b, Transport& t, const TensorView& shape, const RingPlan& plan, FlightRecorder& recorder)
    : b_(b), recorder_(recorder), plan_(plan), shape_(shape), rank_(t.rank()), world_(t.size()),
      channel_(t, recorder, "dK/dV exchange") {
  if (plan.world() != world_)
    fail_arg("rank {}: the dK/dV ring's plan is for {} ranks, but the transport has {}", rank_, plan.world(), world_);
  channel_.order_after(b);
  if (world_ <= 1) return;
  token_bytes_ = size_t(shape.batch * shape.heads * shape.dim) * sizeof(float);
  const size_t capacity = 2 * token_bytes_ * size_t(plan.block_tokens());  // the largest accumulator
  for (DeviceBuffer& buf : bufs_) buf = DeviceBuffer(b, capacity);
  channel_.stage(b, capacity);
}

GradRing::~GradRing() {
  if (channel_.end()) return;
  for (DeviceBuffer& buf : bufs_) buf.release();  // kept, not freed: a transfer may still write them
}

size_t GradRing::send_bytes(int s) const {
  return plan_.grad_sends(rank_, s) ? 2 * token_bytes_ * size_t(rows(source(s - 1))) : 0;
}

size_t GradRing::recv_bytes(int s) const {
  return plan_.grad_receives(rank_, s) ? 2 * token_bytes_ * size_t(rows(source(s))) : 0;
}

uint64_t GradRing::post(int s) { return channel_.post(s, data(send_), send_bytes(s), data(recv_), recv_bytes(s), false); }

void GradRing::complete(int s) {
  channel_.complete(s, send_bytes(s), recv_bytes(s));
  if (recv_bytes(s) > 0) buf_rows_[recv_] = rows(source(s));
}

TensorView GradRing::view(int buf, int which) const {
  const int64_t n = buf_rows_[buf];
  return bhtd_view(static_cast<char*>(data(buf)) + size_t(which) * token_bytes_ * size_t(n), DType::F32, shape_.batch,
                   shape_.heads, n, shape_.dim);
}

void GradRing::begin_compute(int s) {
  buf_rows_[comp_] = rows(source(s));
  b_.zero_f32(dk());
  b_.zero_f32(dv());
}

void GradRing::fold(int s, bool computed) {
  const bool received = recv_bytes(s) > 0;
  if (computed && received) add_received(s, view(comp_, 0), view(comp_, 1));
  if (computed)
    std::swap(send_, comp_);
  else if (received)
    std::swap(send_, recv_);
}

void GradRing::bring_home(const TensorView& dk, const TensorView& dv) {
  if (recv_bytes(world_) == 0) return;
  const KeyRange home = plan_.routes().shipped[size_t(rank_)];
  add_received(world_, dk.rows(home.begin, home.size()), dv.rows(home.begin, home.size()));
}

void GradRing::add_received(int s, const TensorView& dk, const TensorView& dv) {
  try {
    b_.add_f32(dk, view(recv_, 0));
    b_.add_f32(dv, view(recv_, 1));
  } catch (const InvalidArgument&) {
    throw;  // a bad call: the same on every rank
  } catch (const std::exception& e) {
    recorder_.record(s, HopEvent::Failed, source(s));
    fail_runtime("rank {} on {}: hop {} of the {}-rank ring: adding the received dK/dV accumulator of the block of "
                 "rank {} failed: {}",
                 rank_, host_name(), s, world_, source(s), e.what());
  }
}

}  // namespace ringattn
