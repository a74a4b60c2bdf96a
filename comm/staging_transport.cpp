#include "comm/staging_transport.hpp"

#include <utility>

namespace ringattn {

StagingTransport::StagingTransport(Transport& inner, DeviceCopies copies, size_t reserve_bytes)
    : ForwardingTransport(inner), copies_(std::move(copies)) {
  for (auto& h : host_) h.resize(reserve_bytes);
}

StagingTransport::~StagingTransport() {
  if (!gave_up_) return;
  for (auto& h : host_) (void)new std::vector<unsigned char>(std::move(h));  // kept, not freed: see the header
}

void StagingTransport::start_exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
  const int slot = 1 - mirror_slot_;  // leaves the last received block's host copy alone
  if (host_[slot].size() < send_bytes) host_[slot].resize(send_bytes);
  if (send_bytes > 0) copies_.to_host(host_[slot].data(), send, send_bytes);
  post(slot, send_bytes, recv, recv_bytes, false);
}

void StagingTransport::forward_exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
  // Only a block this decorator received (and still mirrors) travels without a copy back.
  if (send != mirrored_ || send_bytes > mirrored_bytes_) {
    start_exchange(send, send_bytes, recv, recv_bytes);
    return;
  }
  post(mirror_slot_, send_bytes, recv, recv_bytes, true);
}

void StagingTransport::post(int send_slot, size_t send_bytes, void* recv, size_t recv_bytes, bool forward) {
  const int recv_slot = 1 - send_slot;
  if (host_[recv_slot].size() < recv_bytes) host_[recv_slot].resize(recv_bytes);
  mirrored_ = nullptr;  // the receive overwrites one host buffer; the other is being sent
  pending_recv_ = recv;
  pending_slot_ = recv_slot;
  pending_bytes_ = recv_bytes;
  outstanding_ = true;  // before the call: a partial post counts
  if (forward)
    inner().forward_exchange(host_[send_slot].data(), send_bytes, host_[recv_slot].data(), recv_bytes);
  else
    inner().start_exchange(host_[send_slot].data(), send_bytes, host_[recv_slot].data(), recv_bytes);
}

void StagingTransport::wait_exchange() {
  inner().wait_exchange();
  outstanding_ = false;
  if (pending_bytes_ > 0) copies_.from_host(pending_recv_, host_[pending_slot_].data(), pending_bytes_);
  mirrored_ = pending_recv_;
  mirror_slot_ = pending_slot_;
  mirrored_bytes_ = pending_bytes_;
}

bool StagingTransport::abandon_exchange() noexcept {
  mirrored_ = nullptr;
  if (!outstanding_) return true;  // the host transfer ended; only the copy to the device failed
  if (inner().abandon_exchange()) {
    outstanding_ = false;
    return true;
  }
  gave_up_ = true;
  return false;
}

}  // namespace ringattn
