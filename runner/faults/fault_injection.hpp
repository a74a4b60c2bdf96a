// RINGATTN_FAULT (runner/faults/fault.hpp) carried out by decorators, so that the ring runner holds no
// test-only code: a transport decorator that follows the ring's hops and injects exit, hang,
// corrupt and error when the faulty rank posts the faulty hop, and a backend decorator that
// throws from the flash (forward) or flash_backward (backward) calls of the faulty hop, or from
// the add_f32 that folds the dK/dV accumulator received at it (grads). On the K/V transport,
// a started exchange (start_peer_exchange) begins a pass at hop 0 and each forwarded one
// (forward_peer_exchange) is the next hop; on the ring backward's dK/dV transport every exchange is
// a started one, whose hop is the one the
// GradRing recorded as posted just before (the flight recorder's newest event). The flight
// recorder's passes say which ring, forward or backward, a hop belongs to. The CLI
// (cli/world.cpp) installs them with install_fault_injection and, on the dK/dV transport when
// it makes it, install_grad_fault_injection; the MPI test driver the first only.
#pragma once

#include <memory>

#include "comm/forwarding_transport.hpp"
#include "kernels/forwarding_backend.hpp"
#include "runner/faults/fault.hpp"
#include "runner/diagnostics/flight_recorder.hpp"

namespace ringattn {

// Where the rings of one rank are, as its transports saw them; shared by the decorators. It
// follows the flight recorder's passes (FlightRecorder::begin_pass): each ring run starts at hop 0
// with nothing posted, in the recorder's phase (forward or backward).
struct HopTracker {
  uint64_t pass = 0;       // the recorder's pass this state belongs to
  RingPhase phase = RingPhase::Forward;
  int posted = -1;         // the hop whose exchange was posted last in this pass (-1: none yet)
  bool in_flight = false;  // that exchange has not completed
  int grads_posted = -1;   // the dK/dV exchange posted last in this pass (-1: none yet)
  // Starts over when the recorder began a new pass since the last call.
  void follow(const FlightRecorder& r);
  // The hop whose compute runs now: every hop posts its exchange (if any) before computing and
  // completes it after, so the hop whose exchange is in flight, else the one after the last
  // completed (the last hop, which posts none; hop 0 of a ring without exchanges).
  int computing() const { return in_flight ? posted : posted + 1; }
};

// Which ring a decorated transport carries: the K/V blocks (forward and backward) or the ring
// backward's dK/dV accumulators.
enum class FaultedRing : uint8_t { Blocks, Grads };

class FaultInjectingTransport final : public ForwardingTransport {
 public:
  FaultInjectingTransport(std::unique_ptr<Transport> inner, const FaultPlan& plan,
                          std::shared_ptr<HopTracker> tracker, FaultedRing ring);
  void start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                           size_t recv_bytes) override;
  void forward_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                             size_t recv_bytes) override;
  void wait_exchange() override;
  bool abandon_exchange() noexcept override;

 private:
  // The hop a post on this transport belongs to, after tracker_->follow; records it.
  int next_hop(bool first);
  // Exit, hang, error and corrupt at posting time.
  bool inject(int hop);  // exit, hang or throw as planned; true when this hop's block is to be shortened

  std::unique_ptr<Transport> owned_;  // what the base forwards to
  FaultPlan plan_;
  std::shared_ptr<HopTracker> tracker_;
  FaultedRing ring_;
  FaultPhase phase_ = FaultPhase::Forward;  // the ring of the last post (in_ring_ false: none)
  bool in_ring_ = false;
  int hop_ = -1;  // the hop of the last post
};

class FaultInjectingBackend final : public ForwardingBackend {
 public:
  FaultInjectingBackend(std::unique_ptr<Backend> inner, const FaultPlan& plan, int rank,
                        std::shared_ptr<HopTracker> tracker);
  void flash(const FlashParams& p) override;                  // throws at a forward plan's hop
  void flash_backward(const BackwardParams& p) override;  // throws at a backward plan's hop
  void add_f32(const TensorView& dst, const TensorView& src) override;  // throws at a grads plan's hop

 private:
  void maybe_throw(FaultPhase phase) const;

  std::unique_ptr<Backend> owned_;  // what the base forwards to
  FaultPlan plan_;
  int rank_;
  std::shared_ptr<HopTracker> tracker_;
};

// Wraps `t` (the K/V ring's transport) and `b` in the fault decorators when `plan` names a fault;
// leaves them otherwise. Returns the tracker the decorators share (nullptr when none).
std::shared_ptr<HopTracker> install_fault_injection(std::unique_ptr<Transport>& t, std::unique_ptr<Backend>& b,
                                                    const FaultPlan& plan = fault_plan());
// Wraps `grad_t`, the ring backward's dK/dV transport over the same ranks, in the fault decorator
// when `plan` names a fault; `tracker` is what install_fault_injection returned for the same plan
// (nullptr: nothing is installed).
void install_grad_fault_injection(std::unique_ptr<Transport>& grad_t, const std::shared_ptr<HopTracker>& tracker,
                                  const FaultPlan& plan = fault_plan());

}  // namespace ringattn
