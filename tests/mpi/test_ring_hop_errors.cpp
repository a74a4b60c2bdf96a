// ranks: 2 3 4
// An exception inside a ring hop over real MPI (issue 12): every rank's backend throws
// std::bad_alloc while the hop's exchange is in flight, at every hop, in both progress modes. The
// runner must end that exchange before its blocks are freed (the sanitizer stage runs this under
// AddressSanitizer), report the rank and hop, and leave the transport usable: the next run over
// the same transport must match the fp64 oracle.
#include <stdexcept>

#include "common/throwing_backend.hpp"
#include "core/error.hpp"
#include "mpi_test_util.hpp"

namespace ringattn {
namespace {

using test::ShardTensor;

// Forwards to a real transport and remembers where the ring is: how many exchanges were posted,
// whether one is in flight, and what abandon_exchange answered.
class HopSpy final : public Transport {
 public:
  explicit HopSpy(Transport& inner) : t_(inner) {}
  std::string name() const override { return t_.name(); }
  int rank() const override { return t_.rank(); }
  int size() const override { return t_.size(); }
  bool accepts_device_memory() const override { return t_.accepts_device_memory(); }
  void start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                           size_t recv_bytes) override {
    ++exchanges_;
    in_flight_ = true;
    t_.start_peer_exchange(to, send, send_bytes, from, recv, recv_bytes);
  }
  void wait_exchange() override {
    t_.wait_exchange();
    in_flight_ = false;
  }
  bool abandon_exchange() noexcept override {
    ++abandoned_;
    const bool ended = t_.abandon_exchange();
    if (ended) in_flight_ = false;
    return ended;
  }
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override { t_.allgather(send, recv, bytes_per_rank); }
  void barrier() override { t_.barrier(); }
  uint64_t bytes_sent() const override { return t_.bytes_sent(); }

  void reset() { exchanges_ = abandoned_ = 0, in_flight_ = false; }
  // Whether the compute of `hop` is running: during hop s < P - 1 the exchange of hop s is in
  // flight (s + 1 posted); the last hop posts nothing.
  bool computing_hop(int hop) const {
    const int P = size();
    if (hop + 1 < P) return exchanges_ == hop + 1 && in_flight_;
    return exchanges_ == P - 1 && !in_flight_;
  }
  bool in_flight() const { return in_flight_; }
  int abandoned() const { return abandoned_; }

 private:
  Transport& t_;
  int exchanges_ = 0, abandoned_ = 0;
  bool in_flight_ = false;
};

struct Shard {
  ShardTensor q, k, v, out;
  std::vector<float> lse;
  Shard(const GlobalProblem& p, const ShardLayout& l, uint64_t seed)
      : q(p.dtype, p.batch, p.q_heads, l.tokens(), p.head_dim),
        k(p.dtype, p.batch, p.kv_heads, l.tokens(), p.head_dim),
        v(p.dtype, p.batch, p.kv_heads, l.tokens(), p.head_dim),
        out(p.dtype, p.batch, p.q_heads, l.tokens(), p.head_dim) {
    q.fill(seed, InputTensor::Q, l.segments);
    k.fill(seed, InputTensor::K, l.segments);
    v.fill(seed, InputTensor::V, l.segments);
  }
  LocalTensors tensors() {
    out.poison();
    lse.assign(size_t(out.view.batch * out.view.heads * out.view.len), std::numeric_limits<float>::quiet_NaN());
    return LocalTensors{q.view, k.view, v.view, out.view, lse.data()};
  }
};

class HopErrors : public ::testing::TestWithParam<MpiProgress> {};

TEST_P(HopErrors, AnExceptionInAHopEndsTheExchangeAndTheTransportStaysUsable) {
  const int P = test::world_size(), r = test::world_rank();
  const uint64_t seed = test::shared_seed();
  GlobalProblem p;
  p.batch = 1, p.q_heads = 4, p.kv_heads = 2, p.head_dim = 32, p.causal = true, p.sharding = Sharding::Zigzag;
  p.q_len = p.kv_len = 64 * (p.sharding == Sharding::Zigzag ? 2 * P : P);  // 16 KiB K blocks: past MPI's eager limit
  const ShardLayout layout = shard_layout(p.sharding, p.q_len, r, P);
  Shard shard(p, layout, seed);
  const test::GlobalInputs g(p, seed);
  auto cpu = make_cpu_backend();
  auto mpi = make_mpi_transport(MPI_COMM_WORLD, GetParam(), 60);
  HopSpy spy(*mpi);
  for (int hop = 0; hop < P; ++hop) {
    SCOPED_TRACE(fmt::format("seed {} rank {} of {}, throw at hop {}", seed, r, P, hop));
    spy.reset();
    test::ThrowingBackend b(*cpu, [&] { return spy.computing_hop(hop); });
    std::string message;
    try {
      run_ring_attention(p, shard.tensors(), b, spy);
    } catch (const RuntimeError& e) {
      message = e.what();
    }
    EXPECT_EQ(b.throws(), 1);
    EXPECT_NE(message.find(fmt::format("rank {} on ", r)), std::string::npos) << message;
    EXPECT_NE(message.find(fmt::format("hop {} of the {}-rank ring: computing on the block of rank {} failed: std::bad_alloc", hop, P,
                                       (r + P - hop) % P)),
              std::string::npos) << message;
    EXPECT_EQ(spy.abandoned(), hop + 1 < P ? 1 : 0);
    EXPECT_FALSE(spy.in_flight()) << "the exchange was left outstanding";

    // The same transport runs the next ring to the right answer.
    spy.reset();
    ASSERT_TRUE(test::all_ranks(true));
    run_ring_attention(p, shard.tensors(), *cpu, spy);
    const test::RingErrors e = test::ring_errors_vs_oracle(p, g, layout, shard.out, shard.lse);
    EXPECT_LT(e.out, 1e-5);
    EXPECT_LT(e.lse, 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, HopErrors, ::testing::Values(MpiProgress::HelperThread, MpiProgress::Nonblocking),
                         test::progress_param_name);

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
