// The ring runner (ARCHITECTURE.md, "Data flow of one ring run"): each rank keeps its queries and
// an fp32 (o, lse) state; the K/V blocks travel around the ring, one hop at a time, and each hop's
// exchange is posted before the hop's compute so the two overlap. Backend- and transport-agnostic.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "ringattn/agree.hpp"
#include "core/error.hpp"
#include "core/host.hpp"
#include "ringattn/fault.hpp"
#include "ringattn/flight_recorder.hpp"
#include "ringattn/log.hpp"
#include "ringattn/ring.hpp"
#include "ringattn/ring_buffers.hpp"
#include "ringattn/schedule.hpp"

namespace ringattn {
namespace {

using Clock = std::chrono::steady_clock;

// The local checks of a ring run; "" when the tensors fit the problem and the layout.
std::string check_ring_tensors(const GlobalProblem& p, const LocalTensors& x, int64_t tokens) {
  for (const auto& [what, v, heads] : {std::tuple{"q", &x.q, p.q_heads}, std::tuple{"k", &x.k, p.kv_heads},
                                       std::tuple{"v", &x.v, p.kv_heads}, std::tuple{"out", &x.out, p.q_heads}})
    if (std::string e = check_view(what, *v, p.batch, heads, tokens, p.head_dim, p.dtype); !e.empty()) return e;
  return "";
}

void empty_unwritten(std::vector<char>& written, Backend& b, const StateView& state, int64_t r0 = 0, int64_t n = -1);

// For every call of every hop: whether it is the last call on its query rows (a later call
// starting at the same row reaches the same run of rows: the schedule's query segments).
std::vector<std::vector<char>> final_calls(const RingSchedule& sched) {
  std::vector<std::vector<char>> last(sched.hops().size());
  std::vector<int64_t> seen;
  for (size_t s = sched.hops().size(); s-- > 0;) {
    const auto& calls = sched.hops()[s].calls;
    last[s].assign(calls.size(), 0);
    for (size_t i = calls.size(); i-- > 0;) {
      const int64_t r0 = calls[i].q_row0;
      if (std::find(seen.begin(), seen.end(), r0) == seen.end()) {
        last[s][i] = 1;
        seen.push_back(r0);
      }
    }
  }
  return last;
}

// Whether rows [r0, r0 + n) of the state are all unwritten (then the call writes them and they
// count as written). Rows partly written are first emptied where unwritten, so the call folds.
bool first_touch(std::vector<char>& written, int64_t r0, int64_t n, Backend& b, const StateView& state) {
  const auto first = written.begin() + r0, last = first + n;
  const bool none = std::none_of(first, last, [](char w) { return w != 0; });
  if (!none) empty_unwritten(written, b, state, r0, n);
  std::fill(first, last, char(1));
  return none;
}

// Empties the unwritten rows of [r0, r0 + n) (all rows by default), in maximal runs.
void empty_unwritten(std::vector<char>& written, Backend& b, const StateView& state, int64_t r0, int64_t n) {
  if (n < 0) n = int64_t(written.size()) - r0;
  for (int64_t i = r0; i < r0 + n;) {
    if (written[size_t(i)]) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j < r0 + n && !written[size_t(j)]) written[size_t(j++)] = 1;
    b.fill_empty(state.rows(i, j - i));
    i = j;
  }
}

// A transport failure, restated with what the ring was doing: the hop, the peers and the bytes
// (the transport knows its own exchange count, not the runner's hop).
[[noreturn]] void hop_failed(int r, int P, int s, size_t bytes, const char* stage, const std::exception& e) {
  const std::string who = fmt::format("rank {} on {}: ", r, host_name());
  std::string cause = e.what();
  if (cause.rfind(who, 0) == 0) cause.erase(0, who.size());  // said once is enough
  throw RuntimeError(fmt::format("{}hop {} of {}: {} (send {} bytes to rank {}, receive from rank {}) failed: {}", who,
                                 s, P, stage, bytes, (r + 1) % P, (r + P - 1) % P, cause));
}

// The error path of a hop. An exception while an exchange is outstanding (from the backend, a
// packing copy, an allocation, or the transport itself) must not free the buffers that MPI or
// NCCL may still write or read. Declared after those buffers, so it runs first while unwinding:
// it ends the exchange (Transport::abandon_exchange, bounded) and, when the transport gave up,
// keeps the buffers allocated for good (the error then ends the process: the CLI aborts the job).
class ExchangeGuard {
 public:
  ExchangeGuard(Transport& t, DeviceBuffer (&blocks)[2], std::vector<unsigned char> (&host)[2])
      : t_(t), blocks_(blocks), host_(host) {}
  ExchangeGuard(const ExchangeGuard&) = delete;
  ExchangeGuard& operator=(const ExchangeGuard&) = delete;
  ~ExchangeGuard() {
    if (!outstanding_ || t_.abandon_exchange()) return;
    for (int i = 0; i < 2; ++i) {
      blocks_[i].release();
      (void)new std::vector<unsigned char>(std::move(host_[i]));  // kept, not freed: see above
    }
  }
  void posting() { outstanding_ = true; }     // before start_exchange: a partial post counts
  void completed() { outstanding_ = false; }  // after wait_exchange returned

