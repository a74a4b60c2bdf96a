// How CPU ranks split a host's cores from the launcher's environment (mpirun's and srun's
// variables), and the parse of Slurm's per-node task layout. The slurm tests (tests/slurm) see
// the same split in real srun and sbatch jobs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "cli/world.hpp"

namespace ringattn::cli {
namespace {

TEST(CliWorld, SlurmTasksOnNode) {
  EXPECT_EQ(slurm_tasks_on_node("2", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2", 1), 0);
  EXPECT_EQ(slurm_tasks_on_node("8(x2)", 1), 8);
  EXPECT_EQ(slurm_tasks_on_node("8(x2)", 2), 0);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("1,3,2(x2)", 1), 3);
  EXPECT_EQ(slurm_tasks_on_node("1,3,2(x2)", 3), 2);
  EXPECT_EQ(slurm_tasks_on_node("1,3,2(x2)", 4), 0);
  for (const char* bad : {"", "x", "2(x", "2(x0)", "2(xa)", "0", "2,,1", "2;1", "2(x2)3", "-1"})
    EXPECT_EQ(slurm_tasks_on_node(bad, 0), 0) << "layout '" << bad << "'";
}

// Sets the launcher variables of one case and puts the process's environment back afterwards.
class LauncherEnv {
 public:
  explicit LauncherEnv(std::initializer_list<std::pair<std::string, std::string>> set) {
    for (const char* n : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID",
                          "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_ON_NODE", "OMP_NUM_THREADS"}) {
      const char* v = std::getenv(n);
      saved_[n] = v ? std::optional<std::string>(v) : std::nullopt;
      unsetenv(n);
    }
    for (const auto& [n, v] : set) setenv(n.c_str(), v.c_str(), 1);
  }
  LauncherEnv(const LauncherEnv&) = delete;
  LauncherEnv& operator=(const LauncherEnv&) = delete;
  ~LauncherEnv() {
    for (const auto& [n, v] : saved_) v ? setenv(n.c_str(), v->c_str(), 1) : unsetenv(n.c_str());
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(CliWorld, AloneLeavesOpenMpAlone) {
  LauncherEnv env({});
  const CoreSplit s = plan_core_split(8);
  EXPECT_EQ(s.threads, 0);
  EXPECT_EQ(s.local_ranks, 1);
  EXPECT_EQ(s.cores, 8);
}

TEST(CliWorld, MpirunSplitsTheHostsCores) {
  LauncherEnv env({{"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  const CoreSplit s = plan_core_split(2);
  EXPECT_EQ(s.threads, 1);
  EXPECT_EQ(s.ranks_source, "OMPI_COMM_WORLD_LOCAL_SIZE=2");
  EXPECT_EQ(s.cores_source, "omp_get_num_procs");
}

TEST(CliWorld, SrunSplitsTheJobsCoresOfThisNode) {
  // srun -n 2 on a 2-core node sets no SLURM_NTASKS_PER_NODE: the step layout says 2.
  LauncherEnv env({{"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_CPUS_ON_NODE", "2"}});
  const CoreSplit s = plan_core_split(2);
  EXPECT_EQ(s.threads, 1);
  EXPECT_EQ(s.local_ranks, 2);
  EXPECT_EQ(s.ranks_source, "SLURM_STEP_TASKS_PER_NODE=2 on node 0");
  EXPECT_EQ(s.cores_source, "SLURM_CPUS_ON_NODE=2");
}

TEST(CliWorld, SrunUsesThisNodesEntryAndTheJobsCores) {
  // Node 3 of "4(x3),2" runs 2 tasks; the job holds 12 of the node's 64 cores.
  LauncherEnv env({{"SLURM_STEP_TASKS_PER_NODE", "4(x3),2"}, {"SLURM_NODEID", "3"}, {"SLURM_CPUS_ON_NODE", "12"}});
  const CoreSplit s = plan_core_split(64);
  EXPECT_EQ(s.local_ranks, 2);
  EXPECT_EQ(s.cores, 12);
  EXPECT_EQ(s.threads, 6);
}

TEST(CliWorld, OneTaskKeepsToTheJobsCores) {
  LauncherEnv env({{"SLURM_STEP_TASKS_PER_NODE", "1"}, {"SLURM_NODEID", "0"}, {"SLURM_CPUS_ON_NODE", "3"}});
  EXPECT_EQ(plan_core_split(16).threads, 3);
}

TEST(CliWorld, BatchScriptFallsBackToNtasksPerNode) {
  LauncherEnv env({{"SLURM_NTASKS_PER_NODE", "4"}});
  const CoreSplit s = plan_core_split(8);
  EXPECT_EQ(s.threads, 2);
  EXPECT_EQ(s.ranks_source, "SLURM_NTASKS_PER_NODE=4");
}

TEST(CliWorld, MoreRanksThanCoresRunOneThreadEach) {
  LauncherEnv env({{"SLURM_STEP_TASKS_PER_NODE", "4"}, {"SLURM_NODEID", "0"}, {"SLURM_CPUS_ON_NODE", "2"}});
  EXPECT_EQ(plan_core_split(2).threads, 1);
}

TEST(CliWorld, OmpNumThreadsWins) {
  LauncherEnv env({{"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_NODEID", "0"}, {"OMP_NUM_THREADS", "2"}});
  const CoreSplit s = plan_core_split(2);
  EXPECT_EQ(s.local_ranks, 2);
  EXPECT_EQ(s.threads, 0);
}

// A wait after --check that runs out names the check as a cause (it read as a hang: a rank with
// more pairs to compare was still checking); without --check, and for other errors, unchanged.
TEST(CliWorld, AWaitAfterTheCheckNamesTheCheck) {
  const auto times_out = [] { throw RuntimeError("rank 0 on h: allgather did not complete within 3 s"); };
  try {
    wait_after_check(true, 3, times_out);
    ADD_FAILURE() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_EQ(std::string(e.what()),
              "rank 0 on h: allgather did not complete within 3 s (with --check, another rank may still be comparing "
              "its results with the fp64 reference: --timeout 3 s bounds that wait too; raise it, or compare fewer "
              "rows with --check-rows)");
  }
  try {
    wait_after_check(false, 3, times_out);
    ADD_FAILURE() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_EQ(std::string(e.what()), "rank 0 on h: allgather did not complete within 3 s");
  }
  EXPECT_THROW(wait_after_check(true, 3, [] { throw CollectiveError("ranks disagree"); }), CollectiveError);
  int ran = 0;
  wait_after_check(true, 3, [&] { ++ran; });
  EXPECT_EQ(ran, 1);
}

}  // namespace
}  // namespace ringattn::cli
