// The MPI transport: ring exchanges and the small collectives over a duplicate of an MPI
// communicator. The only public header that includes <mpi.h>.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>

#include "comm/transport.hpp"
#include "core/settings.hpp"

namespace ringattn {

// MPI. Call MPI_Init_thread asking for MPI_THREAD_SERIALIZED (or more) so the transport can
// progress exchanges on a helper thread; with less it falls back to MPI_Isend/MPI_Irecv. Two
// transports at once (the ring backward's K/V and dK/dV rings) need MPI_THREAD_MULTIPLE when
// either runs a helper thread: below it, making the second one throws InvalidArgument naming the
// level (the nonblocking mode everywhere is the alternative).

// The progress mode is MpiProgress (core/settings.hpp): Auto is the process's RINGATTN_MPI_PROGRESS
// when set, else a helper thread when the thread level allows, else nonblocking.

// Whether the MPI library moves CUDA device buffers itself: built with CUDA support (Open MPI's
// MPIX_CUDA_AWARE_SUPPORT) and MPIX_Query_cuda_support() says so now. False for other libraries.
bool mpi_library_cuda_aware();

// A transport over a duplicate of `comm` (errors returned, checked, and thrown as RuntimeError
// naming the call, file, line and rank). Host buffers; device buffers as well when
// mpi_library_cuda_aware() (accepts_device_memory() then says so and the name ends "CUDA-aware").
// Every wait for another rank is bounded by `timeout_s` (the transport's first exchange, which
// pays connection set-up, by 3x that); a wait past it throws RuntimeError. 0: the process's
// RINGATTN_MPI_TIMEOUT_S (core/settings.hpp), else 300 s. A refused value of either variable,
// where it is used, throws InvalidArgument naming it.
std::unique_ptr<Transport> make_mpi_transport(MPI_Comm comm, MpiProgress progress = MpiProgress::Auto,
                                              double timeout_s = 0);

}  // namespace ringattn
