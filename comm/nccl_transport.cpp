// NCCL transport. One ncclSend/ncclRecv pair per hop inside one group on a communication stream;
// events order it after the compute that produced the block and order later compute after the
// receive. The communicator is non-blocking so that every wait is bounded: the host polls the
// completion event and ncclCommGetAsyncError under a deadline, and an error or a timeout aborts
// the communicator (ncclCommAbort, never destroy after an error). Host collectives go over the
// host transport the NCCL transport is made with (MPI under mpirun: comm/nccl_mpi.cpp).
#include "comm/nccl_transport.hpp"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/check.hpp"
#include "core/error.hpp"
#include "core/host.hpp"
#include "core/timer.hpp"

namespace ringattn {
namespace {

class NcclTransport final : public Transport {
 public:
  NcclTransport(std::unique_ptr<Transport> host, const NcclOptions& opts) : opts_(opts), host_(std::move(host)) {
    rank_ = host_->rank();
    size_ = host_->size();
    core::set_identity(rank_);
    RA_CHECK_CUDA(cudaGetDevice(&device_));
    // Rank 0's unique id reaches every rank through the host's allgather (a broadcast by another name).
    ncclUniqueId mine{}, id{};
    if (rank_ == 0) check(ncclGetUniqueId(&mine), "ncclGetUniqueId", __LINE__);
    std::vector<char> ids(sizeof(ncclUniqueId) * size_t(size_));
    host_->allgather(&mine, ids.data(), sizeof(ncclUniqueId));
    std::memcpy(&id, ids.data(), sizeof(id));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns; we poll with a deadline
    check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig", __LINE__);
    poll_until_ready("ncclCommInitRankConfig", opts_.first_hop_timeout_s);
    RA_CHECK_CUDA(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    RA_CHECK_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    // started_ and done_ time the exchange on the communication stream (the hidden share).
    RA_CHECK_CUDA(cudaEventCreate(&started_));
    RA_CHECK_CUDA(cudaEventCreate(&done_));
    int nccl_version = 0, cuda_version = 0;
    ncclGetVersion(&nccl_version);
    cudaRuntimeGetVersion(&cuda_version);
    if (rank_ == 0)
      spdlog::info("nccl transport: {} ranks, NCCL {}, CUDA runtime {}, host collectives over {}", size_, nccl_version,
                   cuda_version, host_->name());
    spdlog::debug("nccl transport: rank {} on host {} uses GPU {}", rank_, host_name(), device_);
  }

  ~NcclTransport() override {
    if (comm_) {
      if (failed_) {
        ncclCommAbort(comm_);
      } else {
        // A clean shutdown is still bounded: finalize is polled, and an error turns into abort.
        ncclResult_t st = ncclCommFinalize(comm_);
        const auto t0 = std::chrono::steady_clock::now();
        while ((st == ncclSuccess || st == ncclInProgress) && seconds_since(t0) < opts_.timeout_s) {
          if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) break;
          if (st != ncclInProgress) break;
          std::this_thread::yield();
        }
        if (st == ncclSuccess)
          ncclCommDestroy(comm_);
        else
          ncclCommAbort(comm_);
      }
    }
    if (done_) cudaEventDestroy(done_);
    if (started_) cudaEventDestroy(started_);
    if (ready_) cudaEventDestroy(ready_);
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool accepts_device_memory() const override { return true; }

  // Kept short: the message travels in the agreement's fixed-size record (the rank is added there).
  std::string check_backend_device(int backend_device) const override {
    if (backend_device < 0)
      return fmt::format("the NCCL transport moves GPU memory (GPU {}) but the backend is a host backend: use "
                         "make_cuda_backend({}), or the MPI transport for CPU ranks", device_, device_);
    if (backend_device != device_)
      return fmt::format("the CUDA backend is on GPU {} but the NCCL transport was made on GPU {}: make the backend "
                         "with make_cuda_backend(select_local_gpu(comm)) before make_nccl_transport(comm)",
                         backend_device, device_);
    return "";
  }

  void set_stream(void* stream) override {
    auto* s = static_cast<cudaStream_t>(stream);
#if CUDART_VERSION >= 12080
    int dev = -1;
    if (s != nullptr && cudaStreamGetDevice(s, &dev) == cudaSuccess && dev != device_)
      fail_runtime("rank {}: the compute stream given to the NCCL transport belongs to GPU {}: {}", rank_, dev,
                   check_backend_device(dev));
#endif
    compute_ = s;
  }

  void start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                           size_t recv_bytes) override {
    check_peers(to, from);
    if (pending_) fail_runtime("rank {}: start_exchange called twice without wait_exchange", rank_);
    RA_CHECK_CUDA(cudaEventRecord(ready_, compute_));
    RA_CHECK_CUDA(cudaStreamWaitEvent(comm_stream_, ready_, 0));
    RA_CHECK_CUDA(cudaEventRecord(started_, comm_stream_));
    if (size_ == 1) {
      if (send_bytes != recv_bytes)
        fail_arg("rank 0: a world of one receives what it sends ({} bytes sent, {} expected)", send_bytes, recv_bytes);
      if (send_bytes > 0)
        RA_CHECK_CUDA(cudaMemcpyAsync(recv, send, send_bytes, cudaMemcpyDeviceToDevice, comm_stream_));
    } else if (send_bytes > 0 || recv_bytes > 0) {
      // A side of 0 bytes posts nothing: its peer's matching side is 0 bytes too (the contract).
      check(ncclGroupStart(), "ncclGroupStart", __LINE__);
      if (send_bytes > 0) check(ncclSend(send, send_bytes, ncclInt8, to, comm_, comm_stream_), "ncclSend", __LINE__);
      if (recv_bytes > 0) check(ncclRecv(recv, recv_bytes, ncclInt8, from, comm_, comm_stream_), "ncclRecv", __LINE__);
      const ncclResult_t r = ncclGroupEnd();
      if (r != ncclInProgress) check(r, "ncclGroupEnd", __LINE__);
      poll_until_ready("ncclGroupEnd", timeout());
      bytes_sent_ += send_bytes;
    }
    RA_CHECK_CUDA(cudaEventRecord(done_, comm_stream_));
    pending_ = true;
    pending_send_ = send_bytes;
    pending_recv_ = recv_bytes;
    pending_to_ = to;
    pending_from_ = from;
  }

