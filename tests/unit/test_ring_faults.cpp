// The runner's failure paths through a transport double (tests/unit/faulty_transport.hpp):
// every transport failure at every hop surfaces as a RuntimeError that names the rank, the hop,
// the peers and the transport's own cause, and the flight recorder holds the failed hop.
#include <gtest/gtest.h>

#include <random>

#include "common/test_util.hpp"
#include "core/error.hpp"
#include "runner/diagnostics/flight_recorder.hpp"
#include "common/throwing_backend.hpp"
#include "runner/ring/ring.hpp"
#include "unit/faulty_transport.hpp"

namespace ringattn {
namespace {

using test::TransportFault;
using test::transport_fault_name;

struct RankProblem {
  GlobalProblem p;
  test::HostTensor q, k, v, out;
  RankProblem(int rank, int world, std::mt19937_64& rng)
      : p(make(world)),
        q(DType::F32, 1, 2, tokens(rank, world), 16, rng),
        k(DType::F32, 1, 1, tokens(rank, world), 16, rng),
        v(DType::F32, 1, 1, tokens(rank, world), 16, rng),
        out(DType::F32, 1, 2, tokens(rank, world), 16, rng) {}
  static GlobalProblem make(int world) { return test::small_ring_problem(world); }
  static int64_t tokens(int rank, int world) { return shard_layout(Sharding::Zigzag, 16 * world, rank, world).tokens(); }
  LocalTensors views() const { return LocalTensors{q.view, k.view, v.view, out.view, nullptr}; }
};

// One packed K and V block: 16 tokens per rank, one KV head of dim 16, fp32.
constexpr size_t kBlockBytes = 2 * 16 * 16 * sizeof(float);

std::string fault_message(TransportFault f) {
  switch (f) {
    case TransportFault::StartThrows: return "posting failed (injected";
    case TransportFault::WaitThrows: return "connection reset (injected";
    case TransportFault::ShortReceive: return "but expected";
    case TransportFault::Timeout: return "did not complete within";
    default: return "";
  }
}

TEST(RingFaults, EveryTransportFailureNamesTheHop) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  auto backend = make_cpu_backend();
  for (int world : {2, 3, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      RankProblem rp(rank, world, rng);
      for (TransportFault f : {TransportFault::StartThrows, TransportFault::WaitThrows, TransportFault::ShortReceive,
                               TransportFault::Timeout}) {
        for (int hop = 0; hop + 1 < world; ++hop) {
          SCOPED_TRACE(testing::Message() << "seed " << seed << ", P=" << world << ", rank " << rank << ", "
                                          << transport_fault_name(f) << " at hop " << hop);
          test::FaultyTransport t(rank, world, f, hop);
          flight_recorder().clear();
          try {
            run_ring_attention(rp.p, rp.views(), *backend, t);
            ADD_FAILURE() << "the run succeeded";
          } catch (const RuntimeError& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find(fmt::format("rank {} on ", rank)), std::string::npos) << m;
            EXPECT_NE(m.find(fmt::format("hop {} of the {}-rank ring: ", hop, world)), std::string::npos) << m;
            EXPECT_NE(m.find(fmt::format("send {} bytes to rank {}", kBlockBytes, (rank + 1) % world)),
                      std::string::npos) << m;
            EXPECT_NE(m.find(fmt::format("receive from rank {}", (rank + world - 1) % world)), std::string::npos) << m;
            EXPECT_NE(m.find(fault_message(f)), std::string::npos) << m;
            EXPECT_NE(m.find(f == TransportFault::StartThrows ? "posting the exchange" : "waiting for the exchange"),
                      std::string::npos) << m;
          }
          // The run stopped at the failed hop: no later exchange was posted.
          EXPECT_EQ(t.exchanges(), hop + 1);
          const auto ev = flight_recorder().events();
          ASSERT_FALSE(ev.empty());
          EXPECT_EQ(ev.back().what, HopEvent::Failed);
          EXPECT_EQ(ev.back().hop, hop);
        }
      }
    }
  }
}

