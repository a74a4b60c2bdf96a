// The ring's warm-up before a timed run (runner/ring/warm_ring.hpp): one exchange of the given bytes
// through the transport, its buffers freed after it; a failure names the warm-up, the peers and
// the bytes, and ends the exchange first, keeping the buffers when the transport gives up.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/error.hpp"
#include "kernels/forwarding_backend.hpp"
#include "runner/ring/warm_ring.hpp"
#include "unit/faulty_transport.hpp"

namespace ringattn {
namespace {

using test::FaultyTransport;
using test::TransportFault;

// Counts the buffers a backend hands out and takes back; can fail synchronize().
class CountingBackend final : public ForwardingBackend {
 public:
  explicit CountingBackend(Backend& inner) : ForwardingBackend(inner) {}
  void* allocate(size_t bytes) override {
    ++allocated;
    return ForwardingBackend::allocate(bytes);
  }
  void deallocate(void* p) override {
    ++freed;
    ForwardingBackend::deallocate(p);
  }
  void synchronize() override {
    if (sync_throws) fail_runtime("the stream did not finish (injected by the test)");
    ForwardingBackend::synchronize();
  }
  int allocated = 0, freed = 0;
  bool sync_throws = false;
};

// A transport whose exchange fails while its transfer still runs and cannot be ended: the block
// arrives late, when the transport is destroyed (after warm_ring has returned).
class StuckTransport final : public Transport {
 public:
  std::string name() const override { return "stuck"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  bool accepts_device_memory() const override { return true; }
  void start_peer_exchange(int, const void*, size_t, int, void* recv, size_t bytes) override {
    recv_ = recv;
    bytes_ = bytes;
  }
  void wait_exchange() override { fail_runtime("timed out waiting for rank 1"); }
  bool abandon_exchange() noexcept override { return false; }
  void allgather(const void*, void*, size_t) override {}
  void barrier() override {}
  uint64_t bytes_sent() const override { return 0; }
  ~StuckTransport() override {
    if (recv_ != nullptr) std::memset(recv_, 0x5a, bytes_);  // the late write: live memory only
  }

 private:
  void* recv_ = nullptr;
  size_t bytes_ = 0;
};

TEST(WarmRing, OneExchangeOfTheGivenBytesThenFreesItsBuffers) {
  auto cpu = make_cpu_backend();
  CountingBackend b(*cpu);
  FaultyTransport t(1, 4, TransportFault::None, -1);
  const double s = warm_ring(t, b, 2048);
  EXPECT_GE(s, 0.0);
  EXPECT_EQ(t.exchanges(), 1);
  EXPECT_EQ(t.bytes_sent(), 2048u);
  EXPECT_FALSE(t.in_flight());
  EXPECT_EQ(b.allocated, 2);
  EXPECT_EQ(b.freed, 2);
}

TEST(WarmRing, AFailureNamesTheWarmUpAndEndsTheExchange) {
  auto cpu = make_cpu_backend();
  for (TransportFault f : {TransportFault::StartThrows, TransportFault::WaitThrows, TransportFault::ShortReceive}) {
    SCOPED_TRACE(test::transport_fault_name(f));
    CountingBackend b(*cpu);
    FaultyTransport t(1, 4, f, 0);
    try {
      warm_ring(t, b, 2048);
      ADD_FAILURE() << "no exception";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("warming the ring before the timed run (one exchange of 2048 bytes: send to "
                                           "rank 2, receive from rank 0) failed: "),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(t.abandoned(), 1);
    EXPECT_FALSE(t.in_flight());
    EXPECT_EQ(b.freed, 2);
  }
  // The backend failing after the exchange: the same message, its cause at the end.
  CountingBackend b(*cpu);
  b.sync_throws = true;
  FaultyTransport t(1, 4, TransportFault::None, -1);
  try {
    warm_ring(t, b, 64);
    ADD_FAILURE() << "no exception";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("failed: the stream did not finish (injected by the test)"), std::string::npos)
        << e.what();
  }
}

// The transport cannot end the exchange: the buffers stay allocated (the late write lands in live
// memory, which AddressSanitizer checks), and the message names the rank first.
TEST(WarmRing, AnExchangeThatCannotEndKeepsItsBuffers) {
  auto cpu = make_cpu_backend();
  CountingBackend b(*cpu);
  StuckTransport t;
  try {
    warm_ring(t, b, 4096);
    ADD_FAILURE() << "no exception";
  } catch (const RuntimeError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find("rank 0 on "), 0u) << m;
    EXPECT_NE(m.find("failed: timed out waiting for rank 1"), std::string::npos) << m;
  }
  EXPECT_EQ(b.allocated, 2);
  EXPECT_EQ(b.freed, 0);
}

}  // namespace
}  // namespace ringattn