  void wait_exchange() override {
    if (!pending_) return;
    // Bounded wait: the receive's completion event, the communicator's async error, a deadline.
    const auto t0 = std::chrono::steady_clock::now();
    const double limit = timeout();
    for (;;) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) RA_CHECK_CUDA(q);
      ncclResult_t st = ncclSuccess;
      ncclCommGetAsyncError(comm_, &st);
      if (st != ncclSuccess && st != ncclInProgress) check(st, "ncclCommGetAsyncError (exchange)", __LINE__);
      if (seconds_since(t0) > limit) {
        failed_ = true;
        // Counted per transport (a warm-up exchange before a run counts too); the ring restates
        // the failure with its own hop.
        fail_runtime("rank {} on {}: exchange {}: timed out after {:.0f} s waiting for the NCCL exchange (send {} bytes "
                     "to rank {}, receive {} bytes from rank {})", rank_, host_name(), hops_ + 1, limit, pending_send_,
                     pending_to_, pending_recv_, pending_from_);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    RA_CHECK_CUDA(cudaStreamWaitEvent(compute_, done_, 0));
    // The exchange's own time, from the moment the block was ready to its arrival, as the
    // communication stream saw it: the runner's hidden share is 1 - exposed / this.
    float ms = 0;
    last_seconds_ = cudaEventElapsedTime(&ms, started_, done_) == cudaSuccess ? double(ms) * 1e-3 : -1.0;
    pending_ = false;
    ++hops_;
  }

