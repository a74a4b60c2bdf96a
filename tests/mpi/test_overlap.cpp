// ranks: 2 3
// Communication overlaps compute: with a backend whose compute is a sleep (so the cores are free
// and the timing is not at the mercy of the 2-core CI machine), the helper-thread MPI transport
// moves each K/V block while the rank "computes", and the runner's stats say so. The nonblocking
// mode is measured beside it and reported (Open MPI moves a large rendezvous message only inside
// MPI calls, so most of its transfer shows up as exposed time).
#include <chrono>
#include <thread>

#include "mpi_test_util.hpp"

namespace ringattn {
namespace {

// The CPU backend whose flash is a fixed sleep (its output is not checked here).
class SleepyBackend final : public Backend {
 public:
  explicit SleepyBackend(std::chrono::milliseconds nap) : inner_(make_cpu_backend()), nap_(nap) {}
  std::string name() const override { return "sleepy-cpu"; }
  bool device_memory() const override { return false; }
  int device() const override { return -1; }
  void* allocate(size_t n) override { return inner_->allocate(n); }
  void deallocate(void* p) override { inner_->deallocate(p); }
  void copy_from_host(void* d, const void* s, size_t n) override { inner_->copy_from_host(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { inner_->copy_to_host(d, s, n); }
  void copy(void* d, const void* s, size_t n) override { inner_->copy(d, s, n); }
  // Only the nap: the test is about the exchange, and the nap leaves the cores free.
  void flash(const FlashParams&) override { std::this_thread::sleep_for(nap_); }
  void flash_backward(const BackwardParams& p) override { inner_->flash_backward(p); }
  void decode(const DecodeParams& p) override { inner_->decode(p); }
  void merge(const MergeParams& p) override { inner_->merge(p); }
  void finalize(const FinalizeParams& p) override { inner_->finalize(p); }
  void fill_empty(const StateView& s) override { inner_->fill_empty(s); }
  void synchronize() override {}

 private:
  std::unique_ptr<Backend> inner_;
  std::chrono::milliseconds nap_;
};

struct Measured {
  double exposed = 0, compute = 0, transfer = -1;
};

Measured run_once(MpiProgress mode) {
  const int P = test::world_size(), r = test::world_rank();
  // One K/V block is 2 x 4 heads x 8192 tokens x 64 x 4 bytes = 16 MiB: a rendezvous message that
  // takes milliseconds to move, well under the 150 ms nap that stands in for each hop's compute.
  GlobalProblem p;
  p.batch = 1, p.q_heads = 4, p.kv_heads = 4, p.head_dim = 64, p.q_len = p.kv_len = 8192 * P;
  const ShardLayout l = shard_layout(p.sharding, p.q_len, r, P);
  const int64_t T = l.tokens();
  test::ShardTensor q(p.dtype, 1, 4, T, 64), k(p.dtype, 1, 4, T, 64), v(p.dtype, 1, 4, T, 64), out(p.dtype, 1, 4, T, 64);
  for (auto* x : {&q, &k, &v}) std::fill(x->bytes.begin(), x->bytes.end(), uint8_t(0x3c));
  SleepyBackend backend(std::chrono::milliseconds(150));
  auto t = make_mpi_transport(MPI_COMM_WORLD, mode);
  const RankStats st = run_ring_attention(p, LocalTensors{q.view, k.view, v.view, out.view, nullptr}, backend, *t);
  EXPECT_EQ(st.bytes_sent, expected_ring_bytes(p, r, P));
  Measured m;
  for (const HopStats& h : st.hops)
    if (h.hop + 1 < P) m.exposed += h.exposed_comm_s, m.compute += h.compute_s;
  m.transfer = st.transfer_s;
  return m;
}

TEST(Overlap, HelperThreadHidesTheExchangeBehindCompute) {
  const int P = test::world_size();
  const Measured thread = run_once(MpiProgress::HelperThread);
  const Measured nonblocking = run_once(MpiProgress::Nonblocking);
  double mine[3] = {thread.exposed, nonblocking.exposed, thread.transfer}, worst[3];
  MPI_Allreduce(mine, worst, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (test::world_rank() == 0)
    std::printf("P=%d exposed communication over %d hops (slowest rank): helper thread %.4f s (transfer %.4f s), "
                "nonblocking %.4f s\n", P, P - 1, worst[0], worst[2], worst[1]);
  // The exchange runs during the 150 ms nap of each hop; a transport that only moved data after
  // the compute would expose its whole transfer here.
  EXPECT_LT(worst[0], 0.075 * (P - 1));  // half the nap per hop: room for a loaded machine
  EXPECT_GT(thread.transfer, 0.0);  // the helper thread times each exchange
  EXPECT_LT(nonblocking.transfer, 0.0);  // ... the nonblocking mode cannot, and says so
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
