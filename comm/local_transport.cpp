// The world of one: the ring runner with no MPI at all. Its single "hop" exchange would send a
// block to itself, which is a copy.
#include <cstring>

#include "comm/transport.hpp"
#include "core/error.hpp"

namespace ringattn {
namespace {

class LocalTransport final : public Transport {
 public:
  std::string name() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  bool accepts_device_memory() const override { return false; }
  void start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                           size_t recv_bytes) override {
    check_peers(to, from);
    if (send_bytes != recv_bytes)
      fail_arg("local transport: a rank sending to itself must receive what it sends ({} bytes sent, {} expected)",
               send_bytes, recv_bytes);
    if (send_bytes > 0) std::memcpy(recv, send, send_bytes);
    bytes_sent_ += send_bytes;
  }
  void wait_exchange() override {}
  bool abandon_exchange() noexcept override { return true; }  // the copy is done when start returns
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    if (send != recv) std::memmove(recv, send, bytes_per_rank);
  }
  void barrier() override {}
  // A world of one splits into itself (any colour >= 0): a new local transport.
  std::unique_ptr<Transport> split(int colour, int /*key*/) override {
    check_colours(std::span<const int>(&colour, 1));
    return make_local_transport();
  }
  uint64_t bytes_sent() const override { return bytes_sent_; }

 private:
  uint64_t bytes_sent_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_local_transport() { return std::make_unique<LocalTransport>(); }

}  // namespace ringattn
