// Host buffers for a nonblocking MPI collective that the transport polls under a deadline. A
// collective that times out may still be written by MPI after the call has thrown, so it never
// runs on the caller's memory: it runs on these, which are then kept (leaked on purpose) instead
// of freed, since the process is about to end.
#pragma once

#include <cstring>
#include <vector>

namespace ringattn {

class CollectiveBuffers {
 public:
  CollectiveBuffers() = default;
  CollectiveBuffers(const CollectiveBuffers&) = delete;
  CollectiveBuffers& operator=(const CollectiveBuffers&) = delete;
  ~CollectiveBuffers() {
    if (!kept_) return;
    // A timed-out collective may still write them: hand both to the heap for good.
    (void)new std::vector<unsigned char>(std::move(send_));
    (void)new std::vector<unsigned char>(std::move(recv_));
  }

  // A copy of `bytes` bytes of `src` for the collective to send.
  const unsigned char* send(const void* src, size_t bytes) {
    if (kept_) replace();
    send_.assign(static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    return send_.data();
  }
  // Room for the collective to receive `bytes` bytes.
  unsigned char* recv(size_t bytes) {
    if (kept_) replace();
    recv_.resize(bytes);
    return recv_.data();
  }
  // The collective completed: its result, into the caller's memory.
  void copy_out(void* dst, size_t bytes) const {
    if (bytes > 0) std::memcpy(dst, recv_.data(), bytes);
  }
  // The collective timed out: MPI may still use these buffers.
  void keep() { kept_ = true; }

 private:
  void replace() {  // a kept pair stays where it is; later collectives get fresh ones
    (void)new std::vector<unsigned char>(std::move(send_));
    (void)new std::vector<unsigned char>(std::move(recv_));
    send_ = {};
    recv_ = {};
    kept_ = false;
  }
  std::vector<unsigned char> send_, recv_;
  bool kept_ = false;
};

}  // namespace ringattn
