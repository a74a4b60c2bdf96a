// The C ABI's NCCL communicators (ringattn_c.h, ringattn_nccl_create): two NCCL transports of the
// caller's ranks on one GPU (K/V on one, the backward's dK/dV on the other), whose host
// collectives go, during each ring call, over that call's communicator. Without NCCL in the build
// every use is refused with the reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/callback_transport.hpp"
#include "comm/transport.hpp"
#include "core/error.hpp"
#include "ringattn_c.h"
#include "runner/problem/agree.hpp"

namespace ringattn::op {

bool nccl_built();

// A rank-local step whose InvalidArgument (or the caller's own refusal) every rank then raises;
// `step` returns this rank's value, and the call returns every rank's (agree_on_local_step).
template <typename F>
std::vector<int64_t> agreed(Transport& t, const char* caller_error, F&& step) {
  std::string error = caller_error != nullptr ? caller_error : "";
  int64_t value = 0;
  if (error.empty()) {
    try {
      value = step();
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
  }
  return agree_on_local_step(t, error, error.empty() ? value : 0);
}

// The host transport of the caller's communicator for one call: channel `channel`, or the world
// of one.
std::unique_ptr<Transport> host_transport(const CallbackComm& comm, int channel);

// Throws InvalidArgument (this rank's check, agreed by the caller) when `nccl` cannot carry a ring
// call of `world` ranks on the tensors' device `device`.
void check_nccl(const ringattn_nccl& nccl, const ringattn_device& device, int world);

// One ring call's use of a communicator: its K/V and dK/dV transports with their host
// collectives over `host` and `grad_host` (grad_host may be null in a forward) until the call
// ends; a call that throws marks the communicator failed, so that later calls are refused.
class NcclCall {
 public:
  NcclCall(ringattn_nccl& nccl, Transport& host, Transport* grad_host);
  NcclCall(const NcclCall&) = delete;
  NcclCall& operator=(const NcclCall&) = delete;
  ~NcclCall();
  Transport& kv() const;
  Transport& grad() const;
  // The call's failure (its text), remembered for the refusal of later calls.
  void failed(const std::string& why);

 private:
  ringattn_nccl& nccl_;
};

}  // namespace ringattn::op
