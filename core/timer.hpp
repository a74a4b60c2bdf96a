// Wall-clock timing on the steady clock: every duration the runtime reports or bounds a wait by.
#pragma once

#include <chrono>

namespace ringattn {

using Clock = std::chrono::steady_clock;

// Seconds elapsed since `t0`.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace ringattn
