// A deliberately failing MPI test binary (tests/mpi/CMakeLists.txt runs it expecting failure):
// rank 1 fails while the other ranks wait in a blocking collective that rank 1 never joins.
// The MPI test main (run_all_tests_under_mpi) must end every rank with a non-zero exit and the
// failure text, instead of leaving the others waiting forever.
#include <stdexcept>

#include "../mpi_test_util.hpp"

namespace {

void others_wait() { MPI_Barrier(MPI_COMM_WORLD); }

TEST(OneRankFails, NonFatalCheck) {
  if (ringattn::test::world_rank() == 1) {
    EXPECT_EQ(1, 2) << "deliberate non-fatal failure on rank 1";
    return;  // leaves the test early, as a rank that skips the rest of a collective test would
  }
  others_wait();
}

TEST(OneRankFails, FatalAssertion) {
  if (ringattn::test::world_rank() == 1) ASSERT_TRUE(false) << "deliberate fatal failure on rank 1";
  others_wait();
}

TEST(OneRankFails, UncaughtException) {
  if (ringattn::test::world_rank() == 1) throw std::runtime_error("deliberate exception on rank 1");
  others_wait();
}

}  // namespace

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
