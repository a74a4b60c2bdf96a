// One untimed exchange around the ring before a timed run, so that the run's time is the
// attention's and not the transport's one-time set-up (NCCL and MPI connect a pair of ranks at
// their first transfer).
#pragma once

#include <cstddef>

#include "comm/transport.hpp"
#include "kernels/backend.hpp"

namespace ringattn {

// Sends `bytes` to rank (r + 1) mod P and receives as many from rank (r - 1) mod P through `t`,
// once, and waits for it (the backend's stream too). Collective over `t`: every rank passes the
// same `bytes`. The buffers live in the backend's memory when the transport takes it (NCCL
// between GPUs, or a host backend), else in host memory (what a staged transport moves).
// Returns the seconds it took on this rank. A failed exchange throws RuntimeError naming the
// peers and the bytes; its buffers are freed only when the transport says no transfer can touch
// them any more (Transport::abandon_exchange).
double warm_ring(Transport& t, Backend& b, size_t bytes);

}  // namespace ringattn
