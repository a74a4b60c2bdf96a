// NCCL under MPI: each rank's GPU from its local rank, and the NCCL transport whose unique id and
// host collectives travel over MPI (comm/nccl_transport.cpp does the rest).
#include "comm/nccl_mpi.hpp"

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/mpi_transport.hpp"
#include "core/check.hpp"
#include "core/error.hpp"
#include "core/host.hpp"

namespace ringattn {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (end && *end == 0) ? int(x) : fallback;
}

struct LocalInfo {
  int local_rank, local_size, devices;
};

LocalInfo local_info(MPI_Comm comm) {
  MPI_Comm node;
  int rank;
  RA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  RA_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  LocalInfo li{};
  RA_CHECK_MPI(MPI_Comm_rank(node, &li.local_rank));
  RA_CHECK_MPI(MPI_Comm_size(node, &li.local_size));
  MPI_Comm_free(&node);
  li.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("SLURM_LOCALID", li.local_rank));
  if (cudaGetDeviceCount(&li.devices) != cudaSuccess) li.devices = 0;
  return li;
}

}  // namespace

bool every_rank_has_own_gpu(MPI_Comm comm) {
  const LocalInfo li = local_info(comm);
  int ok = li.local_rank < li.devices && li.local_size <= li.devices ? 1 : 0, all = 0;
  RA_CHECK_MPI(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm));
  return all == 1;
}

int select_local_gpu(MPI_Comm comm) {
  const LocalInfo li = local_info(comm);
  int rank, size;
  RA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  RA_CHECK_MPI(MPI_Comm_size(comm, &size));
  // Every rank learns every rank's verdict, so all throw the same message.
  struct Verdict {
    int local_rank, local_size, devices;
    char host[64];
  } mine{li.local_rank, li.local_size, li.devices, {}};
  const std::string h = host_name();
  h.copy(mine.host, sizeof(mine.host) - 1);
  std::vector<Verdict> all(static_cast<size_t>(size));
  RA_CHECK_MPI(MPI_Allgather(&mine, sizeof(Verdict), MPI_BYTE, all.data(), sizeof(Verdict), MPI_BYTE, comm));
  for (int r = 0; r < size; ++r) {
    const Verdict& v = all[static_cast<size_t>(r)];
    if (v.devices == 0)
      fail_arg("rank {} on host {} sees no GPU: the NCCL transport needs one GPU per rank (use --transport mpi or "
               "--device cpu)", r, v.host);
    if (v.local_rank >= v.devices || v.local_size > v.devices)
      fail_arg("rank {} on host {} is local rank {} of {} but the host has {} GPU(s): NCCL needs one GPU per rank; "
               "launch at most {} ranks per host, or use --transport mpi to share GPUs", r, v.host, v.local_rank,
               v.local_size, v.devices, v.devices);
  }
  RA_CHECK_CUDA(cudaSetDevice(li.local_rank));
  return li.local_rank;
}

std::unique_ptr<Transport> make_nccl_transport(MPI_Comm comm, const NcclOptions& opts) {
  // The host side runs no helper thread (two transports at once would need MPI_THREAD_MULTIPLE).
  return make_nccl_transport(make_mpi_transport(comm, MpiProgress::Nonblocking, opts.timeout_s), opts);
}

}  // namespace ringattn
