#include "cli/world.hpp"

#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/error.hpp"
#include "core/timer.hpp"
#include "runner/faults/fault_injection.hpp"
#include "runner/diagnostics/log.hpp"
#include "comm/transport_factory.hpp"
#include "runner/ring/ring.hpp"
#ifdef RINGATTN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ringattn::cli {
namespace {

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v && *v) return std::atoi(v);
  return fallback;
}

int cuda_device_count() {
#ifdef RINGATTN_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

}  // namespace

bool launched_by_launcher() {
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_NTASKS"})
    if (const char* v = std::getenv(n); v && *v) return true;
  return false;
}

int env_rank() { return env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}, 0); }

int launcher_world_size(std::string* source) {
  // SLURM_NTASKS is the allocation's, set in a batch script where one process may run alone;
  // srun's own step size is SLURM_STEP_NUM_TASKS.
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"})
    if (const char* v = std::getenv(n); v && *v) {
      if (source) *source = fmt::format("{}={}", n, v);
      return std::max(1, std::atoi(v));
    }
  return 1;
}

int env_local_rank() {
  return env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"}, 0);
}

int slurm_tasks_on_node(const std::string& layout, int node_id) {
  // Entries "N" or "N(xR)", comma-separated, in node order; the whole text must parse.
  const auto number = [&](size_t& pos) {  // a positive decimal at pos, or 0
    size_t end = pos;
    while (end < layout.size() && end - pos < 9 && std::isdigit(static_cast<unsigned char>(layout[end]))) ++end;
    const int v = end > pos ? std::stoi(layout.substr(pos, end - pos)) : 0;
    pos = end;
    return v;
  };
  long first = 0;  // the first node of the current entry
  int found = 0;
  size_t pos = 0;
  while (true) {
    const int tasks = number(pos);
    int repeat = 1;
    if (layout.compare(pos, 2, "(x") == 0) {
      pos += 2;
      repeat = number(pos);
      if (pos >= layout.size() || layout[pos] != ')') return 0;
      ++pos;
    }
    if (tasks < 1 || repeat < 1) return 0;
    if (node_id >= first && node_id < first + repeat) found = tasks;
    first += repeat;
    if (pos == layout.size()) break;
    if (layout[pos++] != ',') return 0;
  }
  return found;
}

CoreSplit plan_core_split(int procs) {
  CoreSplit s;
  s.cores = std::max(1, procs);
  s.cores_source = "omp_get_num_procs";
  const auto var = [](const char* n) -> std::string {
    const char* v = std::getenv(n);
    return v ? v : "";
  };
  for (const char* n : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const int v = std::atoi(var(n).c_str()); v > 0 && s.ranks_source.empty()) {
      s.local_ranks = v;
      s.ranks_source = fmt::format("{}={}", n, v);
    }
  if (const std::string layout = var("SLURM_STEP_TASKS_PER_NODE"); s.ranks_source.empty() && !layout.empty()) {
    const int node = std::atoi(var("SLURM_NODEID").c_str());
    if (const int v = slurm_tasks_on_node(layout, node); v > 0) {
      s.local_ranks = v;
      s.ranks_source = fmt::format("SLURM_STEP_TASKS_PER_NODE={} on node {}", layout, node);
    }
  }
  if (const int v = std::atoi(var("SLURM_NTASKS_PER_NODE").c_str()); s.ranks_source.empty() && v > 0) {
    s.local_ranks = v;
    s.ranks_source = fmt::format("SLURM_NTASKS_PER_NODE={}", v);
  }
  // Under Slurm without a CPU binding every task sees all cores; the job holds SLURM_CPUS_ON_NODE.
  if (const int v = std::atoi(var("SLURM_CPUS_ON_NODE").c_str()); v > 0 && v <= s.cores) {
    s.cores = v;
    s.cores_source = fmt::format("SLURM_CPUS_ON_NODE={}", v);
  }
  const bool limited = s.local_ranks > 1 || s.cores < procs;
  if (limited && var("OMP_NUM_THREADS").empty()) s.threads = std::max(1, s.cores / s.local_ranks);
  return s;
}

MpiSession::MpiSession() {
  if (!launched_by_launcher()) return;
  const auto t0 = std::chrono::steady_clock::now();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      fail_runtime("MPI_Init_thread failed (launched by mpirun/srun, but MPI could not start)");
  }
  init_s_ = seconds_since(t0);
  active_ = true;
}

