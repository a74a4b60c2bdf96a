#include "comm/staging_transport.hpp"

#include <cstdlib>
#include <new>
#include <utility>

namespace ringattn {

void HostBlock::grow(size_t bytes) {
  if (bytes <= bytes_) return;
  free_now();
  void* p = copies_ && copies_->alloc_host ? copies_->alloc_host(bytes) : std::malloc(bytes);
  if (p == nullptr) throw std::bad_alloc();
  p_ = static_cast<unsigned char*>(p);
  bytes_ = bytes;
}

void HostBlock::free_now() noexcept {
  if (p_ == nullptr) return;
  if (copies_ && copies_->free_host)
    copies_->free_host(p_);
  else
    std::free(p_);
  release();
}

StagingTransport::StagingTransport(Transport& inner, DeviceCopies copies, size_t reserve_bytes)
    : ForwardingTransport(inner), copies_(std::move(copies)) {
  for (auto& h : host_) {
    h.bind(&copies_);
    h.grow(reserve_bytes);
  }
}

StagingTransport::~StagingTransport() {
  if (!gave_up_) return;
  for (auto& h : host_) h.release();  // kept, not freed: see the header
}

void StagingTransport::start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                                           size_t recv_bytes) {
  const int slot = 1 - mirror_slot_;  // leaves the last received block's host copy alone
  host_[slot].grow(send_bytes);
  if (send_bytes > 0) copies_.to_host(host_[slot].data(), send, send_bytes);
  post(to, slot, send_bytes, from, recv, recv_bytes, false);
}

void StagingTransport::forward_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                                             size_t recv_bytes) {
  // Only a block this decorator received (and still mirrors) travels without a copy back.
  if (send != mirrored_ || send_bytes > mirrored_bytes_) {
    start_peer_exchange(to, send, send_bytes, from, recv, recv_bytes);
    return;
  }
  post(to, mirror_slot_, send_bytes, from, recv, recv_bytes, true);
}

void StagingTransport::post(int to, int send_slot, size_t send_bytes, int from, void* recv, size_t recv_bytes,
                            bool forward) {
  const int recv_slot = 1 - send_slot;
  host_[recv_slot].grow(recv_bytes);
  mirrored_ = nullptr;  // the receive overwrites one host buffer; the other is being sent
  pending_recv_ = recv;
  pending_slot_ = recv_slot;
  pending_bytes_ = recv_bytes;
  outstanding_ = true;  // before the call: a partial post counts
  if (forward)
    inner().forward_peer_exchange(to, host_[send_slot].data(), send_bytes, from, host_[recv_slot].data(), recv_bytes);
  else
    inner().start_peer_exchange(to, host_[send_slot].data(), send_bytes, from, host_[recv_slot].data(), recv_bytes);
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
