#include "runner/faults/fault_injection.hpp"

#include <chrono>
#include <cstdlib>
#include <new>
#include <thread>

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

FaultInjectingTransport::FaultInjectingTransport(std::unique_ptr<Transport> inner, const FaultPlan& plan)
    : ForwardingTransport(*inner), owned_(std::move(inner)), plan_(plan), tracker_(std::make_shared<HopTracker>()) {}

bool FaultInjectingTransport::inject(int hop) {
  const int r = rank();
  const RingPhase ph = tracker_->phase;
  if (plan_.fires(FaultKind::Exit, r, hop, ph)) {
    spdlog::warn("injected fault ({}): rank {} exits at hop {} of the {} ring", plan_.text(), r, hop,
                 ring_phase_name(ph));
    spdlog::default_logger()->flush();
    std::_Exit(3);
  }
  if (plan_.fires(FaultKind::Hang, r, hop, ph)) {
    spdlog::warn("injected fault ({}): rank {} stops posting at hop {} of the {} ring and hangs", plan_.text(), r,
                 hop, ring_phase_name(ph));
    spdlog::default_logger()->flush();
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  // An injected error stands for a transport that fails to post.
  if (plan_.fires(FaultKind::Error, r, hop, ph)) fail_runtime("injected transport error ({})", plan_.text());
  // An injected corrupt block is short (both sides halved), which the receiving rank must detect.
  return plan_.fires(FaultKind::Corrupt, r, hop, ph);
}

void FaultInjectingTransport::start_exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
  tracker_->follow(flight_recorder());
  tracker_->posted = 0;  // a new pass of the ring
  tracker_->in_flight = true;
  const bool shorten = inject(0);
  ForwardingTransport::start_exchange(send, shorten ? send_bytes / 2 : send_bytes, recv,
                                      shorten ? recv_bytes / 2 : recv_bytes);
}

void FaultInjectingTransport::forward_exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
  tracker_->follow(flight_recorder());
  const int hop = ++tracker_->posted;
  tracker_->in_flight = true;
  const bool shorten = inject(hop);
  ForwardingTransport::forward_exchange(send, shorten ? send_bytes / 2 : send_bytes, recv,
                                        shorten ? recv_bytes / 2 : recv_bytes);
}

void FaultInjectingTransport::wait_exchange() {
  try {
    ForwardingTransport::wait_exchange();
  } catch (const std::exception&) {
    // A rank that injected a short block also fails its own receive (it expects the short size);
    // it gives the receiver, whose report is the one under test, time to speak first.
    if (plan_.fires(FaultKind::Corrupt, rank(), tracker_->posted, tracker_->phase)) std::this_thread::sleep_for(std::chrono::seconds(2));
    throw;
  }
  tracker_->in_flight = false;
}

bool FaultInjectingTransport::abandon_exchange() noexcept {
  const bool ended = ForwardingTransport::abandon_exchange();
  if (ended) tracker_->in_flight = false;
  return ended;
}

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<Backend> inner, const FaultPlan& plan, int rank,
                                             std::shared_ptr<HopTracker> tracker)
    : ForwardingBackend(*inner), owned_(std::move(inner)), plan_(plan), rank_(rank), tracker_(std::move(tracker)) {}

void FaultInjectingBackend::maybe_throw(RingPhase phase) const {
  if (plan_.kind != FaultKind::Throw || plan_.rank != rank_ || plan_.phase != phase) return;
  tracker_->follow(flight_recorder());
  if (tracker_->phase == phase && tracker_->computing() == plan_.hop) throw std::bad_alloc();
}

void FaultInjectingBackend::flash(const FlashParams& p) {
  maybe_throw(RingPhase::Forward);
  ForwardingBackend::flash(p);
}

void FaultInjectingBackend::flash_backward(const BackwardParams& p) {
  maybe_throw(RingPhase::Backward);
  ForwardingBackend::flash_backward(p);
}

void install_fault_injection(std::unique_ptr<Transport>& t, std::unique_ptr<Backend>& b, const FaultPlan& plan) {
  if (!plan.active()) return;
  const int rank = t->rank();
  auto faulty = std::make_unique<FaultInjectingTransport>(std::move(t), plan);
  b = std::make_unique<FaultInjectingBackend>(std::move(b), plan, rank, faulty->tracker());
  t = std::move(faulty);
}

}  // namespace ringattn