  // The error path of a hop: the exchange's kernels may still read the send block and write the
  // receive block. Wait for them within the bound; when they do not finish (a peer has failed or
  // hangs), abort the communicator, which makes NCCL's kernels return, and wait for the stream
  // once more. False only when even that does not end them: the caller keeps the buffers.
  bool abandon_exchange() noexcept override {
    if (!pending_) return true;
    if (!failed_ && event_done_within(timeout())) {
      pending_ = false;
      return true;
    }
    failed_ = true;
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    if (!event_done_within(opts_.timeout_s)) return false;
    pending_ = false;
    return true;
  }

  // Host collectives go over the host transport, bounded by its own wait (device buffers move by
  // ncclSend/ncclRecv only; a device all-to-all, grouped sends and receives on the communication
  // stream, is not written yet).
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    host_->allgather(send, recv, bytes_per_rank);
  }
  void barrier() override { host_->barrier(); }
  void alltoall(const void* send, std::span<const size_t> send_bytes, void* recv,
                std::span<const size_t> recv_bytes) override {
    if (pending_) fail_runtime("rank {}: all-to-all while an exchange is in flight", rank_);
    host_->alltoall(send, send_bytes, recv, recv_bytes);
  }
  // Refused: groups of NCCL ranks would need ncclCommSplit (NCCL >= 2.18) on the non-blocking
  // communicator and a split of the host transport; neither is wired up.
  std::unique_ptr<Transport> split(int /*colour*/, int /*key*/) override {
    fail_runtime("rank {}: the NCCL transport cannot split into groups yet (ncclCommSplit, NCCL >= 2.18, is not wired "
                 "up); split an MPI transport instead", rank_);
  }
  uint64_t bytes_sent() const override { return bytes_sent_; }
  double last_exchange_seconds() const override { return last_seconds_; }

  // Abort the communicator first (never destroy after an error), then the host's job.
  [[noreturn]] void abort(int exit_code) override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    host_->abort(exit_code);
    std::_Exit(exit_code);  // the host's abort does not return; this keeps [[noreturn]] honest
  }

 private:
  double timeout() const { return hops_ == 0 ? opts_.first_hop_timeout_s : opts_.timeout_s; }

  // Whether the exchange's completion event fires within `limit` seconds (no throw).
  bool event_done_within(double limit) const noexcept {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return true;
      if (q != cudaErrorNotReady || seconds_since(t0) > limit) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void check(ncclResult_t r, const char* what, int line) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    failed_ = true;
    const char* last = comm_ ? ncclGetLastError(comm_) : "";
    const std::string text = std::string(ncclGetErrorString(r)) + ((last && *last) ? std::string(": ") + last : "");
    core::throw_call_failed("NCCL", what, __FILE__, line, text.c_str(), (long long)r);
  }

  // Non-blocking communicators report ncclInProgress until an operation is issued.
  void poll_until_ready(const char* what, double limit) {
    const auto t0 = std::chrono::steady_clock::now();
    ncclResult_t st = ncclInProgress;
    while (true) {
      check(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError", __LINE__);
      if (st != ncclInProgress) break;
      if (seconds_since(t0) > limit) {
        failed_ = true;
        fail_runtime("rank {} on {}: {} still in progress after {:.0f} s", rank_, host_name(), what, limit);
      }
      std::this_thread::yield();
    }
    check(st, what, __LINE__);
  }

  NcclOptions opts_;
  std::unique_ptr<Transport> host_;
  int rank_ = 0, size_ = 1, device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr, compute_ = nullptr;
  cudaEvent_t ready_ = nullptr, started_ = nullptr, done_ = nullptr;
  double last_seconds_ = -1.0;
  bool pending_ = false, failed_ = false;
  size_t pending_send_ = 0, pending_recv_ = 0;
  int pending_to_ = 0, pending_from_ = 0;  // the peers of the exchange posted last
  uint64_t bytes_sent_ = 0;
  int hops_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(std::unique_ptr<Transport> host, const NcclOptions& opts) {
  if (host == nullptr) fail_arg("make_nccl_transport: the host transport is missing (a null pointer)");
  return std::make_unique<NcclTransport>(std::move(host), opts);
}

}  // namespace ringattn
