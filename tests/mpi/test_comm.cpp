// ranks: 2 3 4
// The communicator of comm/transport.hpp over MPI, in both progress modes: peer exchanges with
// every distance (distinct patterns and sizes per pair, some 0) and peers outside the world refused
// by name on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

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

INSTANTIATE_TEST_SUITE_P(Modes, Comm, ::testing::Values(MpiProgress::HelperThread, MpiProgress::Nonblocking),
                         test::progress_param_name);

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
