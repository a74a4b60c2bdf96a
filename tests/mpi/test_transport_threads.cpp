// ranks: 2
// The MPI transport's thread rule, in a process initialized with MPI_THREAD_SERIALIZED only: a
// helper-thread transport may not live beside another MPI transport (their MPI calls could
// overlap, which SERIALIZED forbids: the ring backward's second ring crashed that way), and the
// refusal names the level and both ways out; nonblocking transports may coexist.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "comm/mpi_transport.hpp"
#include "core/error.hpp"
#include "mpi/mpi_test_util.hpp"

namespace ringattn {
namespace {

std::string refusal_of(MpiProgress mode) {
  try {
    auto second = make_mpi_transport(MPI_COMM_WORLD, mode);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(MpiTransportThreads, SerializedRefusesASecondTransportBesideAHelperThread) {
  int level = 0;
  MPI_Query_thread(&level);
  ASSERT_EQ(level, MPI_THREAD_SERIALIZED) << "this binary initializes MPI with MPI_THREAD_SERIALIZED";
  {
    auto first = make_mpi_transport(MPI_COMM_WORLD, MpiProgress::HelperThread);
    for (MpiProgress mode : {MpiProgress::HelperThread, MpiProgress::Nonblocking}) {
      const std::string m = refusal_of(mode);
      EXPECT_NE(m.find("a second MPI transport beside one that runs a helper thread needs MPI_THREAD_MULTIPLE (this "
                       "process has thread level " + std::to_string(MPI_THREAD_SERIALIZED) + ")"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("RINGATTN_MPI_PROGRESS=nonblocking"), std::string::npos) << m;
      EXPECT_TRUE(test::same_on_all_ranks(m)) << m;
    }
    // The refused transports left nothing behind: the first one still exchanges.
    int mine = first->rank(), got = -1;
    first->start_exchange(&mine, sizeof mine, &got, sizeof got);
    first->wait_exchange();
    EXPECT_EQ(got, (first->rank() + first->size() - 1) % first->size());
  }
  // Without a helper thread, two transports at once are fine.
  auto a = make_mpi_transport(MPI_COMM_WORLD, MpiProgress::Nonblocking);
  auto b = make_mpi_transport(MPI_COMM_WORLD, MpiProgress::Nonblocking);
  EXPECT_EQ(a->size(), b->size());
  // And once they are gone, a helper-thread transport may start again.
  a.reset();
  b.reset();
  EXPECT_NO_THROW(make_mpi_transport(MPI_COMM_WORLD, MpiProgress::HelperThread));
}

// Device buffers go to MPI directly exactly when the library is CUDA-aware (then the name says
// so); otherwise the runner stages them through host memory. The same answer on every rank.
TEST(MpiTransportThreads, AcceptsDeviceMemoryExactlyWhenTheLibraryIsCudaAware) {
  auto t = make_mpi_transport(MPI_COMM_WORLD, MpiProgress::Nonblocking);
  const bool aware = mpi_library_cuda_aware();
  EXPECT_EQ(t->accepts_device_memory(), aware);
  EXPECT_EQ(t->name(), aware ? "mpi (nonblocking, CUDA-aware)" : "mpi (nonblocking)");
  EXPECT_TRUE(test::same_on_all_ranks(t->name())) << t->name();
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv, MPI_THREAD_SERIALIZED); }
