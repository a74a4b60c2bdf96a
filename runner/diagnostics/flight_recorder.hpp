// A small flight recorder: the last N hop events of this rank (posted, completed, computed,
// failed), with timestamps, dumped to the log when a run times out or fails, so the message that
// ends a job says what each rank was doing.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ringattn {

enum class HopEvent : uint8_t { Posted, Completed, Computed, Failed };

// Which ring a hop belongs to: the forward's, or the ring backward's (whose K/V and dK/dV
// exchanges share its hop numbers).
enum class RingPhase : uint8_t { Forward, Backward };

struct FlightEvent {
  double t = 0;      // seconds since the recorder started
  int hop = 0;
  RingPhase phase = RingPhase::Forward;
  HopEvent what = HopEvent::Posted;
  int peer = -1;     // the other rank involved (receive source for Completed), -1 when none
  uint64_t bytes = 0;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 64);
  void record(int hop, HopEvent what, int peer = -1, uint64_t bytes = 0);
  // A ring run begins (the runners call it before their first hop): later events belong to
  // `phase`, and pass() counts up, so that an observer (the fault decorators,
  // runner/faults/fault_injection.hpp) knows where one run's hops start even when it posts no exchange.
  void begin_pass(RingPhase phase);
  RingPhase phase() const;
  uint64_t pass() const;
  // Oldest first; at most `capacity` of them.
  std::vector<FlightEvent> events() const;
  // One line per event, oldest first.
  std::string dump() const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::vector<FlightEvent> ring_;
  size_t next_ = 0, count_ = 0;
  RingPhase phase_ = RingPhase::Forward;
  uint64_t pass_ = 0;
  double t0_;
};

// The process-wide recorder the transports and the runner write to.
FlightRecorder& flight_recorder();

const char* hop_event_name(HopEvent e);
const char* ring_phase_name(RingPhase p);  // "forward", "backward"

}  // namespace ringattn
