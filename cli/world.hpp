// Where this process runs: launched by mpirun/srun or alone, its rank, the transport and the
// backend. A process that was not launched by a launcher never calls MPI_Init (a world of one).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "cli/counting_backend.hpp"
#include "cli/options.hpp"
#include "comm/transport.hpp"
#include "kernels/backend.hpp"
#include "core/error.hpp"
#include "core/settings.hpp"
#include "runner/faults/fault.hpp"

namespace ringattn {
struct HopTracker;  // runner/faults/fault_injection.hpp
}  // namespace ringattn

namespace ringattn::cli {

// The process exit codes: 0 ok, 1 bad input or an error, 2 a check over its tolerance.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitCheckFailed = 2;


// True when a launcher started this process: OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK or
// SLURM_NTASKS in the environment.
bool launched_by_launcher();
// The rank the launcher announced in the environment (0 when none): lets errors found before
// MPI_Init print once, not once per rank.
int env_rank();
// The world size the launcher announced (OMPI_COMM_WORLD_SIZE, PMI_SIZE, or srun's
// SLURM_STEP_NUM_TASKS; 1 when none), and in `source` the variable that said it.
int launcher_world_size(std::string* source = nullptr);
// The rank among the processes on this host (0 when none is announced).
int env_local_rank();

// The tasks on node `node_id` in a Slurm layout such as "2(x3),1" (SLURM_STEP_TASKS_PER_NODE:
// nodes 0-2 run 2 tasks each, node 3 runs 1); 0 when the text is malformed or has no such node.
int slurm_tasks_on_node(const std::string& layout, int node_id);

// How a CPU rank's OpenMP threads follow from the ranks and cores of its host: ranks that share a
// host split its cores (the cores of this job there, under Slurm) unless OMP_NUM_THREADS is set.
struct CoreSplit {
  int local_ranks = 1;       // ranks on this host
  std::string ranks_source;  // the variable that said so, e.g. "SLURM_STEP_TASKS_PER_NODE=2"
  int cores = 1;             // cores for those ranks
  std::string cores_source;  // "SLURM_CPUS_ON_NODE=2", or "omp_get_num_procs" when not under Slurm
  int threads = 0;           // OpenMP threads per rank; 0: leave OpenMP as it is
};
// From the launcher's environment (mpirun: OMPI_COMM_WORLD_LOCAL_SIZE; srun:
// SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID, else SLURM_NTASKS_PER_NODE; the cores: the
// smaller of `procs` and SLURM_CPUS_ON_NODE) and `procs`, the cores OpenMP sees.
CoreSplit plan_core_split(int procs);

// MPI_Init_thread when launched (MPI_THREAD_MULTIPLE: the ring backward's two transports each
// progress on a helper thread; with SERIALIZED only one transport may, see mpi_transport.hpp),
// MPI_Finalize on finish(). Does nothing in a world of one.
class MpiSession {
 public:
  MpiSession();
  ~MpiSession();
  bool active() const { return active_; }
  // Seconds MPI_Init_thread took (0 without a launcher): part of the world's setup.
  double init_seconds() const { return init_s_; }
  void finish();
  // Ends every rank now (MPI_Abort when active, else exit).
  [[noreturn]] void abort(int code);

