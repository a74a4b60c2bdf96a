#include "comm/callback_transport.hpp"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace ringattn {
namespace {

constexpr size_t kErrorBytes = 512;

class CallbackTransport final : public Transport {
 public:
  CallbackTransport(const CallbackComm& comm, int channel) : comm_(comm), channel_(channel) {}
  std::string name() const override { return "callback"; }
  int rank() const override { return comm_.rank; }
  int size() const override { return comm_.size; }
  bool accepts_device_memory() const override { return false; }

  void start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                           size_t recv_bytes) override {
    check_peers(to, from);
    if (pending_) fail_runtime("callback transport: an exchange is already in flight on channel {}", channel_);
    if (to == rank() && from == rank()) {
      if (send_bytes != recv_bytes)
        fail_arg("callback transport: a rank sending to itself must receive what it sends ({} bytes sent, {} "
                 "expected)", send_bytes, recv_bytes);
      if (send_bytes > 0) std::memmove(recv, send, send_bytes);
    } else {
      call("post", comm_.post(comm_.ctx, channel_, to, send, send_bytes, from, recv, recv_bytes, error_, kErrorBytes));
      pending_ = true;
    }
    bytes_sent_ += to == rank() ? 0 : send_bytes;
  }

  void wait_exchange() override {
    if (!pending_) return;
    pending_ = false;
    call("wait", comm_.wait(comm_.ctx, channel_, error_, kErrorBytes));
  }

  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    if (size() == 1) {
      if (send != recv) std::memmove(recv, send, bytes_per_rank);
      return;
    }
    call("allgather", comm_.allgather(comm_.ctx, send, recv, bytes_per_rank, error_, kErrorBytes));
  }

  void barrier() override {
    const char mine = 0;
    std::vector<char> all(static_cast<size_t>(size()));
    allgather(&mine, all.data(), 1);
  }

  uint64_t bytes_sent() const override { return bytes_sent_; }

  // The caller's wait is bounded by its own timeout; a failed wait leaves nothing in flight that
  // the caller's communicator still writes (it reported the failure), so the buffers may go.
  bool abandon_exchange() noexcept override {
    try {
      wait_exchange();
      return true;
    } catch (...) {
      return false;
    }
  }

 private:
  void call(const char* what, int32_t rc) {
    if (rc == 0) return;
    error_[kErrorBytes - 1] = '\0';
    fail_runtime("rank {}: the caller's communicator failed in {} (channel {}): {}", rank(), what, channel_,
                 error_[0] ? error_ : "no message");
  }

  CallbackComm comm_;
  int channel_;
  bool pending_ = false;
  uint64_t bytes_sent_ = 0;
  char error_[kErrorBytes] = {};
};

}  // namespace

void check_callback_comm(const CallbackComm& comm) {
  if (comm.size < 1) fail_arg("communicator size is {}; it must be >= 1", comm.size);
  if (comm.rank < 0 || comm.rank >= comm.size)
    fail_arg("communicator rank is {}; it must be 0 to {} (size {})", comm.rank, comm.size - 1, comm.size);
  if (comm.size > 1)
    for (const auto& [n, f] : {std::pair<const char*, bool>{"post", comm.post != nullptr},
                               {"wait", comm.wait != nullptr}, {"allgather", comm.allgather != nullptr}})
      if (!f) fail_arg("communicator has no {} function (a null pointer) with size {}", n, comm.size);
}

std::unique_ptr<Transport> make_callback_transport(const CallbackComm& comm, int channel) {
  check_callback_comm(comm);
  return std::make_unique<CallbackTransport>(comm, channel);
}

}  // namespace ringattn
