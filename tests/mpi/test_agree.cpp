// ranks: 1 2 3 4
// Ranks agree or stop: a rank that describes a different problem, or passes tensors that do not
// fit it, makes every rank throw the same InvalidArgument naming it; values that cannot work are
// rejected on every rank before any communication, and every length splits.
#include "mpi_test_util.hpp"
#include "core/error.hpp"
#include <regex>

namespace ringattn {
namespace {

// Counts every call that would communicate, to prove a rejection came before any of them.
class CountingTransport final : public Transport {
 public:
  explicit CountingTransport(Transport& inner) : inner_(inner) {}
  std::string name() const override { return "counting"; }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  bool accepts_device_memory() const override { return false; }
  void start_peer_exchange(int to, const void* s, size_t ns, int from, void* r, size_t nr) override {
    ++calls, inner_.start_peer_exchange(to, s, ns, from, r, nr);
  }
  void wait_exchange() override { ++calls, inner_.wait_exchange(); }
  void allgather(const void* s, void* r, size_t n) override { ++calls, inner_.allgather(s, r, n); }
  void barrier() override { ++calls, inner_.barrier(); }
  uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  int calls = 0;

 private:
  Transport& inner_;
};

GlobalProblem small_ring(int P) {
  GlobalProblem p;
  p.batch = 1, p.q_heads = 2, p.kv_heads = 1, p.head_dim = 8, p.causal = true, p.sharding = Sharding::Zigzag;
  p.q_len = p.kv_len = 2 * P * 4;
  return p;
}

// Runs the ring on this rank's tensors for `p` and returns the InvalidArgument message ("" when
// nothing was thrown).
std::string ring_error(const GlobalProblem& p, Transport& t, int64_t q_rows_delta = 0) {
  const int P = t.size(), r = t.rank();
  int64_t T = 1;
  try {
    T = shard_layout(p.sharding, p.q_len, r, P).tokens();
  } catch (const InvalidArgument&) {
  }
  test::ShardTensor q(p.dtype, p.batch, p.q_heads, T + q_rows_delta, p.head_dim), k(p.dtype, p.batch, p.kv_heads, T, p.head_dim),
      v(p.dtype, p.batch, p.kv_heads, T, p.head_dim), out(p.dtype, p.batch, p.q_heads, T + q_rows_delta, p.head_dim);
  for (auto* x : {&q, &k, &v}) x->fill(7, InputTensor::Q, {{0, x->view.len, 1}});
  auto backend = make_cpu_backend();
  try {
    run_ring_attention(p, LocalTensors{q.view, k.view, v.view, out.view, nullptr}, *backend, t);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Agreement, RankWithDifferentProblemIsNamedOnEveryRank) {
  const int P = test::world_size(), r = test::world_rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  auto t = make_mpi_transport(MPI_COMM_WORLD);
  GlobalProblem p = small_ring(P);
  if (r == P - 1) p.head_dim = 16;
  const std::string msg = ring_error(p, *t);
  EXPECT_NE(msg.find(fmt::format("rank {}: head_dim = 16", P - 1)), std::string::npos) << msg;
  EXPECT_TRUE(test::same_on_all_ranks(msg)) << msg;
}

// Packed documents are part of the problem: a rank with another list (same sum) is named.
TEST(Agreement, RankWithOtherDocumentsIsNamedOnEveryRank) {
  const int P = test::world_size(), r = test::world_rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  auto t = make_mpi_transport(MPI_COMM_WORLD);
  GlobalProblem p = small_ring(P);
  p.doc_lens = {p.q_len - 3, 3};
  if (r == 1) p.doc_lens = {p.q_len - 2, 2};
  const std::string msg = ring_error(p, *t);
  EXPECT_TRUE(std::regex_search(msg, std::regex("rank 1: document lengths \\(hash\\) = [0-9a-f]{16} \\(rank 0 has [0-9a-f]{16}\\)")))
      << msg;
  EXPECT_TRUE(test::same_on_all_ranks(msg)) << msg;
}

TEST(Agreement, OddRankZeroIsNamedWhenTheOthersAgree) {
  const int P = test::world_size(), r = test::world_rank();
  if (P < 3) GTEST_SKIP() << "needs a majority";
  auto t = make_mpi_transport(MPI_COMM_WORLD);
  GlobalProblem p = small_ring(P);
  if (r == 0) p.causal = false;
  const std::string msg = ring_error(p, *t);
  EXPECT_NE(msg.find("rank 0: causal = 0"), std::string::npos) << msg;
  EXPECT_TRUE(test::same_on_all_ranks(msg)) << msg;
}

TEST(Agreement, DecodeRanksDisagreeingOnQOffsetStop) {
  const int P = test::world_size(), r = test::world_rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  auto t = make_mpi_transport(MPI_COMM_WORLD);
  GlobalProblem p;
  p.q_heads = 2, p.kv_heads = 2, p.head_dim = 8, p.q_len = 1, p.kv_len = 16, p.causal = true;
  p.q_offset = r == 1 ? 10 : 15;
  std::string msg;
  try {
    agree_on_problem(p, *t);
  } catch (const InvalidArgument& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("q_offset = 10"), std::string::npos) << msg;
  EXPECT_TRUE(test::same_on_all_ranks(msg)) << msg;
}

TEST(Agreement, RankWithWrongTensorsStopsEveryRank) {
  const int P = test::world_size(), r = test::world_rank();
  auto t = make_mpi_transport(MPI_COMM_WORLD);
  const std::string msg = ring_error(small_ring(P), *t, r == P - 1 ? 1 : 0);
  EXPECT_NE(msg.find(fmt::format("rank {}: q is", P - 1)), std::string::npos) << msg;
  EXPECT_TRUE(test::same_on_all_ranks(msg)) << msg;
}

// Every length splits over every world (uneven shards, ranks with no tokens); a length that
// cannot work is still refused by name, on every rank, before any communication.
TEST(Agreement, AnyLengthRunsAndZeroLengthIsRejectedBeforeAnyCommunication) {
  const int P = test::world_size();
  auto mpi = make_mpi_transport(MPI_COMM_WORLD);
  for (Sharding sh : {Sharding::Zigzag, Sharding::Contiguous, Sharding::Striped}) {
    GlobalProblem p = small_ring(P);
    p.sharding = sh;
    for (int64_t n : {int64_t(1), int64_t(2 * P + 1), int64_t(4 * P - 1)}) {
      p.q_len = p.kv_len = n;
      const std::string msg = ring_error(p, *mpi);
      EXPECT_EQ(msg, "") << sharding_name(sh) << " N=" << n;
    }
    CountingTransport t(*mpi);
    p.q_len = p.kv_len = 0;
    const std::string msg = ring_error(p, t);
    EXPECT_NE(msg.find("q_len must be >= 1 (got 0)"), std::string::npos) << msg;
    EXPECT_EQ(t.calls, 0);
    EXPECT_TRUE(test::same_on_all_ranks(msg)) << msg;
  }
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
