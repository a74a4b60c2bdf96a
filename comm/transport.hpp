// A transport moves K/V blocks around the ring and runs the few small collectives the runner
// needs. The ring runner talks only to this interface; a new transport is a new file in comm/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>

namespace ringattn {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // True when exchange buffers may be device memory (NCCL, CUDA-aware MPI). When false and the
  // backend's buffers are on a device, the runner stages blocks through host memory.
  virtual bool accepts_device_memory() const = 0;
  // "" when this transport can move the buffers of a backend on CUDA device `backend_device`
  // (-1: a host backend), else why not, naming both devices. The runner asks before any
  // communication and makes the answer part of every rank's agreement, so a backend and a
  // transport on different GPUs are refused on every rank instead of failing inside a hop.
  virtual std::string check_backend_device(int /*backend_device*/) const { return ""; }
  // The compute stream that device-side exchanges are ordered after (NCCL); ignored otherwise.
  // A stream of another device than the transport's is refused (RuntimeError).
  virtual void set_stream(void* /*stream*/) {}

  // Posts one exchange with two peers: send `send_bytes` from `send` to rank `to` and receive
  // `recv_bytes` from rank `from` into `recv` (a different buffer). Any ranks of this transport
  // (0 <= to, from < size(); this rank itself too); a rank outside them is an InvalidArgument
  // naming the value and the range (check_peers). The sizes may differ (uneven shards) and may
  // be 0 (that side posts nothing); the caller guarantees that rank `to` posts an exchange
  // receiving `send_bytes` from this rank at the same point (a mismatch fails the exchange where
  // the transport can tell). Returns at once; wait_exchange() completes it (for stream-ordered
  // transports: orders later compute after the receive). One exchange at a time.
  virtual void start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                                   size_t recv_bytes) = 0;
  // Posts an exchange whose `send` is the `recv` of the previous exchange on this transport,
  // unchanged since that exchange completed: the ring passing a received block on. A transport
  // that stages device buffers through host memory (comm/staging_transport.hpp) then sends the
  // host copy it already holds instead of copying the block back; a decorator that counts hops
  // (runner/faults/fault_injection.hpp) knows the pass goes on. Otherwise the same as
  // start_peer_exchange, which is the default.
  virtual void forward_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                                     size_t recv_bytes) {
    start_peer_exchange(to, send, send_bytes, from, recv, recv_bytes);
  }
  virtual void wait_exchange() = 0;

  // The ring's special case of the peer exchange, one hop: send to rank (r + 1) mod P, receive
  // from rank (r - 1) mod P.
  int ring_next() const { return (rank() + 1) % size(); }
  int ring_prev() const { return (rank() + size() - 1) % size(); }
  void start_exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
    start_peer_exchange(ring_next(), send, send_bytes, ring_prev(), recv, recv_bytes);
  }
  void forward_exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
    forward_peer_exchange(ring_next(), send, send_bytes, ring_prev(), recv, recv_bytes);
  }

  // The error path of a hop (an exception between start_exchange and a successful
  // wait_exchange, or from either): ends the outstanding exchange, if any, before its buffers are
  // freed. Completes it or cancels it, waiting at most the transport's exchange bound; never
  // throws. True when no transfer can touch the exchange's buffers any more (they may be freed);
  // false when the transport gave up (a peer hangs, or the transport cannot tell), and then the
  // caller must keep both buffers allocated, because the process is about to end. The default
  // suits transports whose wait_exchange is itself bounded and leaves nothing in flight.
  virtual bool abandon_exchange() noexcept {
    try {
      wait_exchange();
      return true;
    } catch (...) {
      return false;
    }
  }

  // Blocking collectives on host memory.
  virtual void allgather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  virtual void barrier() = 0;
  // All-to-all with per-peer counts: this rank sends send_bytes[q] bytes to rank q and receives
  // recv_bytes[q] bytes from rank q. `send` and `recv` hold the blocks one after another in rank
  // order (the block for or from rank q starts at the sum of the counts before q). Both spans hold
  // size() counts (else InvalidArgument); any count may be 0; the caller guarantees that
  // send_bytes[q] here is recv_bytes[r] on rank q. Not while an exchange is in flight. The default
  // runs it as size() peer exchanges (round d: to r + d, from r - d), each completed before the
  // next, which suits any transport whose exchanges take host memory (the local transport); MPI
  // runs MPI_Ialltoallv, bounded like its other collectives; NCCL runs the same over its MPI
  // communicator (host memory: NCCL itself moves device buffers only, and a device all-to-all of
  // grouped ncclSend/ncclRecv is not written yet).
  virtual void alltoall(const void* send, std::span<const size_t> send_bytes, void* recv,
                        std::span<const size_t> recv_bytes);
  // Collective over this transport's ranks: a new transport over the ranks that pass the same
  // `colour` (>= 0; a negative one is an InvalidArgument naming the rank and the value, on every
  // rank where the transport can tell), ranked by `key`, then by rank here. Independent of this
  // one: its own exchanges and collectives, and it may outlive it. MPI: MPI_Comm_split (the
  // colours are allgathered first, so a bad one is refused on every rank); local: a world of one
  // again; NCCL: refused (RuntimeError; ncclCommSplit, NCCL >= 2.18, is not wired up); a
  // decorator: its inner transport's split, undecorated. The default refuses (RuntimeError).
  virtual std::unique_ptr<Transport> split(int colour, int key);

  // Bytes this rank has sent through its exchanges (start_peer_exchange and the ring hops built on
  // it) since construction; collectives are not counted (except the default alltoall, which runs
  // as exchanges).
  virtual uint64_t bytes_sent() const = 0;

  // Seconds the last completed exchange took from post to completion, as the transport saw it
  // (a helper thread can time it; a nonblocking MPI exchange cannot): -1 when unknown.
  virtual double last_exchange_seconds() const { return -1.0; }

  // Ends every rank of the world at once (MPI_Abort), so that a failing rank never leaves the
  // others waiting in a collective. The world of one just exits.
  [[noreturn]] virtual void abort(int exit_code) { std::_Exit(exit_code); }

 protected:
  // Throws InvalidArgument when `to` or `from` is not a rank of this transport, naming the value
  // and the allowed range. Every transport calls it before posting anything.
  void check_peers(int to, int from) const;
  // Throws InvalidArgument unless both spans of an all-to-all hold size() counts.
  void check_alltoall_counts(std::span<const size_t> send_bytes, std::span<const size_t> recv_bytes) const;
  // Throws InvalidArgument naming the first rank whose colour (colours[q], rank q's) is negative.
  void check_colours(std::span<const int> colours) const;
};

// The world of one: no MPI at all. An exchange with itself copies send into recv.
std::unique_ptr<Transport> make_local_transport();

}  // namespace ringattn
