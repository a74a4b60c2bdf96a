// RINGATTN_FAULT (runner/faults/fault.hpp) carried out by decorators, so that the ring runner holds no
// test-only code: a transport decorator that follows the ring's hops (start_exchange begins a
// pass at hop 0, each forward_exchange is the next hop; the flight recorder's passes say which ring,
// forward or backward, a hop belongs to) and injects exit, hang, corrupt and error
// when the faulty rank posts the faulty hop, and a backend decorator that throws from the flash
// (forward) or flash_backward (backward) calls of the faulty hop (throw). The CLI (cli/world.cpp) and the MPI test driver install
// them with install_fault_injection.
#pragma once

#include <memory>

#include "comm/forwarding_transport.hpp"
#include "kernels/forwarding_backend.hpp"
#include "runner/faults/fault.hpp"

namespace ringattn {

// Where the ring of one rank is, as its transport saw it; shared by the two decorators. It
// follows the flight recorder's passes (FlightRecorder::begin_pass): each ring run starts at hop 0
// with nothing posted, in the recorder's phase (forward or backward).
struct HopTracker {
  uint64_t pass = 0;       // the recorder's pass this state belongs to
  RingPhase phase = RingPhase::Forward;
  int posted = -1;         // the hop whose exchange was posted last in this pass (-1: none yet)
  bool in_flight = false;  // that exchange has not completed
  // Starts over when the recorder began a new pass since the last call.
  void follow(const FlightRecorder& r);
  // The hop whose compute runs now: every hop posts its exchange (if any) before computing and
  // completes it after, so the hop whose exchange is in flight, else the one after the last
  // completed (the last hop, which posts none; hop 0 of a ring without exchanges).
  int computing() const { return in_flight ? posted : posted + 1; }
};

class FaultInjectingTransport final : public ForwardingTransport {
 public:
  FaultInjectingTransport(std::unique_ptr<Transport> inner, const FaultPlan& plan);
  void start_exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) override;
  void forward_exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) override;
  void wait_exchange() override;
  bool abandon_exchange() noexcept override;
  std::shared_ptr<HopTracker> tracker() const { return tracker_; }

 private:
  // Exit, hang, error and corrupt at posting time; returns the bytes to send.
  bool inject(int hop);  // exit, hang or throw as planned; true when this hop's block is to be shortened

  std::unique_ptr<Transport> owned_;  // what the base forwards to
  FaultPlan plan_;
  std::shared_ptr<HopTracker> tracker_;
};

class FaultInjectingBackend final : public ForwardingBackend {
 public:
  FaultInjectingBackend(std::unique_ptr<Backend> inner, const FaultPlan& plan, int rank,
                        std::shared_ptr<HopTracker> tracker);
  void flash(const FlashParams& p) override;                  // throws at a forward plan's hop
  void flash_backward(const BackwardParams& p) override;  // throws at a backward plan's hop

 private:
  void maybe_throw(RingPhase phase) const;

  std::unique_ptr<Backend> owned_;  // what the base forwards to
  FaultPlan plan_;
  int rank_;
  std::shared_ptr<HopTracker> tracker_;
};

// Wraps `t` and `b` in the fault decorators when `plan` names a fault; leaves them otherwise.
void install_fault_injection(std::unique_ptr<Transport>& t, std::unique_ptr<Backend>& b,
                             const FaultPlan& plan = fault_plan());

}  // namespace ringattn
