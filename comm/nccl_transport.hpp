// The NCCL transport: device buffers, stream-ordered send/recv to any peer on a communication
// stream joined to the compute stream by events. Made over a host transport of the same ranks,
// which carries the unique id and the host collectives: MPI under mpirun (comm/nccl_mpi.hpp), or
// any other (the caller's communicator in the C ABI). Needs no MPI itself.
#pragma once

#include <memory>

#include "comm/transport.hpp"

namespace ringattn {

struct NcclOptions {
  double timeout_s = 300;             // bound on every wait for an exchange
  double first_hop_timeout_s = 900;   // the first exchange also pays connection set-up
};

// An NCCL communicator of `host`'s ranks on the current CUDA device: rank 0's unique id reaches
// every rank by host->allgather; allgather, barrier, the all-to-all and abort go over `host`,
// which the transport owns. Collective over `host`.
std::unique_ptr<Transport> make_nccl_transport(std::unique_ptr<Transport> host, const NcclOptions& opts = {});

}  // namespace ringattn
