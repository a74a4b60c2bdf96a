// The C ABI's NCCL communicators (capi/nccl_c.hpp). Each NCCL transport is made over a host slot:
// a transport of the same ranks whose collectives go to whatever host transport the current call
// put there (the call's communicator), so that a communicator made once outlives the callbacks of
// the call that made it.
#include "nccl_c.hpp"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "comm/callback_transport.hpp"
#include "descriptors.hpp"

#if RINGATTN_HAVE_NCCL
#include <cuda_runtime.h>
#include <unistd.h>

#include "comm/nccl_transport.hpp"
#endif

namespace ringattn::op {
namespace {

// Forwards the host collectives to the transport of the call in progress; refuses them between
// calls and never moves blocks itself (the NCCL transport does).
class HostSlot final : public Transport {
 public:
  HostSlot(int rank, int size) : rank_(rank), size_(size) {}
  void set(Transport* target) { target_ = target; }
  std::string name() const override { return target_ ? target_->name() : "the call's communicator"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool accepts_device_memory() const override { return false; }
  void start_peer_exchange(int, const void*, size_t, int, void*, size_t) override {
    fail_runtime("rank {}: the host slot of an NCCL communicator moves no blocks", rank_);
  }
  void wait_exchange() override {}
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    target().allgather(send, recv, bytes_per_rank);
  }
  void barrier() override { target().barrier(); }
  void alltoall(const void* send, std::span<const size_t> send_bytes, void* recv,
                std::span<const size_t> recv_bytes) override {
    target().alltoall(send, send_bytes, recv, recv_bytes);
  }
  uint64_t bytes_sent() const override { return 0; }

 private:
  Transport& target() const {
    if (target_ == nullptr)
      fail_runtime("rank {}: an NCCL communicator's host collective outside a ring call (no communicator to run it)",
                   rank_);
    return *target_;
  }
  int rank_, size_;
  Transport* target_ = nullptr;
};

}  // namespace
}  // namespace ringattn::op

// The handle of ringattn_c.h: two transports (K/V, dK/dV) over host slots, on one GPU.
struct ringattn_nccl {
  int device = 0, rank = 0, size = 1;
  ringattn::op::HostSlot* kv_slot = nullptr;    // owned by kv
  ringattn::op::HostSlot* grad_slot = nullptr;  // owned by grad
  std::unique_ptr<ringattn::Transport> kv, grad;
  bool in_call = false;
  std::string failure;  // "" until a call failed on it
};

