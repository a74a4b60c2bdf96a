// A transport double for the runner's failure paths: a fake ring of `size` ranks seen from one
// of them (every "peer" echoes this rank's own block and agrees with it), which fails in a
// chosen way at a chosen exchange, as a real transport would (a RuntimeError from the call).
// Like MPI, it writes the received block only when the exchange completes (wait_exchange or
// abandon_exchange); an exchange still outstanding when the double is destroyed is written then,
// late, which AddressSanitizer reports when the runner has already freed the receive block.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "comm/transport.hpp"
#include "core/error.hpp"
#include "runner/ring/ring.hpp"

namespace ringattn::test {

// The small problem the failure tests run: 16 zigzag tokens per rank, 2 query heads, one KV head
// of dim 16, causal, fp32 (a packed K and V block is 2048 bytes).
inline GlobalProblem small_ring_problem(int world) {
  GlobalProblem p;
  p.batch = 1, p.q_heads = 2, p.kv_heads = 1, p.head_dim = 16;
  p.q_len = p.kv_len = 16 * world;
  p.causal = false;  // full: every block travels whole, as the echoing double needs (equal sizes)
  p.sharding = Sharding::Zigzag;
  return p;
}

enum class TransportFault { None, StartThrows, WaitThrows, ShortReceive, Timeout };

inline const char* transport_fault_name(TransportFault f) {
  switch (f) {
    case TransportFault::None: return "none";
    case TransportFault::StartThrows: return "start_exchange throws";
    case TransportFault::WaitThrows: return "wait_exchange throws";
    case TransportFault::ShortReceive: return "short receive";
    case TransportFault::Timeout: return "timeout";
  }
  return "?";
}

class FaultyTransport final : public Transport {
 public:
  FaultyTransport(int rank, int size, TransportFault fault, int fault_exchange)
      : rank_(rank), size_(size), fault_(fault), fault_exchange_(fault_exchange) {}

  std::string name() const override { return "faulty"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool accepts_device_memory() const override { return false; }

  void start_peer_exchange(int, const void* send, size_t bytes, int, void* recv, size_t recv_bytes) override {
    // The fake peers echo this rank's block, which is only a valid peer when the sizes agree.
    if (recv_bytes != bytes) fail_arg("the test double echoes: it needs equal send and receive sizes");
    const bool fires = exchanges_ == fault_exchange_;
    ++exchanges_;
    if (fires && fault_ == TransportFault::StartThrows) fail_runtime("posting failed (injected by the test double)");
    // The fake peer's block: this rank's own, so that the compute after the hop stays valid. It
    // lands in `recv` when the exchange completes.
    incoming_.assign(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
    recv_ = recv;
    bytes_sent_ += bytes;
    pending_bytes_ = bytes;
    pending_fault_ = fires ? fault_ : TransportFault::None;
  }

  ~FaultyTransport() override { deliver(); }

  void wait_exchange() override {
    deliver();
    const TransportFault f = pending_fault_;
    pending_fault_ = TransportFault::None;
    if (f == TransportFault::WaitThrows) fail_runtime("the peer connection reset (injected by the test double)");
    if (f == TransportFault::ShortReceive)
      fail_runtime("received {} bytes from rank {} but expected {}", pending_bytes_ / 2, (rank_ + size_ - 1) % size_,
                   pending_bytes_);
    if (f == TransportFault::Timeout) fail_runtime("did not complete within 0.01 s: the peer hangs");
  }

  // Every rank "sends" the same bytes as this one: the ranks agree.
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    for (int r = 0; r < size_; ++r)
      std::memmove(static_cast<char*>(recv) + size_t(r) * bytes_per_rank, send, bytes_per_rank);
  }
  void barrier() override {}
  uint64_t bytes_sent() const override { return bytes_sent_; }
  [[noreturn]] void abort(int) override { fail_runtime("abort called on the test double"); }

  bool abandon_exchange() noexcept override {
    ++abandoned_;
    if (gives_up_) return false;  // the block still arrives, late, when the double is destroyed
    deliver();
    pending_fault_ = TransportFault::None;
    return true;
  }

  int exchanges() const { return exchanges_; }
  bool in_flight() const { return recv_ != nullptr; }
  int abandoned() const { return abandoned_; }
  // abandon_exchange reports that it gave up (a peer that hangs): the runner must keep the buffers.
  void give_up_on_abandon() { gives_up_ = true; }

 private:
  void deliver() {
    if (recv_ != nullptr) std::memcpy(recv_, incoming_.data(), incoming_.size());
    recv_ = nullptr;
  }

  int rank_, size_;
  TransportFault fault_;
  int fault_exchange_;
  int exchanges_ = 0;
  size_t pending_bytes_ = 0;
  TransportFault pending_fault_ = TransportFault::None;
  std::vector<char> incoming_;
  void* recv_ = nullptr;
  int abandoned_ = 0;
  bool gives_up_ = false;
  uint64_t bytes_sent_ = 0;
};

}  // namespace ringattn::test
