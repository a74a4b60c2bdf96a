// The parts of the hop loop on their own: host staging as a transport decorator
// (comm/staging_transport.hpp), two block rings at once (runner/ring/block_ring.hpp), and the
// RINGATTN_FAULT decorators (runner/faults/fault_injection.hpp) carrying out a plan in a real run, on
// the K/V ring and on the ring backward's dK/dV ring.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>

#include "comm/staging_transport.hpp"
#include "common/test_util.hpp"
#include "runner/ring/block_ring.hpp"
#include "core/error.hpp"
#include "runner/faults/fault_injection.hpp"
#include "runner/ring/ring.hpp"
#include "unit/faulty_transport.hpp"

namespace ringattn {
namespace {

using test::FaultyTransport;
using test::TransportFault;

// "Device" buffers in host memory, with copy callbacks that count their calls.
struct CountedCopies {
  int to_host = 0, from_host = 0;
  DeviceCopies copies() {
    return DeviceCopies{[this](void* h, const void* d, size_t n) { ++to_host, std::memcpy(h, d, n); },
                        [this](void* d, const void* h, size_t n) { ++from_host, std::memcpy(d, h, n); }};
  }
};

std::vector<unsigned char> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<unsigned char> v(n);
  for (auto& c : v) c = static_cast<unsigned char>(rng());
  return v;
}

TEST(StagingTransport, StagesOncePerPassAndDeliversToTheDevice) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const size_t n = 1000;
  FaultyTransport inner(1, 4, TransportFault::None, -1);  // every peer echoes this rank's block
  CountedCopies c;
  StagingTransport t(inner, c.copies(), n);
  EXPECT_TRUE(t.accepts_device_memory());
  std::vector<unsigned char> a = random_bytes(n, rng), b(n, 0), other = random_bytes(n, rng);
  const std::vector<unsigned char> sent = a;
  t.start_exchange(a.data(), n, b.data(), n);
  t.wait_exchange();
  EXPECT_EQ(b, sent);
  EXPECT_EQ(c.to_host, 1);
  EXPECT_EQ(c.from_host, 1);
  // Passing the received block on sends the host copy: no copy back from the device.
  std::fill(a.begin(), a.end(), 0);
  t.forward_exchange(b.data(), n, a.data(), n);
  t.wait_exchange();
  EXPECT_EQ(a, sent);
  EXPECT_EQ(c.to_host, 1);
  EXPECT_EQ(c.from_host, 2);
  // A block that this decorator did not receive is copied from the device.
  t.forward_exchange(other.data(), n, b.data(), n);
  t.wait_exchange();
  EXPECT_EQ(b, other);
  EXPECT_EQ(c.to_host, 2);
  EXPECT_EQ(inner.exchanges(), 3);
  EXPECT_EQ(t.bytes_sent(), 3 * n);
}

// The host buffers come from DeviceCopies' allocator (the runner binds the backend's page-locked
// memory): two up front, a larger block replaces the smaller buffer it needs, and every one is
// given back when the decorator ends.
TEST(StagingTransport, HostBuffersComeFromTheBackendsHostAllocator) {
  FaultyTransport inner(1, 4, TransportFault::None, -1);
  CountedCopies c;
  int allocs = 0;
  DeviceCopies copies = c.copies();
  std::vector<std::pair<void*, size_t>> blocks;
  copies.alloc_host = [&](size_t n) {
    ++allocs;
    void* p = std::malloc(n);
    blocks.emplace_back(p, n);
    return p;
  };
  copies.free_host = [&](void* p) {
    const auto it = std::find_if(blocks.begin(), blocks.end(), [p](const auto& b) { return b.first == p; });
    ASSERT_NE(it, blocks.end()) << "freed a buffer the allocator did not hand out";
    blocks.erase(it);
    std::free(p);
  };
  {
    StagingTransport t(inner, copies, 100);
    EXPECT_EQ(allocs, 2);
    std::vector<unsigned char> a(300, 5), b(300, 0);
    t.start_exchange(a.data(), 300, b.data(), 300);  // both host buffers too small: replaced
    t.wait_exchange();
    EXPECT_EQ(b, a);
    EXPECT_EQ(allocs, 4);
    EXPECT_EQ(blocks.size(), 2u);
    t.start_exchange(a.data(), 200, b.data(), 200);  // fits: no allocation
    t.wait_exchange();
    EXPECT_EQ(allocs, 4);
  }
  EXPECT_TRUE(blocks.empty()) << blocks.size() << " host buffers were not given back";
  // The CPU backend's staging memory is plain heap memory, usable as such.
  auto cpu = make_cpu_backend();
  void* p = cpu->allocate_host(64);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 64);
  cpu->free_host(p);
  cpu->free_host(nullptr);
}

