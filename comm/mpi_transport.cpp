// The MPI transport: ring exchanges with the neighbours and the small collectives, over a private
// duplicate of the caller's communicator. Host buffers only.
//
// Overlap: Open MPI moves a large message over shared memory in a rendezvous that only advances
// inside MPI calls, so an MPI_Isend/MPI_Irecv pair posted before a compute that makes no MPI
// call mostly moves in MPI_Waitall, after the compute. The helper-thread mode runs a blocking
// MPI_Sendrecv on a thread of its own, which progresses while the rank computes (and can time the
// transfer). It needs MPI_THREAD_SERIALIZED: the main thread makes no MPI call while an exchange
// is in flight (wait_exchange joins it first).
#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_check.hpp"
#include "ringattn/ring.hpp"

namespace ringattn {
namespace {

// MPI counts are int: larger blocks go in pieces of at most 1 GiB.
constexpr size_t kMaxPiece = size_t(1) << 30;
constexpr int kExchangeTag = 7100;

MpiProgress progress_from_env(MpiProgress requested, int thread_level) {
  if (requested == MpiProgress::Auto) {
    const char* env = std::getenv("RINGATTN_MPI_PROGRESS");
    const std::string v = env ? env : "";
    if (v == "thread") requested = MpiProgress::HelperThread;
    else if (v == "nonblocking") requested = MpiProgress::Nonblocking;
    else if (!v.empty())
      fail_arg("RINGATTN_MPI_PROGRESS='{}' is not understood: allowed are thread, nonblocking (or unset)", v);
  }
  if (requested == MpiProgress::HelperThread && thread_level < MPI_THREAD_SERIALIZED)
    fail_arg("the MPI helper-thread progress needs MPI_Init_thread with MPI_THREAD_SERIALIZED or more (this process "
             "has level {}); initialize MPI with MPI_Init_thread or use the nonblocking mode", thread_level);
  if (requested == MpiProgress::Auto)
    requested = thread_level >= MPI_THREAD_SERIALIZED ? MpiProgress::HelperThread : MpiProgress::Nonblocking;
  return requested;
}

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, MpiProgress progress) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) fail_arg("make_mpi_transport: MPI is not initialized (call MPI_Init_thread first)");
    RINGATTN_MPI_CHECK(MPI_Comm_dup(comm, &comm_), -1);
    RINGATTN_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), -1);
    RINGATTN_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), -1);
    RINGATTN_MPI_CHECK(MPI_Comm_size(comm_, &size_), rank_);
    int level = MPI_THREAD_SINGLE;
    RINGATTN_MPI_CHECK(MPI_Query_thread(&level), rank_);
    mode_ = progress_from_env(progress, level);
    requests_.reserve(16);  // no allocation on the first hop
    if (mode_ == MpiProgress::HelperThread) helper_ = std::thread([this] { helper_loop(); });
  }

  ~MpiTransport() override {
    if (helper_.joinable()) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      helper_.join();
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  std::string name() const override {
    return mode_ == MpiProgress::HelperThread ? "mpi (helper thread)" : "mpi (nonblocking)";
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool accepts_device_memory() const override { return false; }

  void start_exchange(const void* send, void* recv, size_t bytes) override {
    if (in_flight_) fail_runtime("rank {}: start_exchange while an exchange is in flight (call wait_exchange first)", rank_);
    if (send == recv) fail_arg("rank {}: start_exchange needs distinct send and receive buffers", rank_);
    in_flight_ = true;
    bytes_sent_ += bytes;
    posted_ = std::chrono::steady_clock::now();
    if (mode_ == MpiProgress::HelperThread) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        job_ = Job{send, recv, bytes};
        has_job_ = true;
        done_ = false;
        error_ = nullptr;
      }
      cv_.notify_all();
      return;
    }
    requests_.clear();
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    for (size_t off = 0, piece = 0; off < bytes; off += kMaxPiece, ++piece) {
      const int n = int(std::min(kMaxPiece, bytes - off));
      MPI_Request rq[2];
      // Receive first, so the matching send finds a posted buffer.
      RINGATTN_MPI_CHECK(MPI_Irecv(static_cast<char*>(recv) + off, n, MPI_BYTE, prev, kExchangeTag + int(piece), comm_,
                                   &rq[0]), rank_);
      RINGATTN_MPI_CHECK(MPI_Isend(static_cast<const char*>(send) + off, n, MPI_BYTE, next, kExchangeTag + int(piece),
                                   comm_, &rq[1]), rank_);
      requests_.push_back(rq[0]);
      requests_.push_back(rq[1]);
    }
  }

  void wait_exchange() override {
    if (!in_flight_) return;
    in_flight_ = false;
    if (mode_ == MpiProgress::HelperThread) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return done_; });
      last_seconds_ = job_seconds_;
      if (error_) std::rethrow_exception(error_);
      return;
    }
    RINGATTN_MPI_CHECK(MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), rank_);
    last_seconds_ = -1.0;  // completion was only observed here, after the compute: not a transfer time
  }

  double last_exchange_seconds() const override { return last_seconds_; }

  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    if (in_flight_) fail_runtime("rank {}: allgather while an exchange is in flight", rank_);
    if (bytes_per_rank > size_t(INT_MAX))
      fail_arg("rank {}: allgather of {} bytes per rank exceeds MPI's int count ({})", rank_, bytes_per_rank, INT_MAX);
    RINGATTN_MPI_CHECK(MPI_Allgather(send, int(bytes_per_rank), MPI_BYTE, recv, int(bytes_per_rank), MPI_BYTE, comm_),
                       rank_);
  }

  void barrier() override { RINGATTN_MPI_CHECK(MPI_Barrier(comm_), rank_); }

  uint64_t bytes_sent() const override { return bytes_sent_; }

  [[noreturn]] void abort(int exit_code) override {
    MPI_Abort(comm_, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

 private:
  struct Job {
    const void* send = nullptr;
    void* recv = nullptr;
    size_t bytes = 0;
  };

  void helper_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [this] { return stop_ || has_job_; });
      if (stop_) return;
      const Job job = job_;
      has_job_ = false;
      lk.unlock();
      std::exception_ptr err;
      try {
        run_sendrecv(job);
      } catch (...) {
        err = std::current_exception();
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - posted_).count();
      lk.lock();
      job_seconds_ = secs;
      error_ = err;
      done_ = true;
      cv_.notify_all();
    }
  }

  void run_sendrecv(const Job& job) {
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    for (size_t off = 0, piece = 0; off < job.bytes; off += kMaxPiece, ++piece) {
      const int n = int(std::min(kMaxPiece, job.bytes - off));
      RINGATTN_MPI_CHECK(MPI_Sendrecv(static_cast<const char*>(job.send) + off, n, MPI_BYTE, next,
                                      kExchangeTag + int(piece), static_cast<char*>(job.recv) + off, n, MPI_BYTE, prev,
                                      kExchangeTag + int(piece), comm_, MPI_STATUS_IGNORE), rank_);
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = -1, size_ = 0;
  MpiProgress mode_ = MpiProgress::Nonblocking;
  bool in_flight_ = false;
  uint64_t bytes_sent_ = 0;
  double last_seconds_ = -1.0;
  std::chrono::steady_clock::time_point posted_;
  std::vector<MPI_Request> requests_;

  // Helper thread state, guarded by mu_.
  std::thread helper_;
  std::mutex mu_;
  std::condition_variable cv_;
  Job job_;
  bool has_job_ = false, done_ = false, stop_ = false;
  double job_seconds_ = -1.0;
  std::exception_ptr error_;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(MPI_Comm comm, MpiProgress progress) {
  return std::make_unique<MpiTransport>(comm, progress);
}

}  // namespace ringattn