 private:
  Transport& t_;
  DeviceBuffer (&blocks_)[2];
  std::vector<unsigned char> (&host_)[2];
  bool outstanding_ = false;
};

// The flash calls of one hop on the block (kb, vb). The first call on a run of query rows writes
// the state, later calls fold; the last call on a run also writes the final output.
void compute_hop(const HopPlan& plan, const std::vector<char>& final_call, const FlashParams& base,
                 const LocalTensors& x, const TensorView& kb, const TensorView& vb, std::vector<char>& written,
                 std::vector<char>& finalized, Backend& b) {
  for (const PairCall& c : plan.calls) {
    FlashParams f = base;
    f.q = x.q.rows(c.q_row0, c.q_rows);
    f.state = base.state.rows(c.q_row0, c.q_rows);
    f.mode = first_touch(written, c.q_row0, c.q_rows, b, base.state) ? StateMode::Write : StateMode::Fold;
    if (final_call[size_t(&c - plan.calls.data())]) {
      f.out = x.out.rows(c.q_row0, c.q_rows);
      std::fill(finalized.begin() + c.q_row0, finalized.begin() + c.q_row0 + c.q_rows, char(1));
    }
    f.k = kb.rows(c.k_row0, c.k_rows);
    f.v = vb.rows(c.k_row0, c.k_rows);
    f.mask = MaskSpec{c.causal, c.q_offset};
    b.flash(f);
  }
  b.synchronize();
}

// Rows no call reached: the empty state, cast into the output (none in self-attention).
void finish_rows(std::vector<char>& written, const std::vector<char>& finalized, Backend& b, const StateView& state,
                 const TensorView& out) {
  empty_unwritten(written, b, state);
  const int64_t T = int64_t(finalized.size());
  for (int64_t i = 0; i < T;) {
    if (finalized[size_t(i)]) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j < T && !finalized[size_t(j)]) ++j;
    b.finalize(FinalizeParams{state.rows(i, j - i), out.rows(i, j - i)});
    i = j;
  }
  b.synchronize();
}

}  // namespace

void validate_run_options(const RunOptions& opt) {
  for (const auto& [flag, v] : {std::pair{"--tile-q", opt.tile_q}, std::pair{"--tile-k", opt.tile_k}})
    if (v < 0 || v > kMaxTile)
      fail_arg("{} {} is out of range: a CPU tile is 1 to {} rows, or 0 for the default", flag, v, kMaxTile);
  if (opt.decode_splits < 0) fail_arg("decode splits {} must be >= 0 (0: the default)", opt.decode_splits);
}

uint64_t expected_ring_bytes(const GlobalProblem& p, int world) {
  const uint64_t block = 2ull * uint64_t(p.batch * p.kv_heads * (p.kv_len / world) * p.head_dim) *
                         uint64_t(dtype_size(p.dtype));
  return uint64_t(world - 1) * block;
}

double RankStats::hidden_fraction() const {
  if (transfer_s <= 0 || hops.size() < 2) return -1.0;
  return std::clamp(1.0 - exposed_comm_s / transfer_s, 0.0, 1.0);
}