// When the wrapped transport gives up, the host buffers stay allocated: the double writes the
// late block into them when it goes (AddressSanitizer would report a freed buffer).
TEST(StagingTransport, AnExchangeThatCannotEndKeepsTheHostBuffers) {
  FaultyTransport inner(0, 2, TransportFault::None, -1);
  inner.give_up_on_abandon();
  CountedCopies c;
  std::vector<unsigned char> a(64, 7), b(64, 0);
  {
    StagingTransport t(inner, c.copies(), 64);
    t.start_exchange(a.data(), 64, b.data(), 64);
    EXPECT_FALSE(t.abandon_exchange());
  }
  EXPECT_TRUE(inner.in_flight());
  EXPECT_EQ(c.from_host, 0);  // nothing reached the device
}

// Two rings at once over transports of their own, posts interleaved: each receives its own
// blocks (the double echoes), so nothing is shared between them.
TEST(BlockRing, TwoRingsAtOnceKeepTheirOwnBlocks) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  auto cpu = make_cpu_backend();
  const int world = 3;
  test::HostTensor k1(DType::F32, 1, 2, 8, 16, rng), v1(DType::F32, 1, 2, 8, 16, rng);
  test::HostTensor k2(DType::BF16, 2, 1, 4, 8, rng, true), v2(DType::BF16, 2, 1, 4, 8, rng, true);
  FaultyTransport t1(1, world, TransportFault::None, -1), t2(1, world, TransportFault::None, -1);
  FlightRecorder rec;
  // Every rank holds as many tokens as this one (the double echoes this rank's block), and full
  // attention sends every block whole around the ring.
  const auto plan_of = [&](const TensorView& k) {
    GlobalProblem p;
    p.batch = k.batch, p.q_heads = p.kv_heads = k.heads, p.head_dim = k.dim, p.dtype = k.dtype;
    p.q_len = p.kv_len = k.len * world;
    p.sharding = Sharding::Contiguous;
    return ring_plan(p, world);
  };
  const RingPlan plan1 = plan_of(k1.view), plan2 = plan_of(k2.view);
  BlockRing r1(*cpu, t1, k1.view, v1.view, plan1, rec), r2(*cpu, t2, k2.view, v2.view, plan2, rec);
  const auto same = [](const TensorView& a, const test::HostTensor& b) {
    const size_t bytes = b.bytes.size();
    std::vector<unsigned char> dense(bytes);
    for (int64_t bi = 0; bi < a.batch; ++bi)
      for (int64_t h = 0; h < a.heads; ++h)
        for (int64_t t = 0; t < a.len; ++t)
          for (int64_t d = 0; d < a.dim; ++d) {
            const size_t es = size_t(dtype_size(a.dtype));
            std::memcpy(&dense[size_t(b.view.offset(bi, h, t) + d) * es],
                        static_cast<const char*>(a.data) + size_t(a.offset(bi, h, t) + d) * es, es);
          }
    return dense == b.bytes;
  };
  for (int hop = 0; hop < world; ++hop) {
    SCOPED_TRACE(testing::Message() << "hop " << hop);
    EXPECT_TRUE(same(r1.k(hop), k1) && same(r1.v(hop), v1));
    EXPECT_TRUE(same(r2.k(hop), k2) && same(r2.v(hop), v2));
    if (!r1.exchanges(hop)) break;
    r1.post(hop);
    r2.post(hop);
    r2.complete(hop);
    r1.complete(hop);
  }
  EXPECT_EQ(t1.exchanges(), world - 1);
  EXPECT_EQ(t2.exchanges(), world - 1);
}

// The message of the RuntimeError that `run` ends with ("" when it runs through).
std::string runtime_error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const RuntimeError& e) {
    return e.what();
  }
  return "";
}

