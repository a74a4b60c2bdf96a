// The NCCL transport: device buffers, stream-ordered send/recv to the ring neighbours on a
// communication stream joined to the compute stream by events. Bootstrapped over MPI (the
// unique id travels by MPI_Bcast); host collectives go over MPI as well.
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/transport.hpp"

namespace ringattn {

struct NcclOptions {
  double timeout_s = 300;             // bound on every wait for an exchange
  double first_hop_timeout_s = 900;   // the first exchange also pays connection set-up
};

// The GPU of this rank: OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID when set, else the rank
// within MPI_COMM_TYPE_SHARED. Collective over `comm`: when any rank has no GPU of its own (local
// rank >= device count, i.e. two ranks would share a GPU), every rank throws InvalidArgument
// naming that rank and host. Calls cudaSetDevice. Returns the device index.
int select_local_gpu(MPI_Comm comm);

// True when every rank of `comm` can have a GPU of its own (collective; no throw).
bool every_rank_has_own_gpu(MPI_Comm comm);

// Creates the communicator on the current device (select_local_gpu first). Collective.
std::unique_ptr<Transport> make_nccl_transport(MPI_Comm comm, const NcclOptions& opts = {});

}  // namespace ringattn
