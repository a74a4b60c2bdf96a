#include "runner/ring/warm_ring.hpp"

#include <chrono>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/host.hpp"
#include "core/timer.hpp"

namespace ringattn {
namespace {

// Two buffers of `bytes`, in the backend's memory or in host memory. Kept, not freed, after an
// exchange that may still write them (release()).
class WarmBuffers {
 public:
  WarmBuffers(Backend& b, bool in_backend, size_t bytes) {
    if (in_backend) {
      dev_send_ = DeviceBuffer(b, bytes);
      dev_recv_ = DeviceBuffer(b, bytes);
      send_ = dev_send_.get();
      recv_ = dev_recv_.get();
    } else {
      host_send_ = std::make_unique_for_overwrite<char[]>(bytes);
      host_recv_ = std::make_unique_for_overwrite<char[]>(bytes);
      send_ = host_send_.get();
      recv_ = host_recv_.get();
    }
  }
  void release() {
    dev_send_.release();
    dev_recv_.release();
    (void)host_send_.release();
    (void)host_recv_.release();
  }
  const void* send() const { return send_; }
  void* recv() const { return recv_; }

 private:
  DeviceBuffer dev_send_, dev_recv_;
  std::unique_ptr<char[]> host_send_, host_recv_;
  const void* send_ = nullptr;
  void* recv_ = nullptr;
};

}  // namespace

double warm_ring(Transport& t, Backend& b, size_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  const int r = t.rank(), P = t.size();
  if (b.stream() != nullptr) t.set_stream(b.stream());
  WarmBuffers buf(b, !b.device_memory() || t.accepts_device_memory(), bytes);
  try {
    t.start_exchange(buf.send(), bytes, buf.recv(), bytes);
    t.wait_exchange();
    b.synchronize();
  } catch (const std::exception& e) {
    if (!t.abandon_exchange()) buf.release();  // a transfer may still write them
    const std::string who = fmt::format("rank {} on {}: ", r, host_name());
    std::string cause = e.what();
    if (cause.rfind(who, 0) == 0) cause.erase(0, who.size());  // said once is enough
    fail_runtime("{}warming the ring before the timed run (one exchange of {} bytes: send to rank {}, receive from "
                 "rank {}) failed: {}", who, bytes, (r + 1) % P, (r + P - 1) % P, cause);
  }
  return seconds_since(t0);
}

}  // namespace ringattn
