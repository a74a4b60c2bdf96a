// The host all-to-all of the MPI and NCCL transports (Transport::alltoall): the byte counts as
// MPI's int counts and displacements, and the MPI_Ialltoallv posted on a transport's collective
// buffers (comm/collective_buffers.hpp). The caller waits for the request under its bound, then
// copies the result out (CollectiveBuffers::copy_out of recv_total bytes). The counts must stay
// alive until the request completes (a timed-out one: for good), so the transport keeps them.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <span>
#include <vector>

#include "comm/collective_buffers.hpp"
#include "core/check.hpp"
#include "core/error.hpp"

namespace ringattn {

struct AlltoallvCounts {
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  size_t send_total = 0, recv_total = 0;
};

// MPI counts and displacements are int: a side of more than INT_MAX bytes is an InvalidArgument.
inline void int_counts(int rank, const char* side, std::span<const size_t> bytes, std::vector<int>& counts,
                       std::vector<int>& displs, size_t& total) {
  counts.assign(bytes.size(), 0);
  displs.assign(bytes.size(), 0);
  total = 0;
  for (size_t q = 0; q < bytes.size(); ++q) {
    if (bytes[q] > size_t(INT_MAX) - total)
      fail_arg("rank {}: all-to-all {} more than {} bytes in all, MPI's int count", rank, side, INT_MAX);
    displs[q] = int(total);
    counts[q] = int(bytes[q]);
    total += bytes[q];
  }
}

// Fills `c` from the byte counts and posts the all-to-all of `send` through `coll`.
inline MPI_Request post_alltoallv(MPI_Comm comm, int rank, CollectiveBuffers& coll, AlltoallvCounts& c,
                                  const void* send, std::span<const size_t> send_bytes,
                                  std::span<const size_t> recv_bytes) {
  int_counts(rank, "sends", send_bytes, c.send_counts, c.send_displs, c.send_total);
  int_counts(rank, "receives", recv_bytes, c.recv_counts, c.recv_displs, c.recv_total);
  const unsigned char* s = coll.send(send, c.send_total);
  unsigned char* r = coll.recv(c.recv_total);
  MPI_Request rq;
  RA_CHECK_MPI(MPI_Ialltoallv(s, c.send_counts.data(), c.send_displs.data(), MPI_BYTE, r, c.recv_counts.data(),
                              c.recv_displs.data(), MPI_BYTE, comm, &rq));
  return rq;
}

}  // namespace ringattn