// What an injected throw or error at `hop` must have said: a throw names the hop's compute on the
// block it holds (`computing`: the runner's words), an error the post and the plan; the last hop
// posts nothing, so an error there never fires.
void expect_injected(const std::string& m, const std::string& kind, int rank, int hop, int world,
                     const char* computing, const std::string& plan) {
  const std::string at = fmt::format("hop {} of the {}-rank ring: ", hop, world);
  if (kind == "throw") {
    EXPECT_NE(m.find(at + fmt::format("{} the block of rank {} failed: std::bad_alloc", computing,
                                      (rank + world - hop) % world)), std::string::npos) << m;
  } else if (hop + 1 == world) {
    EXPECT_EQ(m, "") << "the last hop posts nothing";
  } else {
    EXPECT_NE(m.find(at + "posting the exchange"), std::string::npos) << m;
    EXPECT_NE(m.find(fmt::format("injected transport error ({})", plan)), std::string::npos) << m;
  }
}

// The decorators carry out error, corrupt and throw at every hop of a run, with the runner's
// messages.
TEST(FaultInjection, DecoratorsFollowTheHopsOfARun) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int world : {2, 3}) {
    const int rank = 1;
    const GlobalProblem p = test::small_ring_problem(world);
    const int64_t T = shard_layout(p.sharding, p.q_len, rank, world).tokens();
    test::HostTensor q(DType::F32, 1, 2, T, 16, rng), k(DType::F32, 1, 1, T, 16, rng),
        v(DType::F32, 1, 1, T, 16, rng), out(DType::F32, 1, 2, T, 16, rng);
    const LocalTensors x{q.view, k.view, v.view, out.view, nullptr};
    for (const char* kind : {"error", "corrupt", "throw"})
      for (int hop = 0; hop < world; ++hop) {
        SCOPED_TRACE(testing::Message() << "seed " << seed << ", P=" << world << ", " << kind << " at hop " << hop);
        std::unique_ptr<Transport> t = std::make_unique<FaultyTransport>(rank, world, TransportFault::None, -1);
        auto* inner = static_cast<FaultyTransport*>(t.get());
        std::unique_ptr<Backend> b = make_cpu_backend();
        install_fault_injection(t, b, parse_fault_plan(fmt::format("{}:{}:{}", rank, hop, kind)));
        const std::string m = runtime_error_of([&] { run_ring_attention(p, x, *b, *t); });
        if (std::string(kind) != "corrupt") {
          expect_injected(m, kind, rank, hop, world, "computing on",
                          fmt::format("RINGATTN_FAULT={}:{}:error", rank, hop));
        } else {  // corrupt: half a block sent at that hop, the others whole (none at the last)
          EXPECT_EQ(m, "");
          EXPECT_EQ(inner->bytes_sent(), uint64_t(world - 1) * 2048 - (hop + 1 < world ? 1024 : 0));
        }
      }
  }
}

// A rank's tensors of test::small_ring_problem and its gradients (random; lse 0), T tokens.
struct BackwardShard {
  test::HostTensor q, k, v, out, dout, dq, dk, dv;
  std::vector<float> lse;
  BackwardShard(int64_t T, std::mt19937_64& rng)
      : q(DType::F32, 1, 2, T, 16, rng), k(DType::F32, 1, 1, T, 16, rng), v(DType::F32, 1, 1, T, 16, rng),
        out(DType::F32, 1, 2, T, 16, rng), dout(DType::F32, 1, 2, T, 16, rng), dq(DType::F32, 1, 2, T, 16, rng),
        dk(DType::F32, 1, 1, T, 16, rng), dv(DType::F32, 1, 1, T, 16, rng), lse(size_t(2 * T), 0.f) {}
  LocalTensors x() { return LocalTensors{q.view, k.view, v.view, out.view, lse.data()}; }
  BackwardTensors g() const { return BackwardTensors{dout.view, dq.view, dk.view, dv.view}; }
};

// A backward plan leaves the forward alone and fires in the ring backward: a throw from the
// backward calls of its hop, an error when posting that hop's K/V exchange (the last hop posts
// none).
TEST(FaultInjection, BackwardPlansFireInTheBackwardRing) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int world : {2, 3}) {
    const int rank = 1;
    const GlobalProblem p = test::small_ring_problem(world);
    BackwardShard shard(shard_layout(p.sharding, p.q_len, rank, world).tokens(), rng);
    const LocalTensors x = shard.x();
    const BackwardTensors g = shard.g();
    for (const char* kind : {"throw", "error"})
      for (int hop = 0; hop < world; ++hop) {
        SCOPED_TRACE(testing::Message() << "seed " << seed << ", P=" << world << ", " << kind << " at hop " << hop);
        std::unique_ptr<Transport> t = std::make_unique<FaultyTransport>(rank, world, TransportFault::None, -1);
        FaultyTransport grad_t(rank, world, TransportFault::None, -1);
        std::unique_ptr<Backend> b = make_cpu_backend();
        install_fault_injection(t, b, parse_fault_plan(fmt::format("{}:{}:{}:backward", rank, hop, kind)));
        EXPECT_NO_THROW(run_ring_attention(p, x, *b, *t)) << "a backward plan fired in the forward";
        const std::string m = runtime_error_of([&] { run_attention_backward(p, x, g, *b, *t, grad_t); });
        expect_injected(m, kind, rank, hop, world, "the backward on",
                        fmt::format("RINGATTN_FAULT={}:{}:error:backward", rank, hop));
      }
  }
}

