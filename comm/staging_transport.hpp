// Host staging of device buffers as a transport decorator: it wraps a transport that cannot take
// device pointers (plain MPI) for a backend whose buffers live on a device. Every exchange sends
// from and receives into host buffers that the decorator owns; the device receive buffer is
// filled when the exchange completes (wait_exchange), and a block passed on with
// forward_exchange is sent from the host copy already held, so each hop costs one copy to the
// device and none back. comm/ knows no backend: the copies are callbacks (the runner binds them to
// its Backend). One exchange at a time, like the transport it wraps.
#pragma once

#include <cstddef>
#include <functional>

#include "comm/forwarding_transport.hpp"

namespace ringattn {

struct DeviceCopies {
  std::function<void(void* host_dst, const void* device_src, size_t bytes)> to_host;
  // Returns once the device holds the bytes.
  std::function<void(void* device_dst, const void* host_src, size_t bytes)> from_host;
  // The host buffers' memory: page-locked where the device copies to and from it directly (the
  // runner binds Backend::allocate_host / free_host); unset: plain heap memory.
  std::function<void*(size_t bytes)> alloc_host;
  std::function<void(void* p)> free_host;
};

// One host buffer of the decorator, in DeviceCopies' host memory. grow() drops the contents
// (every caller overwrites the whole buffer next); release() leaves the memory to the process.
class HostBlock {
 public:
  HostBlock() = default;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  ~HostBlock() { free_now(); }
  void bind(const DeviceCopies* c) { copies_ = c; }
  void grow(size_t bytes);
  unsigned char* data() const { return p_; }
  size_t size() const { return bytes_; }
  void release() noexcept { p_ = nullptr, bytes_ = 0; }

 private:
  void free_now() noexcept;
  const DeviceCopies* copies_ = nullptr;
  unsigned char* p_ = nullptr;
  size_t bytes_ = 0;
};

class StagingTransport final : public ForwardingTransport {
 public:
  // `reserve_bytes`: the host buffers are allocated up front for blocks of that size (larger
  // ones grow them between exchanges).
  StagingTransport(Transport& inner, DeviceCopies copies, size_t reserve_bytes = 0);
  // When the wrapped transport gave up on an exchange (abandon_exchange false), its host buffers
  // are kept allocated for good: a transfer may still touch them, and the process is about to end.
  ~StagingTransport() override;
  StagingTransport(const StagingTransport&) = delete;
  StagingTransport& operator=(const StagingTransport&) = delete;

  bool accepts_device_memory() const override { return true; }
  void start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                           size_t recv_bytes) override;
  void forward_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                             size_t recv_bytes) override;
  void wait_exchange() override;
  bool abandon_exchange() noexcept override;

 private:
  void post(int to, int send_slot, size_t send_bytes, int from, void* recv, size_t recv_bytes, bool forward);

  DeviceCopies copies_;
  HostBlock host_[2];
  // The exchange posted last: where its block lands on the device and in which host buffer.
  void* pending_recv_ = nullptr;
  int pending_slot_ = 1;
  size_t pending_bytes_ = 0;
  bool outstanding_ = false;  // the wrapped transport has an exchange that did not complete
  bool gave_up_ = false;
  // The device buffer that host_[mirror_slot_] holds a copy of (the last completed receive).
  const void* mirrored_ = nullptr;
  int mirror_slot_ = 0;
  size_t mirrored_bytes_ = 0;
};

}  // namespace ringattn