void MpiSession::finish() {
  if (!active_) return;
  active_ = false;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

MpiSession::~MpiSession() { finish(); }

void MpiSession::abort(int code) {
  if (active_) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

namespace {

// A launcher that announced P ranks but an MPI world of one: the binary's MPI library is not the
// launcher's (each process then starts alone and would run the whole problem by itself).
void check_world_matches_launcher(const MpiSession& mpi) {
  if (!mpi.active()) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string source;
  const int announced = launcher_world_size(&source);
  if (size != 1 || announced <= 1) return;
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string lib(version, size_t(len));
  lib = lib.substr(0, lib.find_first_of(",\n"));
  fail_arg("MPI started a world of 1 process, but the launcher announced {} ({}): this ringattn was probably built "
           "against a different MPI ({}) than the launcher's mpirun/srun; rebuild it against the MPI of the launcher "
           "you use (compare `which mpirun` with `ldd ringattn | grep -i mpi`)", announced, source, lib);
}

// The kind --transport names ("auto": auto_transport_kind), refused when this build or this world
// cannot run it.
const TransportKind& choose_transport_kind(const std::string& name, bool cuda, const MpiSession& mpi) {
  const TransportKind* k =
      name == "auto" ? &auto_transport_kind(mpi.active() ? MPI_COMM_WORLD : MPI_COMM_NULL, cuda) : find_transport_kind(name);
  if (k == nullptr) fail_arg("unknown --transport '{}': allowed are {}", name, fmt::join(transport_choices(), ", "));
  if (!k->built)
    fail_arg("--transport {}: this ringattn was built without {}; use --transport mpi or auto", k->name, k->library);
  check_transport_device(k->name, cuda ? "cuda" : "cpu");
  if (k->needs_mpi && !mpi.active())
    fail_arg("--transport {} needs a launcher (mpirun/srun: none of OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK, "
             "SLURM_NTASKS is set); run under mpirun or use --transport auto", k->name);
  if (k->world_of_one && mpi.active()) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) fail_arg("--transport {} is a world of one, but mpirun started {} ranks; use mpi or auto", k->name, size);
  }
  return *k;
}

// MPI_COMM_WORLD for every kind: the local transport ignores it (MPI may not be initialized then).
TransportRequest transport_request(const World& w) { return TransportRequest{MPI_COMM_WORLD, w.mpi_progress, w.timeout_s}; }

}  // namespace

Transport& grad_transport(World& w) {
  if (w.size <= 1) return *w.transport;
  if (!w.grad_transport) {
    const TransportKind* kind = find_transport_kind(w.transport_name);
    if (kind != nullptr && kind->make != nullptr && !kind->world_of_one) w.grad_transport = kind->make(transport_request(w));
    if (!w.grad_transport)
      throw CollectiveError(fmt::format("--backward: no second transport of kind {} for the gradient ring",
                                        w.transport_name));
    install_grad_fault_injection(w.grad_transport, w.fault_tracker, w.fault);  // RINGATTN_FAULT=...:grads
  }
  return *w.grad_transport;
}

namespace {

// What make_world checks before it makes the transport: no communication, so every rank can
// report it through the start-up agreement.
const TransportKind& check_world_choice(const ProblemOptions& o, const Settings& env, const MpiSession& mpi) {
  const bool cuda = o.device == "cuda";
  if (cuda && !cuda_available())
    fail_arg("--device cuda: {}; use --device cpu",
#ifdef RINGATTN_HAVE_CUDA
             "no GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
#else
             "this ringattn was built without CUDA (rebuild with nvcc present and -DRINGATTN_CUDA=ON)"
#endif
    );
  const TransportKind& kind = choose_transport_kind(o.transport, cuda, mpi);
  if (kind.reads_progress) (void)env.mpi_progress.get();  // a refused RINGATTN_MPI_PROGRESS throws here
  return kind;
}

}  // namespace

