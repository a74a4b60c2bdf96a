#include "runner/faults/fault_injection.hpp"

#include <chrono>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/error.hpp"

namespace ringattn {

void HopTracker::follow(const FlightRecorder& r) {
  if (r.pass() == pass) return;
  pass = r.pass();
  phase = r.phase();
  posted = -1;
  in_flight = false;
}

FaultInjectingTransport::FaultInjectingTransport(std::unique_ptr<Transport> inner, const FaultPlan& plan,
                                                 std::shared_ptr<HopTracker> tracker, FaultedRing ring)
    : ForwardingTransport(*inner), owned_(std::move(inner)), plan_(plan), tracker_(std::move(tracker)), ring_(ring) {}

int FaultInjectingTransport::next_hop(bool first) {
  tracker_->follow(flight_recorder());
  if (ring_ == FaultedRing::Blocks) {
    in_ring_ = true;
    phase_ = tracker_->phase == RingPhase::Backward ? FaultPhase::Backward : FaultPhase::Forward;
    hop_ = first ? 0 : tracker_->posted + 1;  // a started exchange begins a pass of the ring
    tracker_->posted = hop_;
    tracker_->in_flight = true;
    return hop_;
  }
  // The dK/dV ring runs in the ring backward only, and GradRing::post records the hop it posts
  // just before it posts.
  const std::vector<FlightEvent> ev = flight_recorder().events();
  in_ring_ = tracker_->phase == RingPhase::Backward && !ev.empty() && ev.back().what == HopEvent::Posted;
  phase_ = FaultPhase::Grads;
  hop_ = in_ring_ ? ev.back().hop : -1;
  tracker_->grads_posted = hop_;
  return hop_;
}

bool FaultInjectingTransport::inject(int hop) {
  if (!in_ring_) return false;
  const int r = rank();
  const FaultPhase ph = phase_;
  if (plan_.fires(FaultKind::Exit, r, hop, ph)) {
    spdlog::warn("injected fault ({}): rank {} exits at hop {} of the {} ring", plan_.text(), r, hop,
                 fault_phase_name(ph));
    spdlog::default_logger()->flush();
    std::_Exit(3);
  }
  if (plan_.fires(FaultKind::Hang, r, hop, ph)) {
    spdlog::warn("injected fault ({}): rank {} stops posting at hop {} of the {} ring and hangs", plan_.text(), r,
                 hop, fault_phase_name(ph));
    spdlog::default_logger()->flush();
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  // An injected error stands for a transport that fails to post.
  if (plan_.fires(FaultKind::Error, r, hop, ph)) fail_runtime("injected transport error ({})", plan_.text());
  // An injected corrupt block is short (both sides halved), which the receiving rank must detect.
  return plan_.fires(FaultKind::Corrupt, r, hop, ph);
}

void FaultInjectingTransport::start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                                                  size_t recv_bytes) {
  const bool shorten = inject(next_hop(true));
  ForwardingTransport::start_peer_exchange(to, send, shorten ? send_bytes / 2 : send_bytes, from, recv,
                                           shorten ? recv_bytes / 2 : recv_bytes);
}

void FaultInjectingTransport::forward_peer_exchange(int to, const void* send, size_t send_bytes, int from,
                                                    void* recv, size_t recv_bytes) {
  const bool shorten = inject(next_hop(false));
  ForwardingTransport::forward_peer_exchange(to, send, shorten ? send_bytes / 2 : send_bytes, from, recv,
                                             shorten ? recv_bytes / 2 : recv_bytes);
}

void FaultInjectingTransport::wait_exchange() {
  try {
    ForwardingTransport::wait_exchange();
  } catch (const std::exception&) {
    // A rank that injected a short block also fails its own receive (it expects the short size);
    // it gives the receiver, whose report is the one under test, time to speak first.
    if (in_ring_ && plan_.fires(FaultKind::Corrupt, rank(), hop_, phase_))
      std::this_thread::sleep_for(std::chrono::seconds(2));
    throw;
  }
  if (ring_ == FaultedRing::Blocks) tracker_->in_flight = false;
}

bool FaultInjectingTransport::abandon_exchange() noexcept {
  const bool ended = ForwardingTransport::abandon_exchange();
  if (ended && ring_ == FaultedRing::Blocks) tracker_->in_flight = false;
  return ended;
}

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<Backend> inner, const FaultPlan& plan, int rank,
                                             std::shared_ptr<HopTracker> tracker)
    : ForwardingBackend(*inner), owned_(std::move(inner)), plan_(plan), rank_(rank), tracker_(std::move(tracker)) {}

void FaultInjectingBackend::maybe_throw(FaultPhase phase) const {
  if (plan_.kind != FaultKind::Throw || plan_.rank != rank_ || plan_.phase != phase) return;
  tracker_->follow(flight_recorder());
  const bool backward = tracker_->phase == RingPhase::Backward;
  // A grads plan's add: the fold of the accumulator that the hop's dK/dV exchange received.
  const int hop = phase == FaultPhase::Grads ? tracker_->grads_posted : tracker_->computing();
  if (backward == (phase != FaultPhase::Forward) && hop == plan_.hop) throw std::bad_alloc();
}

void FaultInjectingBackend::flash(const FlashParams& p) {
  maybe_throw(FaultPhase::Forward);
  ForwardingBackend::flash(p);
}

void FaultInjectingBackend::flash_backward(const BackwardParams& p) {
  maybe_throw(FaultPhase::Backward);
  ForwardingBackend::flash_backward(p);
}

void FaultInjectingBackend::add_f32(const TensorView& dst, const TensorView& src) {
  maybe_throw(FaultPhase::Grads);
  ForwardingBackend::add_f32(dst, src);
}

std::shared_ptr<HopTracker> install_fault_injection(std::unique_ptr<Transport>& t, std::unique_ptr<Backend>& b,
                                                    const FaultPlan& plan) {
  if (!plan.active()) return nullptr;
  const int rank = t->rank();
  auto tracker = std::make_shared<HopTracker>();
  t = std::make_unique<FaultInjectingTransport>(std::move(t), plan, tracker, FaultedRing::Blocks);
  b = std::make_unique<FaultInjectingBackend>(std::move(b), plan, rank, tracker);
  return tracker;
}

void install_grad_fault_injection(std::unique_ptr<Transport>& grad_t, const std::shared_ptr<HopTracker>& tracker,
                                  const FaultPlan& plan) {
  if (!plan.active() || !tracker) return;
  grad_t = std::make_unique<FaultInjectingTransport>(std::move(grad_t), plan, tracker, FaultedRing::Grads);
}

}  // namespace ringattn
