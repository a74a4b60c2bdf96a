// ranks: 2 3
// Communication overlaps compute, asserted by ordering, not by a clock: with the helper-thread MPI
// transport, the K/V block of hop s + 1 arrives in its receive buffer while the rank is still
// inside the compute of hop s, which never calls into the transport. The backend's flash
// watches the receive buffer (poisoned before the post, filled by the block's source with its
// own byte pattern) and returns only after the whole block is there, so the runner's own stats
// must then show the exchange hidden: its exposed time is a small part of the compute measured
// in the same run. The nonblocking mode is measured beside it and reported (Open MPI moves a
// large rendezvous message only inside MPI calls, so most of its transfer shows up as exposed
// time).
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/forwarding_transport.hpp"
#include "mpi_test_util.hpp"

namespace ringattn {
namespace {

// The receive buffer of the exchange in flight, as the transport decorator below saw it posted.
struct Arrival {
  const volatile uint8_t* buf = nullptr;
  size_t bytes = 0;
  uint8_t want = 0;      // the byte pattern of the block's source rank
  bool pending = false;  // posted, and its arrival not yet seen by a compute
  int seen = 0;          // blocks seen complete inside a compute
  int missed = 0;        // blocks not complete when a compute gave up watching
};

uint8_t pattern_of(int rank) { return uint8_t(0x3c + rank); }

// Poisons each exchange's receive buffer before posting it and notes what must arrive there:
// the block of rank (r - s - 1) mod P at exchange s.
class WatchedTransport final : public ForwardingTransport {
 public:
  WatchedTransport(std::unique_ptr<Transport> inner, Arrival& a)
      : ForwardingTransport(*inner), owned_(std::move(inner)), a_(a) {}
  void start_peer_exchange(int to, const void* send, size_t sb, int from, void* recv, size_t rb) override {
    exchange_ = 0;
    watch(recv, rb);
    ForwardingTransport::start_peer_exchange(to, send, sb, from, recv, rb);
  }
  void forward_peer_exchange(int to, const void* send, size_t sb, int from, void* recv, size_t rb) override {
    ++exchange_;
    watch(recv, rb);
    ForwardingTransport::forward_peer_exchange(to, send, sb, from, recv, rb);
  }

