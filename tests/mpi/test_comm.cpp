// ranks: 2 3 4
// The communicator of comm/transport.hpp over MPI, in both progress modes: peer exchanges with
// every distance (distinct patterns and sizes per pair, some 0), the all-to-all with uneven counts
// (MPI's and the interface's default of peer exchanges), split into odd and even groups with
// exchanges, all-to-alls and allgathers inside each, and bad peers, counts and colours refused by
// name on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/forwarding_transport.hpp"
#include "comm/mpi_transport.hpp"
#include "core/error.hpp"
#include "mpi/mpi_test_util.hpp"

namespace ringattn {
namespace {

// The bytes rank `from` sends rank `to`: a size that depends on the pair (0 for some) and a
// pattern that names both.
size_t pair_bytes(int from, int to) { return size_t((from * 3 + to * 5) % 4) * 7; }
uint8_t pair_byte(int from, int to, size_t i) { return uint8_t(from * 64 + to * 16 + int(i % 13)); }
std::vector<uint8_t> pair_block(int from, int to) {
  std::vector<uint8_t> b(pair_bytes(from, to));
  for (size_t i = 0; i < b.size(); ++i) b[i] = pair_byte(from, to, i);
  return b;
}

// The pair blocks between world rank r and each of `peers` in turn, one after another, with their
// counts: those r sends (`out`) or those r receives.
struct AllBlocks {
  std::vector<uint8_t> bytes;
  std::vector<size_t> counts;
};
AllBlocks pair_blocks(int r, const std::vector<int>& peers, bool out) {
  AllBlocks a;
  for (int q : peers) {
    const std::vector<uint8_t> b = out ? pair_block(r, q) : pair_block(q, r);
    a.bytes.insert(a.bytes.end(), b.begin(), b.end());
    a.counts.push_back(b.size());
  }
  return a;
}
std::vector<int> all_ranks(int P) {
  std::vector<int> v(static_cast<size_t>(P));
  for (int q = 0; q < P; ++q) v[size_t(q)] = q;
  return v;
}

// An MPI transport whose all-to-all is the interface's default: rounds of peer exchanges.
class DefaultAlltoall final : public ForwardingTransport {
 public:
  explicit DefaultAlltoall(Transport& inner) : ForwardingTransport(inner) {}
  void alltoall(const void* send, std::span<const size_t> sb, void* recv, std::span<const size_t> rb) override {
    Transport::alltoall(send, sb, recv, rb);
  }
};

class Comm : public ::testing::TestWithParam<MpiProgress> {};

TEST_P(Comm, PeerExchangesMoveEachPairsOwnBlock) {
  auto t = make_mpi_transport(MPI_COMM_WORLD, GetParam());
  const int r = t->rank(), P = t->size();
  uint64_t sent = 0;
  for (int d = 0; d < P; ++d) {  // distance 0 is an exchange with itself
    const int to = (r + d) % P, from = (r + P - d) % P;
    const std::vector<uint8_t> send = pair_block(r, to);
    std::vector<uint8_t> recv(pair_bytes(from, r), 0xee);
    t->start_peer_exchange(to, send.data(), send.size(), from, recv.data(), recv.size());
    t->wait_exchange();
    EXPECT_EQ(recv, pair_block(from, r)) << "distance " << d;
    sent += send.size();
  }
  EXPECT_EQ(t->bytes_sent(), sent);
  // The ring hop is the exchange at distance 1.
  const std::vector<uint8_t> send = pair_block(r, t->ring_next());
  std::vector<uint8_t> recv(pair_bytes(t->ring_prev(), r));
  t->start_exchange(send.data(), send.size(), recv.data(), recv.size());
  t->wait_exchange();
  EXPECT_EQ(recv, pair_block(t->ring_prev(), r));
}

TEST_P(Comm, PeersOutsideTheWorldAreRefusedByName) {
  auto t = make_mpi_transport(MPI_COMM_WORLD, GetParam());
  const int r = t->rank(), P = t->size();
  int a = r, b = -1;
  EXPECT_EQ(test::thrown_text<InvalidArgument>([&] { t->start_peer_exchange(P, &a, sizeof a, 0, &b, sizeof b); }), fmt::format("rank {}: exchange peer to = {} is not a rank of the {} transport (allowed are 0 to {})", r,
                           P, t->name(), P - 1));
  EXPECT_EQ(test::thrown_text<InvalidArgument>([&] { t->start_peer_exchange(0, &a, sizeof a, -2, &b, sizeof b); }), fmt::format("rank {}: exchange peer from = -2 is not a rank of the {} transport (allowed are 0 to {})",
                           r, t->name(), P - 1));
  // Nothing was posted: the transport still exchanges.
  t->start_exchange(&a, sizeof a, &b, sizeof b);
  t->wait_exchange();
  EXPECT_EQ(b, t->ring_prev());
}

TEST_P(Comm, AlltoallMovesUnevenBlocksIncludingEmptyOnes) {
  auto mpi = make_mpi_transport(MPI_COMM_WORLD, GetParam());
  DefaultAlltoall by_exchanges(*mpi);
  const int r = mpi->rank(), P = mpi->size();
  const AllBlocks send = pair_blocks(r, all_ranks(P), true), expect = pair_blocks(r, all_ranks(P), false);
  for (Transport* t : {static_cast<Transport*>(mpi.get()), static_cast<Transport*>(&by_exchanges)}) {
    std::vector<uint8_t> recv(expect.bytes.size(), 0xee);
    t->alltoall(send.bytes.data(), send.counts, recv.data(), expect.counts);
    EXPECT_EQ(recv, expect.bytes) << (t == mpi.get() ? "MPI_Ialltoallv" : "peer exchanges");
  }
  // MPI's collective counts no exchange bytes; the default's rounds do.
  EXPECT_EQ(mpi->bytes_sent(), send.bytes.size());
  const std::vector<size_t> one = {1};
  if (P > 1)
    EXPECT_EQ(test::thrown_text<InvalidArgument>(
                  [&] { mpi->alltoall(send.bytes.data(), one, nullptr, expect.counts); }),
              fmt::format("rank {}: all-to-all over the {} transport needs {} send and {} receive counts, one per rank "
                          "(got 1 and {})", r, mpi->name(), P, P, P));
}

TEST_P(Comm, SplitIntoOddAndEvenGroupsThatExchangeInside) {
  auto t = make_mpi_transport(MPI_COMM_WORLD, GetParam());
  const int r = t->rank(), P = t->size();
  // Each group ranks its members in reverse: the key is -r.
  auto g = t->split(r % 2, -r);
  std::vector<int> members;  // world ranks of this group, by group rank
  for (int q = P - 1; q >= 0; --q)
    if (q % 2 == r % 2) members.push_back(q);
  ASSERT_EQ(g->size(), int(members.size()));
  ASSERT_EQ(members[size_t(g->rank())], r);
  std::vector<int> gathered(members.size(), -1);
  g->allgather(&r, gathered.data(), sizeof r);
  EXPECT_EQ(gathered, members);
  // A ring hop inside the group: the world rank of the group's previous member arrives.
  int got = -1;
  g->start_exchange(&r, sizeof r, &got, sizeof got);
  g->wait_exchange();
  EXPECT_EQ(got, members[size_t(g->ring_prev())]);
  // An all-to-all inside the group, with the world ranks' pair blocks.
  const AllBlocks send = pair_blocks(r, members, true), expect = pair_blocks(r, members, false);
  std::vector<uint8_t> recv(expect.bytes.size(), 0xee);
  g->alltoall(send.bytes.data(), send.counts, recv.data(), expect.counts);
  EXPECT_EQ(recv, expect.bytes);
  EXPECT_EQ(t->bytes_sent(), 0u);  // the group's exchange went over its own communicator
  EXPECT_EQ(g->bytes_sent(), sizeof r);
}

TEST_P(Comm, ANegativeColourIsRefusedOnEveryRank) {
  auto t = make_mpi_transport(MPI_COMM_WORLD, GetParam());
  const int r = t->rank(), P = t->size();
  const int bad = P - 1;
  EXPECT_EQ(test::thrown_text<InvalidArgument>([&] { t->split(r == bad ? -3 : 0, 0); }),
            fmt::format("rank {}: split of the {} transport: rank {} gave colour -3; a colour must be >= 0", r,
                        t->name(), bad));
  // Nothing was split: the transport still exchanges.
  int got = -1;
  t->start_exchange(&r, sizeof r, &got, sizeof got);
  t->wait_exchange();
  EXPECT_EQ(got, t->ring_prev());
}

INSTANTIATE_TEST_SUITE_P(Modes, Comm, ::testing::Values(MpiProgress::HelperThread, MpiProgress::Nonblocking),
                         test::progress_param_name);

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
