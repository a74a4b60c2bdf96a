// A transport whose exchanges and collectives are the caller's functions: the communicator of a
// host that already has one (torch.distributed's process group under torchrun, through the C ABI's
// ringattn_communicator), so that ringattn runs inside a job it did not launch. The functions move
// host memory; ringattn posts one exchange at a time per channel and completes it with wait.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/transport.hpp"

namespace ringattn {

// The caller's communicator. Every function returns 0 on success, else writes one line of text
// into error[0, error_size) and returns non-zero (the transport throws RuntimeError with it).
// `channel` keeps concurrent transports over the same ranks apart (the ring backward's K/V ring is
// channel 0, its gradient ring channel 1): messages of one channel must never match another's.
struct CallbackComm {
  void* ctx = nullptr;
  int rank = 0, size = 0;
  // Posts: send `send_bytes` from `send` to rank `to` and receive `recv_bytes` from rank `from`
  // into `recv`; a side with 0 bytes posts nothing. Returns without waiting.
  int32_t (*post)(void* ctx, int32_t channel, int32_t to, const void* send, size_t send_bytes, int32_t from,
                  void* recv, size_t recv_bytes, char* error, size_t error_size) = nullptr;
  // Completes the channel's posted exchange (both sides), bounded by the caller's timeout.
  int32_t (*wait)(void* ctx, int32_t channel, char* error, size_t error_size) = nullptr;
  // recv[r * bytes, (r + 1) * bytes) := rank r's send, on every rank (collective).
  int32_t (*allgather)(void* ctx, const void* send, void* recv, size_t bytes_per_rank, char* error,
                       size_t error_size) = nullptr;
};

// Throws InvalidArgument naming the field when `comm` is not usable (a null function, size < 1,
// rank outside [0, size)).
void check_callback_comm(const CallbackComm& comm);

// A transport over `comm` on `channel` (collectives on any channel go through comm.allgather; the
// caller runs one transport's collectives at a time). Exchanges with this rank itself are copies
// and never reach the callbacks.
std::unique_ptr<Transport> make_callback_transport(const CallbackComm& comm, int channel);

}  // namespace ringattn
