// NCCL under MPI: the GPU of each rank and the NCCL transport bootstrapped over an MPI
// communicator (its unique id and host collectives over MPI). comm/nccl_transport.hpp makes one
// over any host transport.
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/nccl_transport.hpp"

namespace ringattn {

// The GPU of this rank: OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID when set, else the rank
// within MPI_COMM_TYPE_SHARED. Collective over `comm`: when any rank has no GPU of its own (local
// rank >= device count, i.e. two ranks would share a GPU), every rank throws InvalidArgument
// naming that rank and host. Calls cudaSetDevice. Returns the device index.
int select_local_gpu(MPI_Comm comm);

// True when every rank of `comm` can have a GPU of its own (collective; no throw).
bool every_rank_has_own_gpu(MPI_Comm comm);

// The NCCL transport over a duplicate of `comm` on the current device (select_local_gpu first):
// make_nccl_transport over a nonblocking MPI transport of `comm` bounded by opts.timeout_s.
// Collective.
std::unique_ptr<Transport> make_nccl_transport(MPI_Comm comm, const NcclOptions& opts = {});

}  // namespace ringattn