std::string world_choice_error(const ProblemOptions& o, const Settings& env, const MpiSession& mpi) {
  try {
    check_world_choice(o, env, mpi);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

void wait_after_check(bool check, double timeout_s, const std::function<void()>& wait) {
  if (!check) return wait();
  try {
    wait();
  } catch (const RuntimeError& e) {
    throw RuntimeError(fmt::format("{} (with --check, another rank may still be comparing its results with the fp64 "
                                   "reference: --timeout {:g} s bounds that wait too; raise it, or compare fewer rows "
                                   "with --check-rows)", e.what(), timeout_s));
  }
}

World make_world(const ProblemOptions& o, const Settings& env, const MpiSession& mpi, bool inject_faults) {
  World w;
  check_world_matches_launcher(mpi);
  // Every wait for another rank is bounded; the first hop also pays connection set-up.
  const double timeout = env.timeout_s(o.timeout_s);
  const bool cuda = o.device == "cuda";
  const TransportKind& kind = check_world_choice(o, env, mpi);
  w.transport_name = kind.name;
  w.timeout_s = timeout;
  if (kind.reads_progress) w.mpi_progress = env.mpi_progress.get();
  if (kind.select_gpu != nullptr) w.gpu = kind.select_gpu(MPI_COMM_WORLD);
  w.transport = kind.make(transport_request(w));
  w.rank = w.transport->rank();
  w.size = w.transport->size();

  if (cuda) {
    if (w.gpu < 0) {
      // Ranks beyond the GPU count share GPUs round-robin (fine for tests; NCCL refuses it).
      const int n = cuda_device_count();
      w.gpu = n > 0 ? env_local_rank() % n : 0;
    }
    w.backend = make_cuda_backend(w.gpu, env.kernels());
    w.device_label = fmt::format("cuda:{}", w.gpu);
  } else {
    // Several ranks on one host would each start one thread per core; split the cores instead
    // unless the user chose (OMP_NUM_THREADS).
    if (const CoreSplit split = plan_core_split(omp_get_num_procs()); split.threads > 0) {
      omp_set_num_threads(split.threads);
      if (w.rank == 0)
        spdlog::info("{} rank(s) on this host ({}) share {} core(s) ({}): {} OpenMP thread(s) each (set "
                     "OMP_NUM_THREADS to choose)",
                     split.local_ranks, split.ranks_source.empty() ? "one process" : split.ranks_source, split.cores,
                     split.cores_source, split.threads);
    }
    w.backend = make_cpu_backend();
    w.device_label = fmt::format("cpu ({} threads)", omp_get_max_threads());
  }
  w.backend->set_wait_timeout(timeout);
  w.fault = parse_fault_plan(env.fault.get());
  if (inject_faults)  // RINGATTN_FAULT: tests of the failure paths
    w.fault_tracker = install_fault_injection(w.transport, w.backend, w.fault);
  auto counting = std::make_unique<CountingBackend>(std::move(w.backend));
  w.counter = counting.get();
  w.backend = std::move(counting);
  init_logging(w.rank, w.size, resolve_log_level(o.log_level, env.log_level));
  return w;
}

int agree_exit_code(Transport& t, int code) {
  std::vector<int> all(size_t(t.size()), 0);
  t.allgather(&code, all.data(), sizeof(int));
  int worst = 0;
  for (int c : all) worst = std::max(worst, c);
  return worst;
}

int run_guarded(World& w, const std::function<int()>& body) {
  try {
    return body();
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    if (w.size <= 1) throw;
    spdlog::error("{}", e.what());
    log_flight_recorder();
    spdlog::default_logger()->flush();
    w.transport->abort(1);
  }
  return 1;  // not reached: abort ends the process
}

int agree_on_errors(Transport& t, int code, const std::string& message) {
  struct Entry {
    int code;
    uint64_t hash;
  };
  const Entry mine{code, code != 0 ? uint64_t(std::hash<std::string>{}(message)) : 0};
  std::vector<Entry> all(size_t(t.size()));
  t.allgather(&mine, all.data(), sizeof(Entry));
  int worst = 0;
  bool first_with_message = code != 0;
  for (int r = 0; r < t.size(); ++r) {
    worst = std::max(worst, all[size_t(r)].code);
    if (r < t.rank() && all[size_t(r)].code != 0 && all[size_t(r)].hash == mine.hash) first_with_message = false;
  }
  if (first_with_message) spdlog::error("{}", message);
  return worst;
}

int agreed_step(Transport& t, const std::function<std::string()>& step) {
  std::string error;
  try {
    error = step();
  } catch (const InvalidArgument& e) {
    error = e.what();
  }
  return agree_on_errors(t, error.empty() ? kExitOk : kExitError, error);
}

}  // namespace ringattn::cli
