// A Transport that forwards every call to another one: the base of transport decorators (host
// staging, fault injection), which override only what they change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>

#include "comm/transport.hpp"

namespace ringattn {

class ForwardingTransport : public Transport {
 public:
  explicit ForwardingTransport(Transport& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  bool accepts_device_memory() const override { return inner_.accepts_device_memory(); }
  std::string check_backend_device(int backend_device) const override {
    return inner_.check_backend_device(backend_device);
  }
  void set_stream(void* stream) override { inner_.set_stream(stream); }
  void start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                           size_t recv_bytes) override {
    inner_.start_peer_exchange(to, send, send_bytes, from, recv, recv_bytes);
  }
  void forward_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                             size_t recv_bytes) override {
    inner_.forward_peer_exchange(to, send, send_bytes, from, recv, recv_bytes);
  }
  void wait_exchange() override { inner_.wait_exchange(); }
  bool abandon_exchange() noexcept override { return inner_.abandon_exchange(); }
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    inner_.allgather(send, recv, bytes_per_rank);
  }
  void barrier() override { inner_.barrier(); }
  void alltoall(const void* send, std::span<const size_t> send_bytes, void* recv,
                std::span<const size_t> recv_bytes) override {
    inner_.alltoall(send, send_bytes, recv, recv_bytes);
  }
  // The inner transport's groups, undecorated (no staging, no fault injection).
  std::unique_ptr<Transport> split(int colour, int key) override { return inner_.split(colour, key); }
  uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  double last_exchange_seconds() const override { return inner_.last_exchange_seconds(); }
  [[noreturn]] void abort(int exit_code) override {
    inner_.abort(exit_code);
    std::_Exit(exit_code);  // not reached: the compiler cannot see through the virtual call
  }

 protected:
  Transport& inner() const { return inner_; }

 private:
  Transport& inner_;
};

}  // namespace ringattn