// A grads plan leaves the forward and the backward's K/V ring alone and fires in the dK/dV ring,
// whose exchanges run at hops 2..P (hop 1 carries nothing: hop 0's gradients stay home): an error
// when posting that hop's dK/dV exchange, a corrupt accumulator sent at half its size, a throw from
// the fold of the accumulator received at that hop (at P: the rank's own, come home).
TEST(FaultInjection, GradsPlansFireInTheDkDvRing) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int world : {2, 3}) {
    const int rank = 1;
    const GlobalProblem p = test::small_ring_problem(world);
    BackwardShard shard(shard_layout(p.sharding, p.q_len, rank, world).tokens(), rng);
    const LocalTensors x = shard.x();
    const BackwardTensors g = shard.g();
    const uint64_t accumulator = 2 * 16 * 16 * 4;  // dK and dV of 16 rows, one head of dim 16, fp32
    for (const char* kind : {"error", "corrupt", "throw"})
      for (int hop = 0; hop <= world; ++hop) {
        SCOPED_TRACE(testing::Message() << "seed " << seed << ", P=" << world << ", " << kind << " at hop " << hop);
        const FaultPlan plan = parse_fault_plan(fmt::format("{}:{}:{}:grads", rank, hop, kind));
        std::unique_ptr<Transport> t = std::make_unique<FaultyTransport>(rank, world, TransportFault::None, -1);
        std::unique_ptr<Transport> grad_t = std::make_unique<FaultyTransport>(rank, world, TransportFault::None, -1);
        auto* grad_inner = static_cast<FaultyTransport*>(grad_t.get());
        std::unique_ptr<Backend> b = make_cpu_backend();
        install_grad_fault_injection(grad_t, install_fault_injection(t, b, plan), plan);
        ASSERT_NE(grad_t.get(), grad_inner) << "the dK/dV transport was not decorated";
        EXPECT_NO_THROW(run_ring_attention(p, x, *b, *t)) << "a grads plan fired in the forward";
        const std::string m = runtime_error_of([&] { run_attention_backward(p, x, g, *b, *t, *grad_t); });
        const std::string at = fmt::format("hop {} of the {}-rank ring: ", hop, world);
        if (hop < 2) {
          EXPECT_EQ(m, "") << "no dK/dV exchange runs at hop " << hop;
        } else if (std::string(kind) == "error") {
          EXPECT_NE(m.find(at + "posting the dK/dV exchange"), std::string::npos) << m;
          EXPECT_NE(m.find(fmt::format("injected transport error ({})", plan.text())), std::string::npos) << m;
        } else if (std::string(kind) == "throw") {
          EXPECT_NE(m.find(at + fmt::format("adding the received dK/dV accumulator of the block of rank {} failed: "
                                            "std::bad_alloc", (rank + world - hop % world) % world)),
                    std::string::npos) << m;
        } else {  // corrupt: half an accumulator sent at that hop, the others whole
          EXPECT_EQ(m, "");
          EXPECT_EQ(grad_inner->bytes_sent(), uint64_t(world - 1) * accumulator - accumulator / 2);
        }
      }
  }
}

// The decorators without a plan install nothing, on either transport.
TEST(FaultInjection, NoPlanInstallsNothing) {
  std::unique_ptr<Transport> t = std::make_unique<FaultyTransport>(0, 2, TransportFault::None, -1);
  std::unique_ptr<Transport> grad_t = std::make_unique<FaultyTransport>(0, 2, TransportFault::None, -1);
  Transport *before = t.get(), *grad_before = grad_t.get();
  std::unique_ptr<Backend> b = make_cpu_backend();
  const FaultPlan none = parse_fault_plan("");
  install_grad_fault_injection(grad_t, install_fault_injection(t, b, none), none);
  EXPECT_EQ(t.get(), before);
  EXPECT_EQ(grad_t.get(), grad_before);
}

}  // namespace
}  // namespace ringattn
