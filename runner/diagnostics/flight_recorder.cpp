#include "runner/diagnostics/flight_recorder.hpp"

#include <chrono>

#include <fmt/format.h>

namespace ringattn {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

const char* hop_event_name(HopEvent e) {
  switch (e) {
    case HopEvent::Posted: return "posted";
    case HopEvent::Completed: return "completed";
    case HopEvent::Computed: return "computed";
    case HopEvent::Failed: return "failed";
  }
  return "?";
}

const char* ring_phase_name(RingPhase p) { return p == RingPhase::Backward ? "backward" : "forward"; }

FlightRecorder::FlightRecorder(size_t capacity) : ring_(capacity ? capacity : 1), t0_(now_s()) {}

void FlightRecorder::record(int hop, HopEvent what, int peer, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ring_[next_] = FlightEvent{now_s() - t0_, hop, phase_, what, peer, bytes};
  next_ = (next_ + 1) % ring_.size();
  if (count_ < ring_.size()) ++count_;
}

void FlightRecorder::begin_pass(RingPhase phase) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  ++pass_;
}

RingPhase FlightRecorder::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

uint64_t FlightRecorder::pass() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pass_;
}

std::vector<FlightEvent> FlightRecorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightEvent> out;
  out.reserve(count_);
  const size_t first = (next_ + ring_.size() - count_) % ring_.size();
  for (size_t i = 0; i < count_; ++i) out.push_back(ring_[(first + i) % ring_.size()]);
  return out;
}

std::string FlightRecorder::dump() const {
  std::string s;
  for (const FlightEvent& e : events()) {
    s += fmt::format("  t={:.6f}s {}hop {} {}", e.t, e.phase == RingPhase::Backward ? "backward " : "", e.hop,
                     hop_event_name(e.what));
    if (e.peer >= 0) s += fmt::format(" peer {}", e.peer);
    if (e.bytes) s += fmt::format(" {} bytes", e.bytes);
    s += '\n';
  }
  return s;
}

void FlightRecorder::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  next_ = count_ = 0;
}

FlightRecorder& flight_recorder() {
  static FlightRecorder r(64);
  return r;
}

}  // namespace ringattn