 private:
  void watch(void* recv, size_t rb) {
    const int P = size(), src = ((rank() - exchange_ - 1) % P + P) % P;
    std::memset(recv, 0, rb);
    a_ = Arrival{static_cast<const volatile uint8_t*>(recv), rb, pattern_of(src), rb > 0, a_.seen, a_.missed};
  }
  std::unique_ptr<Transport> owned_;
  Arrival& a_;
  int exchange_ = 0;
};

bool complete(const Arrival& a) {
  for (size_t i = a.bytes; i-- > 0;)  // the tail first: it is written last by most transports
    if (a.buf[i] != a.want) return false;
  return true;
}

// The CPU backend whose flash is a nap of at least `nap` (its output is not checked here); with
// `watch`, it also watches the exchange in flight and naps on until its block has arrived (or
// `give_up` passed: that block counts as missed).
class SleepyBackend final : public Backend {
 public:
  SleepyBackend(std::chrono::milliseconds nap, Arrival* watch) : inner_(make_cpu_backend()), nap_(nap), a_(watch) {}
  std::string name() const override { return "sleepy-cpu"; }
  bool device_memory() const override { return false; }
  int device() const override { return -1; }
  void* allocate(size_t n) override { return inner_->allocate(n); }
  void deallocate(void* p) override { inner_->deallocate(p); }
  void copy_from_host(void* d, const void* s, size_t n) override { inner_->copy_from_host(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { inner_->copy_to_host(d, s, n); }
  void copy(void* d, const void* s, size_t n) override { inner_->copy(d, s, n); }
  // Only the nap (and the watch): the test is about the exchange, and the nap leaves the cores free.
  void flash(const FlashParams&) override {
    const auto t0 = std::chrono::steady_clock::now();
    if (a_ != nullptr && a_->pending) {
      const auto give_up = t0 + std::chrono::seconds(60);  // a backstop, far past any transfer
      while (!complete(*a_) && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      a_->pending = false;
      ++(complete(*a_) ? a_->seen : a_->missed);
    }
    std::this_thread::sleep_until(t0 + nap_);
  }
  void flash_backward(const BackwardParams& p) override { inner_->flash_backward(p); }
  void decode(const DecodeParams& p) override { inner_->decode(p); }
  void merge(const MergeParams& p) override { inner_->merge(p); }
  void finalize(const FinalizeParams& p) override { inner_->finalize(p); }
  void fill_empty(const StateView& s) override { inner_->fill_empty(s); }
  void synchronize() override {}

 private:
  std::unique_ptr<Backend> inner_;
  std::chrono::milliseconds nap_;
  Arrival* a_;
};

struct Measured {
  double exposed = 0, compute = 0, transfer = -1;
  int seen = 0, missed = 0;
};

Measured run_once(MpiProgress mode, bool watch) {
  const int P = test::world_size(), r = test::world_rank();
  // One K/V block is 2 x 4 heads x 8192 tokens x 64 x 4 bytes = 16 MiB: a rendezvous message.
  GlobalProblem p;
  p.batch = 1, p.q_heads = 4, p.kv_heads = 4, p.head_dim = 64, p.q_len = p.kv_len = 8192 * P;
  const ShardLayout l = shard_layout(p.sharding, p.q_len, r, P);
  const int64_t T = l.tokens();
  test::ShardTensor q(p.dtype, 1, 4, T, 64), k(p.dtype, 1, 4, T, 64), v(p.dtype, 1, 4, T, 64), out(p.dtype, 1, 4, T, 64);
  for (auto* x : {&q, &k, &v}) std::fill(x->bytes.begin(), x->bytes.end(), pattern_of(r));
  Arrival arrival;
  SleepyBackend backend(std::chrono::milliseconds(150), watch ? &arrival : nullptr);
  std::unique_ptr<Transport> t = make_mpi_transport(MPI_COMM_WORLD, mode);
  if (watch) t = std::make_unique<WatchedTransport>(std::move(t), arrival);
  const RankStats st = run_ring_attention(p, LocalTensors{q.view, k.view, v.view, out.view, nullptr}, backend, *t);
  EXPECT_EQ(st.bytes_sent, ring_plan(p, P).ring_bytes(r));
  Measured m;
  for (const HopStats& h : st.hops)
    if (h.hop + 1 < P) m.exposed += h.exposed_comm_s, m.compute += h.compute_s;
  m.transfer = st.transfer_s;
  m.seen = arrival.seen;
  m.missed = arrival.missed;
  return m;
}

TEST(Overlap, HelperThreadHidesTheExchangeBehindCompute) {
  const int P = test::world_size();
  const Measured thread = run_once(MpiProgress::HelperThread, true);
  const Measured nonblocking = run_once(MpiProgress::Nonblocking, false);
  double mine[4] = {thread.exposed, nonblocking.exposed, thread.transfer, -thread.compute}, worst[4];
  MPI_Allreduce(mine, worst, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (test::world_rank() == 0)
    std::printf("P=%d exposed communication over %d hops (slowest rank): helper thread %.4f s (transfer %.4f s, "
                "compute %.4f s), nonblocking %.4f s\n", P, P - 1, worst[0], worst[2], -worst[3], worst[1]);
  // Every block of an exchange arrived while the previous hop's compute ran: the ordering that
  // overlap means, whatever the machine's load.
  EXPECT_EQ(thread.seen, P - 1);
  EXPECT_EQ(thread.missed, 0);
  // With the block already there, completing the exchange after the compute costs next to
  // little: the runner's exposed time is under half of its compute time (at least the 150 ms
  // nap per hop), both measured in this run.
  EXPECT_LT(thread.exposed, 0.5 * thread.compute) << "exposed " << thread.exposed << " s, compute "
                                                   << thread.compute << " s";
  EXPECT_GT(thread.transfer, 0.0);  // the helper thread times each exchange
  EXPECT_LT(nonblocking.transfer, 0.0);  // ... the nonblocking mode cannot, and says so
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
