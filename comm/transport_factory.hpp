// The transports by kind: one table (name, what the kind needs, whether this build has it, its
// maker) that the command line reads for its --transport choices, its checks and the transports
// it makes (cli/world.cpp, cli/options.cpp), instead of a chain of ifs per kind. A new transport
// is a row here. Not installed (it includes <mpi.h> through comm/mpi_transport.hpp).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/mpi_transport.hpp"
#include "comm/transport.hpp"

namespace ringattn {

// What a maker gets: the world's communicator (the local transport ignores it, and MPI may then
// not be initialized), the MPI progress and the wait bound.
struct TransportRequest {
  MPI_Comm comm = MPI_COMM_NULL;
  MpiProgress progress = MpiProgress::Auto;
  double timeout_s = 0;
};

struct TransportKind {
  const char* name;     // the --transport value
  const char* library;  // for messages: "MPI", "NCCL"
  bool needs_mpi;       // needs a launched MPI world (mpirun/srun)
  bool needs_cuda;      // moves device buffers: needs a CUDA backend
  bool world_of_one;    // one rank only
  bool reads_progress;  // made with the MPI progress mode (RINGATTN_MPI_PROGRESS is read for it)
  bool built;           // compiled into this ringattn
  // This rank's GPU, chosen before the transport is made (collective; cudaSetDevice), or null
  // when the kind does not choose one.
  int (*select_gpu)(MPI_Comm comm);
  // Collective over the request's communicator; null when not built.
  std::unique_ptr<Transport> (*make)(const TransportRequest& request);
};

// Every kind, in the order of the --transport choices after "auto".
std::span<const TransportKind> transport_kinds();
// The kind named `name`, or null.
const TransportKind* find_transport_kind(std::string_view name);
// "auto", then every kind's name: the --transport choices.
std::vector<const char*> transport_choices();
// What "auto" picks: local without a launcher (`comm` is MPI_COMM_NULL), NCCL for a CUDA device
// when built and every rank has a GPU of its own (collective), else MPI.
const TransportKind& auto_transport_kind(MPI_Comm comm, bool cuda);

}  // namespace ringattn
