// The MPI transport: ring exchanges with the neighbours and the small collectives, over a private
// duplicate of the caller's communicator. Host buffers only.
//
// Overlap: Open MPI moves a large message over shared memory in a rendezvous that only advances
// inside MPI calls, so an MPI_Isend/MPI_Irecv pair posted before a compute that makes no MPI
// call mostly moves in MPI_Waitall, after the compute. The helper-thread mode runs a blocking
// MPI_Sendrecv on a thread of its own, which progresses while the rank computes (and can time the
// transfer). It needs MPI_THREAD_SERIALIZED: the main thread makes no MPI call while an exchange
// is in flight (wait_exchange joins it first).
//
// Error paths: an exchange stays "in flight" until its requests (or the helper's MPI_Sendrecv)
// have completed; abandon_exchange completes it within the same bound, and a transport that timed
// out (stuck) reports that its buffers may still be written. Collectives run on buffers the
// transport owns (comm/collective_buffers.hpp), never on the caller's.
#include "comm/mpi_transport.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

#include "comm/collective_buffers.hpp"
#include "comm/mpi_alltoallv.hpp"
#include "core/check.hpp"
#include "core/error.hpp"
#include "core/host.hpp"
#include "core/settings.hpp"
#include "core/timer.hpp"

namespace ringattn {
namespace {

// MPI counts are int: larger blocks go in pieces of at most 1 GiB.
constexpr size_t kMaxPiece = size_t(1) << 30;
constexpr int kExchangeTag = 7100;

// Bound on every wait for another rank, so a peer that hangs ends the job with a message instead
// of leaving this rank waiting forever: `requested` seconds when positive (the CLI's --timeout),
// else the process's RINGATTN_MPI_TIMEOUT_S (core/settings.hpp), else 300.
double exchange_timeout_s(double requested) {
  return settings().timeout_s(requested > 0 ? std::optional<double>(requested) : std::nullopt);
}

// The first exchange also pays connection set-up (shared-memory segments, sockets, IB queue
// pairs on first contact), so it gets this many times the bound.
constexpr double kFirstExchangeFactor = 3.0;
// While that allowance runs, a later wait must not expire before it: a rank that stops at its
// first exchange leaves its ring neighbour waiting there (3x), and the ranks behind it waiting at
// later exchanges or in a collective. Exchange k (2, 3, ...) waits at least until the first
// exchange's post + (3 + min(k, 2P) / 2P) x the bound, a collective until + kGraceCollective x:
// the nearest rank to the stop, waiting at the lowest count, reports first and names it.
constexpr double kGraceCollective = 4.5;

// Auto: the process's RINGATTN_MPI_PROGRESS (core/settings.hpp) when set, else by thread level.
MpiProgress resolve_progress(MpiProgress requested, int thread_level) {
  if (requested == MpiProgress::Auto) requested = settings().mpi_progress.get();
  if (requested == MpiProgress::HelperThread && thread_level < MPI_THREAD_SERIALIZED)
    fail_arg("the MPI helper-thread progress needs MPI_Init_thread with MPI_THREAD_SERIALIZED or more (this process "
             "has level {}); initialize MPI with MPI_Init_thread or use the nonblocking mode", thread_level);
  if (requested == MpiProgress::Auto)
    requested = thread_level >= MPI_THREAD_SERIALIZED ? MpiProgress::HelperThread : MpiProgress::Nonblocking;
  return requested;
}

// The MPI transports alive in this process, and how many run a helper thread. Below
// MPI_THREAD_MULTIPLE a helper thread's MPI calls must overlap no other thread's, so a helper-thread
// transport cannot live beside another MPI transport (the ring backward runs two rings at once).
struct LiveTransports {
  std::mutex mu;
  int all = 0, helpers = 0;
};
LiveTransports& live_transports() {
  static LiveTransports l;
  return l;
}

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, MpiProgress progress, double timeout_s) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) fail_arg("make_mpi_transport: MPI is not initialized (call MPI_Init_thread first)");
    RA_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
    RA_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    RA_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    core::set_identity(rank_);
    RA_CHECK_MPI(MPI_Comm_size(comm_, &size_));
    int level = MPI_THREAD_SINGLE;
    RA_CHECK_MPI(MPI_Query_thread(&level));
    mode_ = resolve_progress(progress, level);
    cuda_aware_ = mpi_library_cuda_aware();
    register_live(level);
    timeout_s_ = exchange_timeout_s(timeout_s);
    requests_.reserve(16);  // no allocation on the first hop
    statuses_.reserve(16);
    expected_.reserve(8);
    if (mode_ == MpiProgress::HelperThread) helper_ = std::thread([this] { helper_loop(); });
  }

  ~MpiTransport() override {
    {
      std::lock_guard<std::mutex> lk(live_transports().mu);
      --live_transports().all;
      if (mode_ == MpiProgress::HelperThread) --live_transports().helpers;
    }
    if (stuck_) {
      // An exchange timed out: the helper may sit in MPI_Sendrecv for good and the communicator
      // is unusable. Leave both; the process is about to end (abort) anyway. A timed-out
      // all-to-all may still read its counts: they stay allocated too.
      if (helper_.joinable()) helper_.detach();
      (void)a2a_.release();
      return;
    }
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

  // Counts this transport among the live ones; refuses it (freeing the communicator) when its MPI
  // calls could overlap another transport's helper thread below MPI_THREAD_MULTIPLE.
  void register_live(int level) {
    LiveTransports& l = live_transports();
    std::lock_guard<std::mutex> lk(l.mu);
    const bool helper = mode_ == MpiProgress::HelperThread;
    if (level < MPI_THREAD_MULTIPLE && (l.helpers > 0 || (helper && l.all > 0))) {
      MPI_Comm_free(&comm_);
      fail_arg("a second MPI transport beside one that runs a helper thread needs MPI_THREAD_MULTIPLE (this process "
               "has thread level {}): initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...), or use the "
               "nonblocking mode for every transport (RINGATTN_MPI_PROGRESS=nonblocking)", level);
    }
    ++l.all;
    if (helper) ++l.helpers;
  }

  std::string name() const override {
    std::string n = mode_ == MpiProgress::HelperThread ? "mpi (helper thread" : "mpi (nonblocking";
    return n + (cuda_aware_ ? ", CUDA-aware)" : ")");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Device buffers go to MPI as they are when the library moves them itself.
  bool accepts_device_memory() const override { return cuda_aware_; }

  void start_peer_exchange(int to, const void* send, size_t send_bytes, int from, void* recv,
                           size_t recv_bytes) override {
    check_peers(to, from);
    if (in_flight_) fail_runtime("rank {}: start_exchange while an exchange is in flight (call wait_exchange first)", rank_);
    if (send == recv && send_bytes > 0 && recv_bytes > 0)
      fail_arg("rank {}: start_exchange needs distinct send and receive buffers", rank_);
    if (stuck_) fail_runtime("rank {}: start_exchange after an exchange or collective timed out", rank_);
    in_flight_ = true;  // from here on: whatever part of the exchange got posted is outstanding
    ++exchanges_;
    pending_send_ = send_bytes;
    pending_recv_ = recv_bytes;
    pending_to_ = to;
    pending_from_ = from;
    bytes_sent_ += send_bytes;
    posted_ = std::chrono::steady_clock::now();
    if (exchanges_ == 1) first_posted_ = posted_;
    if (mode_ == MpiProgress::HelperThread) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        job_ = Job{to, send, send_bytes, from, recv, recv_bytes};
        has_job_ = true;
        done_ = false;
        error_ = nullptr;
      }
      cv_.notify_all();
      return;
    }
    requests_.clear();
    expected_.clear();
    // Receives first (requests_[0, pieces)), so the matching sends find posted buffers. Each
    // request is kept as soon as it exists, so a failure half-way leaves no posted request
    // unknown to abandon_exchange. A size of 0 posts nothing, on both sides.
    for (size_t off = 0, piece = 0; off < recv_bytes; off += kMaxPiece, ++piece) {
      const int n = int(std::min(kMaxPiece, recv_bytes - off));
      expected_.push_back(n);
      requests_.push_back(MPI_REQUEST_NULL);
      RA_CHECK_MPI(MPI_Irecv(static_cast<char*>(recv) + off, n, MPI_BYTE, from, kExchangeTag + int(piece), comm_,
                             &requests_.back()));
    }
    for (size_t off = 0, piece = 0; off < send_bytes; off += kMaxPiece, ++piece) {
      const int n = int(std::min(kMaxPiece, send_bytes - off));
      requests_.push_back(MPI_REQUEST_NULL);
      RA_CHECK_MPI(MPI_Isend(static_cast<const char*>(send) + off, n, MPI_BYTE, to, kExchangeTag + int(piece),
                             comm_, &requests_.back()));
    }
  }

  void wait_exchange() override {
    if (!in_flight_) return;
    if (stuck_) fail_runtime("rank {}: wait_exchange after an exchange or collective timed out", rank_);
    if (mode_ == MpiProgress::HelperThread) {
      std::unique_lock<std::mutex> lk(mu_);
      // Measured from the post, like the nonblocking mode: the compute in between counts.
      const auto deadline = posted_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                          std::chrono::duration<double>(exchange_limit_s()));
      if (!cv_.wait_until(lk, deadline, [this] { return done_; })) timed_out();
      in_flight_ = false;  // the helper has left MPI_Sendrecv: it touches neither buffer again
      last_seconds_ = job_seconds_;
      if (error_) std::rethrow_exception(error_);
      return;
    }
    // MPI_Testall in a loop instead of MPI_Waitall, so the wait is bounded.
    statuses_.resize(requests_.size());
    int flag = 0;
    for (;;) {
      const int rc = MPI_Testall(int(requests_.size()), requests_.data(), &flag, statuses_.data());
      if (rc != MPI_SUCCESS) stuck_ = true;  // which requests are still active is unknown
      RA_CHECK_MPI(rc);
      if (flag) break;
      if (seconds_since(posted_) > exchange_limit_s())
        timed_out();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    in_flight_ = false;
    for (size_t i = 0; i < expected_.size(); ++i) check_received(statuses_[i], expected_[i]);
    last_seconds_ = -1.0;  // completion was only observed here, after the compute: not a transfer time
  }

  // Completes the outstanding exchange within the exchange bound (never cancels: the peers of a
  // rank that failed mid-hop are healthy and complete their side, and a cancelled receive would
  // leave the neighbour's send pending until its own timeout).
  bool abandon_exchange() noexcept override {
    if (!in_flight_) return true;
    try {
      wait_exchange();
    } catch (...) {
      // A failed exchange (a short block, an MPI error) may still have completed: in_flight_ says.
    }
    return !in_flight_;
  }

  double last_exchange_seconds() const override { return last_seconds_; }

  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    if (in_flight_) fail_runtime("rank {}: allgather while an exchange is in flight", rank_);
    if (bytes_per_rank > size_t(INT_MAX))
      fail_arg("rank {}: allgather of {} bytes per rank exceeds MPI's int count ({})", rank_, bytes_per_rank, INT_MAX);
    if (stuck_) fail_runtime("rank {}: allgather after an exchange or collective timed out", rank_);
    const size_t total = bytes_per_rank * size_t(size_);
    MPI_Request rq;
    RA_CHECK_MPI(MPI_Iallgather(coll_.send(send, bytes_per_rank), int(bytes_per_rank), MPI_BYTE,
                                coll_.recv(total), int(bytes_per_rank), MPI_BYTE, comm_, &rq));
    wait_collective(rq, "allgather");
    coll_.copy_out(recv, total);
  }

  void barrier() override {
    if (stuck_) fail_runtime("rank {}: barrier after an exchange or collective timed out", rank_);
    MPI_Request rq;
    RA_CHECK_MPI(MPI_Ibarrier(comm_, &rq));
    wait_collective(rq, "barrier");
  }

  void alltoall(const void* send, std::span<const size_t> send_bytes, void* recv,
                std::span<const size_t> recv_bytes) override {
    if (in_flight_) fail_runtime("rank {}: all-to-all while an exchange is in flight", rank_);
    check_alltoall_counts(send_bytes, recv_bytes);
    if (stuck_) fail_runtime("rank {}: all-to-all after an exchange or collective timed out", rank_);
    MPI_Request rq = post_alltoallv(comm_, rank_, coll_, *a2a_, send, send_bytes, recv_bytes);
    wait_collective(rq, "all-to-all");
    coll_.copy_out(recv, a2a_->recv_total);
  }

  // The colours go round first (a bounded allgather), so a bad one is refused on every rank and no
  // rank waits in MPI_Comm_split for one that stopped before it.
  std::unique_ptr<Transport> split(int colour, int key) override {
    if (in_flight_) fail_runtime("rank {}: split while an exchange is in flight", rank_);
    std::vector<int> colours(size_t(size_), 0);
    allgather(&colour, colours.data(), sizeof(int));
    check_colours(colours);
    MPI_Comm sub = MPI_COMM_NULL;
    RA_CHECK_MPI(MPI_Comm_split(comm_, colour, key, &sub));
    try {
      auto t = make_mpi_transport(sub, mode_, timeout_s_);  // over a duplicate of `sub`
      MPI_Comm_free(&sub);
      return t;
    } catch (...) {
      MPI_Comm_free(&sub);
      throw;
    }
  }

  uint64_t bytes_sent() const override { return bytes_sent_; }

  [[noreturn]] void abort(int exit_code) override {
    MPI_Abort(comm_, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

 private:
  struct Job {
    int to = 0;
    const void* send = nullptr;
    size_t send_bytes = 0;
    int from = 0;
    void* recv = nullptr;
    size_t recv_bytes = 0;
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
      const double secs = seconds_since(posted_);
      lk.lock();
      job_seconds_ = secs;
      error_ = err;
      done_ = true;
      cv_.notify_all();
    }
  }

  void run_sendrecv(const Job& job) {
    // Piece i of the send pairs with piece i of the receive; the shorter side sends or receives
    // nothing (count 0 on no tag) once it runs out.
    for (size_t off = 0, piece = 0; off < std::max(job.send_bytes, job.recv_bytes); off += kMaxPiece, ++piece) {
      const int ns = off < job.send_bytes ? int(std::min(kMaxPiece, job.send_bytes - off)) : 0;
      const int nr = off < job.recv_bytes ? int(std::min(kMaxPiece, job.recv_bytes - off)) : 0;
      const int tag = kExchangeTag + int(piece);
      MPI_Status status;
      if (ns > 0 && nr > 0)
        RA_CHECK_MPI(MPI_Sendrecv(static_cast<const char*>(job.send) + off, ns, MPI_BYTE, job.to, tag,
                                  static_cast<char*>(job.recv) + off, nr, MPI_BYTE, job.from, tag, comm_, &status));
      else if (ns > 0)
        RA_CHECK_MPI(MPI_Send(static_cast<const char*>(job.send) + off, ns, MPI_BYTE, job.to, tag, comm_));
      else
        RA_CHECK_MPI(MPI_Recv(static_cast<char*>(job.recv) + off, nr, MPI_BYTE, job.from, tag, comm_, &status));
      if (nr > 0) check_received(status, nr);
    }
  }

  // A peer that sends fewer bytes than this rank expects does not fail the receive in MPI; it
  // would leave part of the block stale. (More bytes fail the call itself: MPI_ERR_TRUNCATE.)
  void check_received(const MPI_Status& status, int expected) const {
    int got = 0;
    RA_CHECK_MPI(MPI_Get_count(&status, MPI_BYTE, &got));
    if (got != expected)
      fail_runtime("rank {} on {}: received {} bytes from rank {} but expected {}: the ranks disagree on the size of "
                   "the block this exchange carries (a corrupt or mismatched peer)", rank_, host_name(), got,
                   pending_from_, expected);
  }

  // A collective is bounded like an exchange: a rank that never joins must not hang the others.
  void wait_collective(MPI_Request& rq, const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    const double limit = limit_s(t0, kGraceCollective);
    int flag = 0;
    for (;;) {
      const int rc = MPI_Test(&rq, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) stuck_ = true, coll_.keep();  // the collective's state is unknown
      RA_CHECK_MPI(rc);
      if (flag) return;
      if (seconds_since(t0) > limit) {
        stuck_ = true;
        coll_.keep();  // MPI may still write the collective's buffers
        fail_runtime("rank {} on {}: {} did not complete within {} s (--timeout, RINGATTN_MPI_TIMEOUT_S); some rank "
                     "has stopped before it or hangs", rank_, host_name(), what, fmt::format("{:.4g}", limit));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Seconds a wait that began at `start` may last: the bound, or longer to end no earlier than
  // `factor` x the bound after the first exchange's post (none yet: the bound).
  double limit_s(std::chrono::steady_clock::time_point start, double factor) const {
    if (exchanges_ == 0) return timeout_s_;
    const double after_first = std::chrono::duration<double>(start - first_posted_).count();
    return std::max(timeout_s_, factor * timeout_s_ - after_first);
  }
  double exchange_limit_s() const {
    if (exchanges_ == 1) return kFirstExchangeFactor * timeout_s_;
    const double k = double(std::min<uint64_t>(exchanges_, 2 * uint64_t(size_)));
    return limit_s(posted_, kFirstExchangeFactor + k / (2.0 * size_));
  }

  [[noreturn]] void timed_out() {
    stuck_ = true;
    const int next = pending_to_, prev = pending_from_;
    const std::string peers = next == prev ? fmt::format("rank {}", prev) : fmt::format("rank {} or rank {}", prev, next);
    const double limit = exchange_limit_s();
    const char* why = exchanges_ == 1           ? " (the first exchange's allowance)"
                      : limit > timeout_s_ * 1.0001 ? " (waiting out the first exchange's allowance)"
                                                 : "";
    fail_runtime("rank {} on {}: exchange {} (send {} bytes to rank {}, receive {} bytes from rank {}) did not "
                 "complete within {:.4g} s{} (--timeout, RINGATTN_MPI_TIMEOUT_S): {} has stopped or hangs", rank_,
                 host_name(), exchanges_, pending_send_, next, pending_recv_, prev, limit, why, peers);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = -1, size_ = 0;
  MpiProgress mode_ = MpiProgress::Nonblocking;
  bool in_flight_ = false;
  uint64_t bytes_sent_ = 0;
  double last_seconds_ = -1.0;
  std::chrono::steady_clock::time_point posted_;
  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
  std::vector<int> expected_;
  double timeout_s_ = 300.0;
  uint64_t exchanges_ = 0;
  std::chrono::steady_clock::time_point first_posted_{};  // the first exchange's post
  size_t pending_send_ = 0, pending_recv_ = 0;
  int pending_to_ = 0, pending_from_ = 0;  // the peers of the exchange posted last
  bool stuck_ = false;
  CollectiveBuffers coll_;
  std::unique_ptr<AlltoallvCounts> a2a_ = std::make_unique<AlltoallvCounts>();  // of the last all-to-all

  bool cuda_aware_ = false;
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

bool mpi_library_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

std::unique_ptr<Transport> make_mpi_transport(MPI_Comm comm, MpiProgress progress, double timeout_s) {
  return std::make_unique<MpiTransport>(comm, progress, timeout_s);
}

}  // namespace ringattn