namespace ringattn::op {

std::unique_ptr<Transport> host_transport(const CallbackComm& comm, int channel) {
  return comm.size == 1 ? make_local_transport() : make_callback_transport(comm, channel);
}

#if RINGATTN_HAVE_NCCL
bool nccl_built() { return true; }
#else
bool nccl_built() { return false; }
#endif

void check_nccl(const ringattn_nccl& n, const ringattn_device& device, int world) {
  if (!nccl_built())  // then no ringattn_nccl exists: `n` is not one, and is not read
    fail_arg("ring.nccl is given but this ringattn_c was built without NCCL (ringattn_nccl_create refuses); pass "
             "ring.nccl NULL");
  if (!n.failure.empty())
    fail_arg("ring.nccl failed in an earlier call ({}); destroy it and create another", n.failure);
  if (n.in_call) fail_arg("ring.nccl is in use by another ring call; one call at a time may use it");
  if (n.size != world)
    fail_arg("ring.nccl has {} ranks but ring.comm has {}; make it over the same ranks", n.size, world);
  if (device.device_type != kCuda)
    fail_arg("ring.nccl moves GPU memory but q is on {}; pass CUDA tensors, or ring.nccl NULL for CPU tensors",
             device_text(device));
  if (device.device_id != n.device)
    fail_arg("ring.nccl was made on GPU {} but q is on {}; make it on the tensors' device", n.device,
             device_text(device));
}

NcclCall::NcclCall(ringattn_nccl& nccl, Transport& host, Transport* grad_host) : nccl_(nccl) {
  nccl_.in_call = true;
  nccl_.kv_slot->set(&host);
  nccl_.grad_slot->set(grad_host);
}

NcclCall::~NcclCall() {
  nccl_.kv_slot->set(nullptr);
  nccl_.grad_slot->set(nullptr);
  nccl_.in_call = false;
}

Transport& NcclCall::kv() const { return *nccl_.kv; }
Transport& NcclCall::grad() const { return *nccl_.grad; }
void NcclCall::failed(const std::string& why) { nccl_.failure = why.substr(0, 300); }

namespace {

#if RINGATTN_HAVE_NCCL
// This rank's GPU as "host/PCI bus id", after checking that `device` exists.
std::string gpu_of(int32_t device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (device < 0 || device >= count)
    fail_arg("device is {}; this process sees {} CUDA device(s), so it must be 0 to {}", device, count, count - 1);
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess)
    fail_arg("device is {}, whose PCI bus id cannot be read", device);
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  return fmt::format("{}/{}", host, bus);
}

// Refuses, with the same text on every rank, when two ranks would share a GPU (NCCL cannot run
// two ranks of one communicator on one device). Collective over `host`.
void agree_on_gpus(Transport& host, const std::string& mine) {
  constexpr size_t kBytes = 112;
  char send[kBytes] = {};
  std::memcpy(send, mine.data(), std::min(mine.size(), kBytes - 1));
  std::vector<char> all(kBytes * size_t(host.size()));
  host.allgather(send, all.data(), kBytes);
  for (int a = 0; a < host.size(); ++a)
    for (int b = a + 1; b < host.size(); ++b)
      if (std::strncmp(&all[size_t(a) * kBytes], &all[size_t(b) * kBytes], kBytes) == 0) {
        const std::string gpu(&all[size_t(a) * kBytes]);
        fail_arg("ranks {} and {} are both on GPU {} (host/PCI bus id); NCCL needs a GPU of its own for every rank: "
                 "give each rank its own device, or pass ring.nccl NULL (the exchanges then go over the caller's "
                 "communicator)", a, b, gpu);
      }
}

std::unique_ptr<ringattn_nccl> make_nccl(Transport& host, int32_t device, double timeout_s) {
  auto n = std::make_unique<ringattn_nccl>();
  n->device = device;
  n->rank = host.rank();
  n->size = host.size();
  NcclOptions opts;
  opts.timeout_s = timeout_s;
  opts.first_hop_timeout_s = 3 * timeout_s;
  const int previous = current_cuda_device();
  if (cudaSetDevice(device) != cudaSuccess) fail_runtime("cudaSetDevice({}) failed", device);
  try {
    for (auto [slot, t] : {std::pair{&n->kv_slot, &n->kv}, std::pair{&n->grad_slot, &n->grad}}) {
      auto s = std::make_unique<HostSlot>(n->rank, n->size);
      *slot = s.get();
      s->set(&host);
      *t = make_nccl_transport(std::move(s), opts);
      (*slot)->set(nullptr);
    }
  } catch (...) {
    if (previous >= 0) set_cuda_device(previous);
    throw;
  }
  if (previous >= 0) set_cuda_device(previous);
  return n;
}
#endif

void create(const ringattn_communicator* comm, int32_t device, double timeout_s, ringattn_nccl** out) {
  if (comm == nullptr) fail_arg("comm is missing (a null pointer)");
  const CallbackComm c{comm->ctx, comm->rank, comm->size, comm->post, comm->wait, comm->allgather};
  check_callback_comm(c);
  const std::unique_ptr<Transport> host = host_transport(c, 0);
  std::string gpu;
  agreed(*host, nullptr, [&] {
    if (out == nullptr) fail_arg("out is missing (a null pointer)");
    *out = nullptr;
    if (!(timeout_s > 0) || !std::isfinite(timeout_s))
      fail_arg("timeout_s is {}; it must be a finite number of seconds > 0", timeout_s);
    if (!nccl_built())
      fail_arg("this ringattn_c was built without NCCL; rebuild it with RINGATTN_CUDA=ON where NCCL is found (set "
               "NCCL_ROOT), or pass ring.nccl NULL");
#if RINGATTN_HAVE_NCCL
    gpu = gpu_of(device);
#endif
    return int64_t(0);
  });
#if RINGATTN_HAVE_NCCL
  agree_on_gpus(*host, gpu);
  *out = make_nccl(*host, device, timeout_s).release();
#else
  (void)device;
#endif
}

}  // namespace
}  // namespace ringattn::op

using namespace ringattn;

extern "C" {

int32_t ringattn_c_features(void) {
  return (cuda_built() ? RINGATTN_FEATURE_CUDA : 0) | (op::nccl_built() ? RINGATTN_FEATURE_NCCL : 0);
}

int32_t ringattn_nccl_create(const ringattn_communicator* comm, int32_t device, double timeout_s,
                             ringattn_nccl** out, char* error, size_t error_size) {
  return op::guarded(error, error_size, [&] { op::create(comm, device, timeout_s, out); });
}

int32_t ringattn_nccl_destroy(ringattn_nccl* nccl, char* error, size_t error_size) {
  return op::guarded(error, error_size, [&] {
    if (nccl == nullptr) return;
    if (nccl->in_call) fail_arg("ring.nccl is in use by a ring call; destroy it after the call returns");
    const int previous = current_cuda_device();
    set_cuda_device(nccl->device);
    delete nccl;  // each transport ends its communicator, bounded by its timeout
    if (previous >= 0) set_cuda_device(previous);
  });
}

}  // extern "C"
