// The communicator of comm/transport.hpp on the local transport (the world of one): peer
// exchanges with itself, the all-to-all and split, and bad peers, counts and colours refused by
// name.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "comm/transport_factory.hpp"
#include "comm/transport.hpp"
#include "core/error.hpp"

namespace ringattn {
namespace {

template <class F>
std::string invalid_argument_of(F&& f) {
  return test::thrown_text<InvalidArgument>(f);
}

TEST(LocalTransport, PeerExchangeWithItselfCopiesAndCounts) {
  auto t = make_local_transport();
  std::vector<uint8_t> send(37), recv(37, 0);
  std::iota(send.begin(), send.end(), uint8_t(11));
  t->start_peer_exchange(0, send.data(), send.size(), 0, recv.data(), recv.size());
  t->wait_exchange();
  EXPECT_EQ(recv, send);
  t->start_peer_exchange(0, send.data(), 0, 0, recv.data(), 0);  // empty on both sides
  t->wait_exchange();
  EXPECT_EQ(t->bytes_sent(), 37u);
  EXPECT_EQ(t->ring_next(), 0);
  EXPECT_EQ(t->ring_prev(), 0);
}

TEST(LocalTransport, PeersOutsideTheWorldAreRefusedByName) {
  auto t = make_local_transport();
  int a = 1, b = 0;
  EXPECT_EQ(invalid_argument_of([&] { t->start_peer_exchange(1, &a, sizeof a, 0, &b, sizeof b); }),
            "rank 0: exchange peer to = 1 is not a rank of the local transport (allowed are 0 to 0)");
  EXPECT_EQ(invalid_argument_of([&] { t->start_peer_exchange(0, &a, sizeof a, -1, &b, sizeof b); }),
            "rank 0: exchange peer from = -1 is not a rank of the local transport (allowed are 0 to 0)");
  EXPECT_EQ(b, 0);  // nothing moved
  EXPECT_EQ(t->bytes_sent(), 0u);
}

TEST(LocalTransport, AlltoallCopiesItsOwnBlock) {
  auto t = make_local_transport();
  std::vector<uint8_t> send(23), recv(23, 0);
  std::iota(send.begin(), send.end(), uint8_t(40));
  const std::vector<size_t> counts = {23};
  t->alltoall(send.data(), counts, recv.data(), counts);
  EXPECT_EQ(recv, send);
  const std::vector<size_t> none = {0};
  t->alltoall(send.data(), none, recv.data(), none);  // nothing to move
  EXPECT_EQ(recv, send);
  const std::vector<size_t> two = {1, 2};
  EXPECT_EQ(invalid_argument_of([&] { t->alltoall(send.data(), two, recv.data(), counts); }),
            "rank 0: all-to-all over the local transport needs 1 send and 1 receive counts, one per rank (got 2 and 1)");
}

TEST(LocalTransport, SplitsIntoAWorldOfOne) {
  auto t = make_local_transport();
  auto sub = t->split(7, 3);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  int a = 42, b = 0;
  sub->start_exchange(&a, sizeof a, &b, sizeof b);
  sub->wait_exchange();
  EXPECT_EQ(b, 42);
  EXPECT_EQ(t->bytes_sent(), 0u);  // the group's exchanges are its own
  EXPECT_EQ(invalid_argument_of([&] { t->split(-1, 0); }),
            "rank 0: split of the local transport: rank 0 gave colour -1; a colour must be >= 0");
}

// The kind table behind --transport: its choices, what each kind needs, and the local maker.
TEST(TransportKinds, TheTableNamesEveryKindOnce) {
  const std::vector<const char*> names = transport_choices();
  const std::vector<std::string> choices(names.begin(), names.end());
  EXPECT_EQ(choices, (std::vector<std::string>{"auto", "mpi", "nccl", "local"}));
  const TransportKind* nccl = find_transport_kind("nccl");
  ASSERT_NE(nccl, nullptr);
  EXPECT_TRUE(nccl->needs_mpi && nccl->needs_cuda);
#ifdef RINGATTN_HAVE_NCCL
  EXPECT_TRUE(nccl->built);
#else
  EXPECT_FALSE(nccl->built);
  EXPECT_EQ(nccl->make, nullptr);
#endif
  const TransportKind* mpi = find_transport_kind("mpi");
  ASSERT_NE(mpi, nullptr);
  EXPECT_TRUE(mpi->needs_mpi && !mpi->needs_cuda && mpi->reads_progress);
  EXPECT_EQ(find_transport_kind("auto"), nullptr);
  EXPECT_EQ(find_transport_kind("gloo"), nullptr);
  EXPECT_STREQ(auto_transport_kind(MPI_COMM_NULL, false).name, "local");
  const TransportKind* local = find_transport_kind("local");
  ASSERT_NE(local, nullptr);
  EXPECT_TRUE(local->world_of_one && !local->needs_mpi);
  auto t = local->make(TransportRequest{});
  EXPECT_EQ(t->name(), "local");
  EXPECT_EQ(t->size(), 1);
}

}  // namespace
}  // namespace ringattn