 private:
  bool active_ = false;
  double init_s_ = 0;
};

// The backend, the transport and what the report says about them.
struct World {
  std::unique_ptr<Backend> backend;  // a CountingBackend around the device's backend
  CountingBackend* counter = nullptr;
  std::unique_ptr<Transport> transport;
  int rank = 0, size = 1;
  int gpu = -1;              // the CUDA device, -1 on cpu
  std::string device_label;  // "cpu (2 threads)", "cuda:0"
  std::string transport_name;
  double timeout_s = 0;      // the wait bound of the transports
  MpiProgress mpi_progress = MpiProgress::Auto;  // the MPI transports' progress (RINGATTN_MPI_PROGRESS)
  FaultPlan fault;           // RINGATTN_FAULT's plan (none when unset)
  // The backward's second transport (the dK/dV ring): made on first use (collective), none in a
  // world of one (the backward then uses `transport`).
  std::unique_ptr<Transport> grad_transport;
  // What the RINGATTN_FAULT decorators share (nullptr without a plan): the dK/dV transport's
  // decorator joins those of `transport` and `backend` when grad_transport makes it.
  std::shared_ptr<HopTracker> fault_tracker;
};

// The transport of the backward's dK/dV ring (run_attention_backward's `grad_t`): `transport`
// itself in a world of one, else a second transport of the same kind over the same ranks (MPI:
// another make_mpi_transport, which duplicates the communicator; NCCL: another communicator),
// made on the first call, in the RINGATTN_FAULT decorator when a plan is set (a plan's grads
// phase aims at it). Collective on that first call: every rank calls it at the same point.
Transport& grad_transport(World& w);

// Builds the transport first (it fixes rank and size), then the backend on this rank's device,
// then re-creates the logger with the rank's prefix. `env` gives what the flags leave open (the
// wait bound, the MPI progress, the kernel choices, the fault plan, the log level); a refused
// value of a variable this world uses throws its InvalidArgument.
// Errors that every rank hits alike (no CUDA in this build, an unknown transport) are
// InvalidArgument. `inject_faults` false (a dry run): the fault plan is parsed into w.fault but
// nothing is decorated, so that no plan fires in the dry run's own exchanges.
World make_world(const ProblemOptions& o, const Settings& env, const MpiSession& mpi, bool inject_faults);

// The error make_world would meet before it makes the transport (no GPU, a transport this build
// or world cannot run, a refused RINGATTN_MPI_PROGRESS), without communicating: "" when none.
// main shares it through the start-up agreement, so that every rank stops with one message.
std::string world_choice_error(const ProblemOptions& o, const Settings& env, const MpiSession& mpi);

// The largest of every rank's `code` (collective over `t`): the exit code all ranks agree on.
int agree_exit_code(Transport& t, int code);

// Runs `body` on this world. A CollectiveError (every rank raised it) passes through; any other
// error on a world of several ranks is logged here, with the flight recorder, and ends the whole job through the
// transport's abort (MPI_Abort; NCCL aborts its communicator first) while the transport is still
// alive, rather than in destructors that might wait for ranks that will never come.
int run_guarded(World& w, const std::function<int()>& body);

// Like agree_exit_code, and logs `message` (the error of a failing rank) once per distinct
// message: by the lowest rank that holds it. An error every rank meets alike prints once, an
// error of one rank (a file missing on its host) prints with that rank's prefix.
int agree_on_errors(Transport& t, int code, const std::string& message);

// A rank-local step, then the ranks' agreement on how it went: the message `step` returns ("" for
// none) or the text of an InvalidArgument it throws becomes an exit code that every rank agrees
// on (agree_on_errors), so an error that hits one rank only (a file missing on one host) ends
// every rank alike, before any exchange that would wait for it. Other exceptions pass through.
int agreed_step(Transport& t, const std::function<std::string()>& step);

}  // namespace ringattn::cli

namespace ringattn::cli {

// An error every rank raised together inside a collective call (the runtime's validations and
// agreement are identical on every rank): all ranks may finalize MPI and exit(1) without
// MPI_Abort. Any other error under mpirun ends the job with MPI_Abort.
class CollectiveError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// Runs `wait`, a collective after --check where ranks may still be comparing with the fp64
// reference (their shares of it differ: a causal contiguous shard checks more pairs; in the
// backward rank 0 checks alone), and restates a wait that ran out (RuntimeError) with that cause:
// --timeout bounds this wait too. `check` false: `wait` runs as it is.
void wait_after_check(bool check, double timeout_s, const std::function<void()>& wait);

}  // namespace ringattn::cli