RankStats run_ring_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                             const RunOptions& opt) {
  const auto t_start = Clock::now();
  const int P = t.size(), r = t.rank();
  if (!p.is_ring())
    fail_arg("ring attention needs self-attention (q_len == kv_len, q_offset 0); got q_len={}, kv_len={}, "
             "q_offset={}: use run_distributed_decode", p.q_len, p.kv_len, p.resolved_q_offset());
  // Rejected locally, before any communication: identical on every rank that has this problem.
  validate_problem(p, P);
  validate_run_options(opt);
  const RingSchedule sched(p.sharding, p.q_len, p.causal, r, P);
  const int64_t T = sched.local_layout().tokens();

  LocalVerdict verdict;
  verdict.error = check_ring_tensors(p, x, T);
  if (verdict.error.empty()) verdict.error = t.check_backend_device(b.device());
  verdict.k_layout = uint32_t(layout_of(x.k));
  verdict.v_layout = uint32_t(layout_of(x.v));
  RankStats st = begin_run(p, verdict, t, opt);

  // ---- buffers, all allocated before the hop loop ----
  const auto t_setup = Clock::now();
  const int64_t B = p.batch, Hq = p.q_heads, D = p.head_dim;
  const size_t es = size_t(dtype_size(p.dtype));
  const size_t k_bytes = size_t(block_elems(x.k)) * es, block_bytes = 2 * k_bytes;
  // A world of one has nothing to send: hop 0 reads x.k and x.v in place and no block is packed.
  DeviceBuffer blocks[2] = {DeviceBuffer(b, P > 1 ? block_bytes : 0), DeviceBuffer(b, P > 1 ? block_bytes : 0)};
  DeviceBuffer state_o(b, size_t(B * Hq * T * D) * sizeof(float));
  DeviceBuffer state_lse_owned;
  float* lse = x.lse;
  if (lse == nullptr) {
    state_lse_owned = DeviceBuffer(b, size_t(B * Hq * T) * sizeof(float));
    lse = state_lse_owned.as<float>();
  }
  const StateView state = contiguous_state(state_o.as<float>(), lse, B, Hq, T, D);
  // Device blocks travel through host memory when the transport cannot take device pointers.
  const bool staged = b.device_memory() && !t.accepts_device_memory();
  std::vector<unsigned char> host[2];
  if (staged && P > 1) host[0].resize(block_bytes), host[1].resize(block_bytes);
  if (b.stream() != nullptr) t.set_stream(b.stream());
  ExchangeGuard guard(t, blocks, host);  // after the buffers: it runs before they are freed

  if (P > 1) {
    pack_block(b, blocks[0].get(), x.k);
    pack_block(b, static_cast<char*>(blocks[0].get()) + k_bytes, x.v);
    if (staged) b.copy_to_host(host[0].data(), blocks[0].get(), block_bytes);
  }
  // The state is not emptied up front: the first call on a run of query rows writes it
  // (StateMode::Write), later calls fold. Rows no call reaches are emptied at the end.
  std::vector<char> written(size_t(T), 0);
  // The last call on each run of query rows writes the final output itself (FlashParams::out),
  // cast once: no separate pass over the fp32 state at the end.
  const std::vector<std::vector<char>> final_call = final_calls(sched);
  std::vector<char> finalized(size_t(T), 0);
  const BlockLayout k_layout = layout_of(x.k), v_layout = layout_of(x.v);
  b.synchronize();
  st.setup_s = seconds_since(t_setup);

  FlashParams base;
  base.q = x.q;
  base.state = state;
  base.scale = p.resolved_scale();
  base.mode = StateMode::Fold;
  base.tile_q = opt.tile_q;
  base.tile_k = opt.tile_k;

  st.hops.reserve(size_t(P));
  st.transfer_s = P > 1 ? 0.0 : -1.0;
  const uint64_t bytes_before = t.bytes_sent();
  FlightRecorder& recorder = flight_recorder();
  int cur = 0;
  for (int s = 0; s < P; ++s) {
    const HopPlan& plan = sched.hops()[size_t(s)];
    HopStats hs;
    hs.hop = s;
    hs.source_rank = plan.source_rank;
    hs.kernel_calls = int(plan.calls.size());
    hs.visible_pairs = int64_t(plan.visible_pairs * B * Hq);  // fits: validate_problem bounds the pairs
    // The block of hop s goes on to the next rank while this rank computes with it; the last hop
    // has nothing left to pass on.
    const bool exchange = s + 1 < P;
    if (exchange) {
      maybe_die_or_hang(r, s);  // RINGATTN_FAULT: tests of the failure paths
      // An injected corrupt block is short, which the receiving rank must detect.
      const size_t send_bytes = fault_fires(FaultKind::Corrupt, r, s) ? block_bytes / 2 : block_bytes;
      const uint64_t before = t.bytes_sent();
      recorder.record(s, HopEvent::Posted, (r + 1) % P, send_bytes);
      guard.posting();
      try {
        // An injected error stands for a transport that fails to post (RINGATTN_FAULT=R:S:error).
        if (fault_fires(FaultKind::Error, r, s))
          fail_runtime("injected transport error (RINGATTN_FAULT={}:{}:error)", r, s);
        if (staged)
          t.start_exchange(host[cur].data(), host[1 - cur].data(), send_bytes);
        else
          t.start_exchange(blocks[cur].get(), blocks[1 - cur].get(), send_bytes);
      } catch (const std::exception& e) {
        recorder.record(s, HopEvent::Failed, (r + 1) % P, send_bytes);
        hop_failed(r, P, s, send_bytes, "posting the exchange", e);
      }
      hs.bytes_sent = t.bytes_sent() - before;
    }
    const auto t0 = Clock::now();
    // Hop 0 is this rank's own block: read in place (the packed copy only travels).
    const TensorView kb = s == 0 ? x.k : block_view(blocks[cur].get(), x.k, k_layout);
    const TensorView vb = s == 0 ? x.v : block_view(static_cast<char*>(blocks[cur].get()) + k_bytes, x.v, v_layout);
    try {
      if (fault_fires(FaultKind::Throw, r, s)) throw std::bad_alloc();  // RINGATTN_FAULT=R:S:throw
      compute_hop(plan, final_call[size_t(s)], base, x, kb, vb, written, finalized, b);
    } catch (const InvalidArgument&) {
      throw;  // a bad call: the same on every rank (the guard still ends the exchange)
    } catch (const std::exception& e) {
      recorder.record(s, HopEvent::Failed, plan.source_rank);
      fail_runtime("rank {} on {}: hop {} of {}: computing on the block of rank {} failed: {}", r, host_name(), s, P,
                   plan.source_rank, e.what());
    }
    const auto t1 = Clock::now();
    hs.compute_s = std::chrono::duration<double>(t1 - t0).count();
    recorder.record(s, HopEvent::Computed, plan.source_rank);
    if (exchange) {
      try {
        t.wait_exchange();
      } catch (const std::exception& e) {
        recorder.record(s, HopEvent::Failed, (r + P - 1) % P);
        // A rank that injected a short block also fails its own receive (it expects the short
        // size); it gives the receiver, whose report is the one under test, time to speak first.
        if (fault_fires(FaultKind::Corrupt, r, s)) std::this_thread::sleep_for(std::chrono::seconds(2));
        hop_failed(r, P, s, block_bytes, "waiting for the exchange", e);
      }
      guard.completed();
      recorder.record(s, HopEvent::Completed, (r + P - 1) % P, block_bytes);
      if (staged) {
        b.copy_from_host(blocks[1 - cur].get(), host[1 - cur].data(), block_bytes);
        b.synchronize();
      }
      hs.exposed_comm_s = seconds_since(t1);
      hs.transfer_s = t.last_exchange_seconds();
      if (hs.transfer_s < 0) st.transfer_s = -1.0;
      else if (st.transfer_s >= 0) st.transfer_s += hs.transfer_s;
    }
    st.compute_s += hs.compute_s;
    st.exposed_comm_s += hs.exposed_comm_s;
    st.visible_pairs += hs.visible_pairs;
    st.kernel_calls += hs.kernel_calls;
    st.hops.push_back(hs);
    cur = 1 - cur;
  }
  st.bytes_sent = t.bytes_sent() - bytes_before;

  const auto t_fin = Clock::now();
  finish_rows(written, finalized, b, state, x.out);
  st.finalize_s = seconds_since(t_fin);
  st.total_s = seconds_since(t_start);
  return st;
}

RankStats run_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                        const RunOptions& opt) {
  return p.is_ring() ? run_ring_attention(p, x, b, t, opt) : run_distributed_decode(p, x, b, t, opt);
}

}  // namespace ringattn
