// The ring runner (ARCHITECTURE.md): each rank keeps its queries and an fp32 (o, lse) state; the
// K/V blocks travel around the ring, one hop at a time, and each hop's exchange is posted before
// the hop's compute so the two overlap. Backend- and transport-agnostic. The parts: the per-hop
// plan (the RingPlan made once per run: this rank's schedule, the routes), the block ring (BlockRing: buffers, packing, exchanges, the error
// path), the row bookkeeping (RowState: first touch, fold, finish); this file is the loop.
#include <algorithm>
#include <chrono>
#include <vector>

#include "runner/problem/agree.hpp"
#include "runner/ring/block_ring.hpp"
#include "core/error.hpp"
#include "core/host.hpp"
#include "runner/diagnostics/flight_recorder.hpp"
#include "runner/diagnostics/log.hpp"
#include "runner/ring/ring.hpp"
#include "runner/ring/ring_buffers.hpp"
#include "runner/ring/row_state.hpp"
#include "runner/ring/ring_plan.hpp"

namespace ringattn {
namespace {

using Clock = std::chrono::steady_clock;
// The local checks of a ring run; "" when the tensors fit the problem and the layout.
std::string check_ring_tensors(const GlobalProblem& p, const LocalTensors& x, int64_t tokens) {
  const DType out = p.resolved_out_dtype();
  for (const auto& [what, v, heads, dtype] :
       {std::tuple{"q", &x.q, p.q_heads, p.dtype}, std::tuple{"k", &x.k, p.kv_heads, p.dtype},
        std::tuple{"v", &x.v, p.kv_heads, p.dtype}, std::tuple{"out", &x.out, p.q_heads, out}})
    if (std::string e = check_view(what, *v, p.batch, heads, tokens, p.head_dim, dtype); !e.empty()) return e;
  return "";
}

// Checks the problem, then agrees on it with every rank (the local verdict on the tensors
// included): errors are identical on every rank and come before any communication of the ring.
RankStats agree_on_ring(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                        const RunOptions& opt, const RingPlan& plan) {
  LocalVerdict verdict;
  verdict.error = check_ring_tensors(p, x, plan.schedule().local_layout().tokens());
  verdict.layouts_hash = plan.layouts_hash();
  if (verdict.error.empty()) verdict.error = t.check_backend_device(b.device());
  verdict.k_layout = uint32_t(layout_of(x.k));
  verdict.v_layout = uint32_t(layout_of(x.v));
  return begin_run(p, verdict, t, opt);
}

// The flash calls of one hop on its K/V block. The first call on a run of query rows writes the
// state, later calls fold; the last call on a run also writes the final output (RowState).
void compute_hop(int hop, const HopPlan& plan, const FlashParams& base, const LocalTensors& x,
                 const BlockRing& ring, RowState& rows, Backend& b) {
  const TensorView kb = ring.k(hop), vb = ring.v(hop);
  const int64_t k0 = ring.first_row(hop);  // the block holds its source's rows from k0 on
  for (size_t i = 0; i < plan.calls.size(); ++i) {
    const PairCall& c = plan.calls[i];
    FlashParams f = base;
    f.q = x.q.rows(c.q_row0, c.q_rows);
    f.state = base.state.rows(c.q_row0, c.q_rows);
    const RowState::Call call = rows.begin_call(hop, i, c);
    f.mode = call.mode;
    if (call.writes_output) f.out = x.out.rows(c.q_row0, c.q_rows);
    f.k = kb.rows(c.k_row0 - k0, c.k_rows);
    f.v = vb.rows(c.k_row0 - k0, c.k_rows);
    f.mask = c.mask;
    b.flash(f);
  }
  b.synchronize();
}

// One hop: post the exchange (all hops but the last), compute on the block held, then complete
// the exchange. The time the compute did not hide is the exposed communication.
HopStats run_hop(int s, const HopPlan& plan, const FlashParams& base, const LocalTensors& x, BlockRing& ring,
                 RowState& rows, Backend& b, FlightRecorder& recorder) {
  HopStats hs;
  hs.hop = s;
  hs.source_rank = plan.source_rank;
  hs.kernel_calls = int(plan.calls.size());
  // Fits: validate_problem bounds the pairs.
  hs.visible_pairs = int64_t(plan.visible_pairs * x.q.batch * x.q.heads);
  if (ring.exchanges(s)) hs.bytes_sent = ring.post(s);
  const auto t0 = Clock::now();
  try {
    compute_hop(s, plan, base, x, ring, rows, b);
  } catch (const InvalidArgument&) {
    throw;  // a bad call: the same on every rank (the ring still ends the exchange)
  } catch (const std::exception& e) {
    recorder.record(s, HopEvent::Failed, plan.source_rank);
    fail_runtime("rank {} on {}: hop {} of the {}-rank ring: computing on the block of rank {} failed: {}", ring.rank(),
                 host_name(), s, ring.world(), plan.source_rank, e.what());
  }
  const auto t1 = Clock::now();
  hs.compute_s = std::chrono::duration<double>(t1 - t0).count();
  recorder.record(s, HopEvent::Computed, plan.source_rank);
  if (ring.exchanges(s)) {
    ring.complete(s);
    hs.exposed_comm_s = seconds_since(t1);
    hs.transfer_s = ring.last_exchange_seconds();
  }
  return hs;
}

// Adds one hop to the run's totals.
void add_hop(RankStats& st, const HopStats& hs, bool exchanged) {
  if (exchanged) {
    if (hs.transfer_s < 0) st.transfer_s = -1.0;
    else if (st.transfer_s >= 0) st.transfer_s += hs.transfer_s;
  }
  st.add_hop(hs);
}

}  // namespace

void validate_run_options(const RunOptions& opt) {
  for (const auto& [flag, v] : {std::pair{"--tile-q", opt.tile_q}, std::pair{"--tile-k", opt.tile_k}})
    if (v < 0 || v > kMaxTile)
      fail_arg("{} {} is out of range: a CPU tile is 1 to {} rows, or 0 for the default", flag, v, kMaxTile);
  if (opt.decode_splits < 0) fail_arg("decode splits {} must be >= 0 (0: the default)", opt.decode_splits);
}

void RankStats::add_hop(const HopStats& hs) {
  compute_s += hs.compute_s;
  exposed_comm_s += hs.exposed_comm_s;
  visible_pairs += hs.visible_pairs;
  kernel_calls += hs.kernel_calls;
  bytes_sent += hs.bytes_sent;
  hops.push_back(hs);
}

double RankStats::hidden_fraction() const {
  if (transfer_s <= 0 || hops.size() < 2) return -1.0;
  return std::clamp(1.0 - exposed_comm_s / transfer_s, 0.0, 1.0);
}

namespace {

void check_is_ring(const GlobalProblem& p) {
  if (!p.is_ring())
    fail_arg("ring attention needs self-attention (q_len == kv_len, q_offset 0); got q_len={}, kv_len={}, "
             "q_offset={}: use run_distributed_decode", p.q_len, p.kv_len, p.resolved_q_offset());
}

// The run after its checks: agreement, buffers, the hop loop, the finish. `t_start`: the run's start.
RankStats run_ring(const GlobalProblem& p, const RingPlan& plan, const LocalTensors& x, Backend& b, Transport& t,
                   const RunOptions& opt, Clock::time_point t_start) {
  const RingSchedule& sched = plan.schedule();
  RankStats st = agree_on_ring(p, x, b, t, opt, plan);

  // Every buffer is allocated before the hop loop.
  const auto t_setup = Clock::now();
  RowState rows(b, sched, x.out, x.lse);
  FlightRecorder& recorder = opt.recorder != nullptr ? *opt.recorder : flight_recorder();
  BlockRing ring(b, t, x.k, x.v, plan, recorder);
  b.synchronize();
  st.setup_s = seconds_since(t_setup);

  FlashParams base;
  base.q = x.q;
  base.state = rows.state();
  base.scale = p.resolved_scale();
  base.mode = StateMode::Fold;
  base.tile_q = opt.tile_q;
  base.tile_k = opt.tile_k;
  // The ring stops after the last hop that computes (RingPlan::hops): later hops would pass only
  // empty blocks.
  st.hops.reserve(size_t(ring.hops()));
  st.transfer_s = ring.hops() > 1 ? 0.0 : -1.0;
  recorder.begin_pass(RingPhase::Forward);
  for (int s = 0; s < ring.hops(); ++s)
    add_hop(st, run_hop(s, sched.hops()[size_t(s)], base, x, ring, rows, b, recorder), ring.exchanges(s));

  const auto t_fin = Clock::now();
  rows.finish();
  st.finalize_s = seconds_since(t_fin);
  st.total_s = seconds_since(t_start);
  return st;
}

}  // namespace

RankStats run_ring_attention(const GlobalProblem& p, const RingPlan& plan, const LocalTensors& x, Backend& b,
                             Transport& t, const RunOptions& opt) {
  const auto t_start = Clock::now();
  check_is_ring(p);
  // Rejected locally, before any communication: identical on every rank that has this problem.
  validate_problem(p, t.size());
  validate_run_options(opt);
  plan.check_fits(p, t.size(), t.rank());
  return run_ring(p, plan, x, b, t, opt, t_start);
}

RankStats run_ring_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                             const RunOptions& opt) {
  const auto t_start = Clock::now();
  check_is_ring(p);
  validate_problem(p, t.size());
  validate_run_options(opt);
  return run_ring(p, ring_plan(p, t.size(), t.rank()), x, b, t, opt, t_start);
}

RankStats run_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                        const RunOptions& opt) {
  return p.is_ring() ? run_ring_attention(p, x, b, t, opt) : run_distributed_decode(p, x, b, t, opt);
}

}  // namespace ringattn