// A caller's own recorder (RunOptions::recorder, what a library call passes so that calls and
// threads share none) gets the run's events, the failed hop last; the process's gets none.
TEST(RingFaults, TheCallersRecorderHoldsTheHopsAndTheProcessOneNone) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  auto backend = make_cpu_backend();
  const int world = 3, rank = 1, hop = 1;
  RankProblem rp(rank, world, rng);
  test::FaultyTransport t(rank, world, TransportFault::WaitThrows, hop);
  flight_recorder().clear();
  FlightRecorder mine;
  RunOptions opt;
  opt.recorder = &mine;
  EXPECT_THROW(run_ring_attention(rp.p, rp.views(), *backend, t, opt), RuntimeError) << "seed " << seed;
  EXPECT_TRUE(flight_recorder().events().empty());
  const auto ev = mine.events();
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.front().what, HopEvent::Posted);
  EXPECT_EQ(ev.front().hop, 0);
  EXPECT_EQ(ev.back().what, HopEvent::Failed);
  EXPECT_EQ(ev.back().hop, hop);
}

// Whether the compute of `hop` is running: during hop s < P - 1 the exchange of hop s is in
// flight (s + 1 posted); the last hop posts nothing.
bool computing_hop(const test::FaultyTransport& t, int hop, int world) {
  if (hop + 1 < world) return t.exchanges() == hop + 1 && t.in_flight();
  return t.exchanges() == world - 1 && !t.in_flight();
}

// Issue 12: an exception from the backend inside a hop, with that hop's exchange in flight, used
// to free the receive block while the transport still wrote it. The double writes it at
// completion (late, in its destructor, when nothing completed it), so AddressSanitizer sees a
// freed block; without a sanitizer, in_flight() says the exchange was left outstanding.
TEST(RingFaults, AnExceptionInsideAHopEndsTheExchangeFirst) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  auto cpu = make_cpu_backend();
  for (int world : {2, 3, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      RankProblem rp(rank, world, rng);
      for (int hop = 0; hop < world; ++hop) {
        SCOPED_TRACE(testing::Message() << "seed " << seed << ", P=" << world << ", rank " << rank << ", hop " << hop);
        test::FaultyTransport t(rank, world, TransportFault::None, 0);
        test::ThrowingBackend b(*cpu, [&] { return computing_hop(t, hop, world); });
        flight_recorder().clear();
        try {
          run_ring_attention(rp.p, rp.views(), b, t);
          ADD_FAILURE() << "the run succeeded";
        } catch (const RuntimeError& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find(fmt::format("rank {} on ", rank)), std::string::npos) << m;
          EXPECT_NE(m.find(fmt::format("hop {} of the {}-rank ring: computing on the block of rank {} failed: std::bad_alloc", hop,
                                       world, (rank + world - hop) % world)),
                    std::string::npos) << m;
        }
        EXPECT_EQ(b.throws(), 1);
        EXPECT_FALSE(t.in_flight()) << "the exchange was left outstanding";
        EXPECT_EQ(t.abandoned(), hop + 1 < world ? 1 : 0);
        EXPECT_EQ(t.exchanges(), std::min(hop + 1, world - 1));
        const auto ev = flight_recorder().events();
        ASSERT_FALSE(ev.empty());
        EXPECT_EQ(ev.back().what, HopEvent::Failed);
        EXPECT_EQ(ev.back().hop, hop);
      }
    }
  }
}

// A transport that cannot end the exchange (abandon_exchange gives up): the runner keeps both
// blocks allocated, so the late write when the double is destroyed lands in live memory.
TEST(RingFaults, AnExchangeThatCannotEndKeepsItsBuffers) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  auto cpu = make_cpu_backend();
  for (int world : {2, 4}) {
    RankProblem rp(1, world, rng);
    for (int hop = 0; hop + 1 < world; ++hop) {
      SCOPED_TRACE(testing::Message() << "seed " << seed << ", P=" << world << ", hop " << hop);
      test::FaultyTransport t(1, world, TransportFault::None, 0);
      t.give_up_on_abandon();
      test::ThrowingBackend b(*cpu, [&] { return computing_hop(t, hop, world); });
      EXPECT_THROW(run_ring_attention(rp.p, rp.views(), b, t), RuntimeError);
      EXPECT_EQ(t.abandoned(), 1);
      EXPECT_TRUE(t.in_flight());  // delivered (into the kept block) when `t` goes
    }
  }
}

TEST(RingFaults, WithoutAFaultTheDoubleRunsEveryHop) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  auto backend = make_cpu_backend();
  for (int world : {2, 4}) {
    RankProblem rp(1, world, rng);
    test::FaultyTransport t(1, world, TransportFault::None, 0);
    const RankStats st = run_ring_attention(rp.p, rp.views(), *backend, t);
    EXPECT_EQ(t.exchanges(), world - 1) << "seed " << seed;
    EXPECT_EQ(int(st.hops.size()), world) << "seed " << seed;
  }
}

}  // namespace
}  // namespace ringattn
