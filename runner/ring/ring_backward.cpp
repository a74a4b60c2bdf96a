// The ring backward (ARCHITECTURE.md, "A second ring"): each rank keeps its Q, O, LSE and dO and
// accumulates dQ; the K/V blocks travel around the ring as in the forward (BlockRing, the same
// schedule and routes), and their fp32 dK/dV accumulators travel one hop behind them over a
// second transport (GradRing) and come home at the end. Both hops' exchanges are posted before
// the hop's compute, so they overlap it. This file is the loop; the parts are shared with the
// forward (the ring plan: schedule and routes; agreement, block ring, flight recorder).
#include <chrono>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "core/host.hpp"
#include "runner/problem/agree.hpp"
#include "runner/ring/block_ring.hpp"
#include "runner/diagnostics/flight_recorder.hpp"
#include "runner/ring/grad_ring.hpp"
#include "runner/ring/ring.hpp"
#include "runner/ring/ring_buffers.hpp"
#include "runner/ring/ring_plan.hpp"

namespace ringattn {
namespace {

using Clock = std::chrono::steady_clock;

// The local checks of a backward run; "" when the tensors and transports fit the problem.
std::string check_backward(const GlobalProblem& p, const LocalTensors& x, const BackwardTensors& g, int64_t tokens,
                           Transport& t, Transport& grad_t) {
  const DType out = p.resolved_out_dtype();
  const std::tuple<const char*, const TensorView*, int64_t, DType> views[] = {
      {"q", &x.q, p.q_heads, p.dtype},   {"k", &x.k, p.kv_heads, p.dtype},    {"v", &x.v, p.kv_heads, p.dtype},
      {"out", &x.out, p.q_heads, out},   {"dout", &g.dout, p.q_heads, out},   {"dq", &g.dq, p.q_heads, DType::F32},
      {"dk", &g.dk, p.kv_heads, DType::F32}, {"dv", &g.dv, p.kv_heads, DType::F32}};
  for (const auto& [what, v, heads, dtype] : views)
    if (std::string e = check_view(what, *v, p.batch, heads, tokens, p.head_dim, dtype); !e.empty()) return e;
  if (x.lse == nullptr && tokens > 0) return "the backward needs the forward's lse (LocalTensors::lse is null)";
  if (grad_t.size() != t.size() || grad_t.rank() != t.rank())
    return fmt::format("the dK/dV transport is rank {} of {} but the K/V transport rank {} of {}: both must span "
                       "the same ranks", grad_t.rank(), grad_t.size(), t.rank(), t.size());
  if (t.size() > 1 && &grad_t == &t)
    return "the dK/dV ring needs a transport of its own (a transport carries one exchange at a time): pass a second "
           "transport over the same ranks";
  return "";
}

// The fields every backward call of this rank shares; each call views its rows.
BackwardParams base_params(const GlobalProblem& p, const LocalTensors& x, const BackwardTensors& g,
                           const RunOptions& opt) {
  BackwardParams f;
  f.q = x.q;
  f.o = x.out;
  f.dout = g.dout;
  f.lse = contiguous_lse(x.lse, x.q.batch, x.q.heads, x.q.len);
  f.dq = g.dq;
  f.scale = p.resolved_scale();
  f.mode = GradMode::Accumulate;  // dq, dk, dv and the accumulators are zeroed first
  f.deterministic = opt.deterministic;
  f.tile_q = opt.tile_q;
  f.tile_k = opt.tile_k;
  return f;
}

// The backward calls of hop `s` on its K/V block: dq into this rank's rows, dk and dv into this
// rank's own gradients at hop 0, else into the block's zeroed accumulator.
void compute_backward_hop(int s, const HopPlan& plan, const BackwardParams& base, const BackwardTensors& g,
                          const BlockRing& ring, GradRing& grads, Backend& b) {
  if (s > 0) grads.begin_compute(s);
  const TensorView kb = ring.k(s), vb = ring.v(s), dk = s == 0 ? g.dk : grads.dk(), dv = s == 0 ? g.dv : grads.dv();
  const int64_t k0 = ring.first_row(s);  // the block and its accumulator hold the source's rows from k0 on
  for (const PairCall& c : plan.calls) {
    BackwardParams f = base;
    f.q = base.q.rows(c.q_row0, c.q_rows);
    f.o = base.o.rows(c.q_row0, c.q_rows);
    f.dout = base.dout.rows(c.q_row0, c.q_rows);
    f.dq = base.dq.rows(c.q_row0, c.q_rows);
    f.lse.data = base.lse.data + c.q_row0;
    f.lse.len = c.q_rows;
    f.k = kb.rows(c.k_row0 - k0, c.k_rows);
    f.v = vb.rows(c.k_row0 - k0, c.k_rows);
    f.dk = dk.rows(c.k_row0 - k0, c.k_rows);
    f.dv = dv.rows(c.k_row0 - k0, c.k_rows);
    f.mask = c.mask;
    b.flash_backward(f);
  }
  b.synchronize();
}

struct Rings {
  BlockRing& kv;
  GradRing& grads;
};

// One hop: post the K/V exchange and the dK/dV exchange, compute on the block held, complete
// both, then fold the received accumulator into the one just computed.
HopStats run_backward_hop(int s, const HopPlan& plan, const BackwardParams& base, const BackwardTensors& g, Rings rg,
                          Backend& b, FlightRecorder& recorder) {
  HopStats hs;
  hs.hop = s;
  hs.source_rank = plan.source_rank;
  hs.kernel_calls = int(plan.calls.size());
  hs.visible_pairs = int64_t(plan.visible_pairs * base.q.batch * base.q.heads);  // bounded by validate_problem
  const bool kv = rg.kv.exchanges(s), grads = rg.grads.exchanges(s);
  if (kv) hs.bytes_sent += rg.kv.post(s);
  if (grads) hs.bytes_sent += rg.grads.post(s);
  const auto t0 = Clock::now();
  try {
    if (!plan.calls.empty()) compute_backward_hop(s, plan, base, g, rg.kv, rg.grads, b);
  } catch (const InvalidArgument&) {
    throw;  // a bad call: the same on every rank (the rings still end their exchanges)
  } catch (const std::exception& e) {
    recorder.record(s, HopEvent::Failed, plan.source_rank);
    fail_runtime("rank {} on {}: hop {} of the {}-rank ring: the backward on the block of rank {} failed: {}", rg.kv.rank(),
                 host_name(), s, rg.kv.world(), plan.source_rank, e.what());
  }
  const auto t1 = Clock::now();
  hs.compute_s = std::chrono::duration<double>(t1 - t0).count();
  recorder.record(s, HopEvent::Computed, plan.source_rank);
  if (kv) rg.kv.complete(s);
  if (grads) rg.grads.complete(s);
  if (kv || grads) {
    hs.exposed_comm_s = seconds_since(t1);
    hs.transfer_s = kv ? rg.kv.last_exchange_seconds() : rg.grads.last_exchange_seconds();
  }
  if (s > 0) rg.grads.fold(s, !plan.calls.empty());
  return hs;
}

// The last dK/dV exchange (P): every accumulator comes home and is added into dk and dv.
HopStats bring_home(GradRing& grads, const BackwardTensors& g, int P) {
  HopStats hs;
  hs.hop = P;
  hs.source_rank = -1;
  hs.bytes_sent = grads.post(P);
  const auto t0 = Clock::now();
  grads.complete(P);
  hs.exposed_comm_s = hs.transfer_s = seconds_since(t0);
  grads.bring_home(g.dk, g.dv);
  return hs;
}

}  // namespace

namespace {

void check_is_ring(const GlobalProblem& p) {
  if (!p.is_ring())
    fail_arg("the ring backward needs self-attention (q_len == kv_len, q_offset 0); got q_len={}, kv_len={}, "
             "q_offset={}", p.q_len, p.kv_len, p.resolved_q_offset());
}

// The backward after its checks: agreement, buffers, the hop loop, the gradients brought home.
RankStats run_backward_ring(const GlobalProblem& p, const RingPlan& plan, const LocalTensors& x,
                            const BackwardTensors& g, Backend& b, Transport& t, Transport& grad_t,
                            const RunOptions& opt, Clock::time_point t_start) {
  const int P = t.size();
  const RingSchedule& sched = plan.schedule();
  LocalVerdict verdict;
  verdict.backward = true;
  verdict.error = check_backward(p, x, g, sched.local_layout().tokens(), t, grad_t);
  if (verdict.error.empty()) verdict.error = t.check_backend_device(b.device());
  verdict.k_layout = uint32_t(layout_of(x.k));
  verdict.v_layout = uint32_t(layout_of(x.v));
  verdict.layouts_hash = plan.layouts_hash();
  RankStats st = begin_run(p, verdict, t, opt);

  const auto t_setup = Clock::now();
  FlightRecorder& recorder = opt.recorder != nullptr ? *opt.recorder : flight_recorder();
  GradRing grads(b, grad_t, x.k, plan, recorder);
  BlockRing kv(b, t, x.k, x.v, plan, recorder);
  for (const TensorView* v : {&g.dq, &g.dk, &g.dv}) b.zero_f32(*v);
  b.synchronize();
  st.setup_s = seconds_since(t_setup);

  const BackwardParams base = base_params(p, x, g, opt);
  st.transfer_s = -1.0;  // the two rings overlap: their exchange times do not add up
  recorder.begin_pass(RingPhase::Backward);
  for (int s = 0; s < P; ++s)
    if (s < kv.hops() || grads.exchanges(s))
      st.add_hop(run_backward_hop(s, sched.hops()[size_t(s)], base, g, Rings{kv, grads}, b, recorder));
  const auto t_fin = Clock::now();
  if (grads.exchanges(P)) st.add_hop(bring_home(grads, g, P));
  b.synchronize();
  st.finalize_s = seconds_since(t_fin);
  st.total_s = seconds_since(t_start);
  return st;
}

}  // namespace

RankStats run_attention_backward(const GlobalProblem& p, const RingPlan& plan, const LocalTensors& x,
                                 const BackwardTensors& g, Backend& b, Transport& t, Transport& grad_t,
                                 const RunOptions& opt) {
  const auto t_start = Clock::now();
  check_is_ring(p);
  validate_problem(p, t.size());
  validate_run_options(opt);
  plan.check_fits(p, t.size(), t.rank());
  return run_backward_ring(p, plan, x, g, b, t, grad_t, opt, t_start);
}

RankStats run_attention_backward(const GlobalProblem& p, const LocalTensors& x, const BackwardTensors& g, Backend& b,
                                 Transport& t, Transport& grad_t, const RunOptions& opt) {
  const auto t_start = Clock::now();
  check_is_ring(p);
  validate_problem(p, t.size());
  validate_run_options(opt);
  return run_backward_ring(p, ring_plan(p, t.size(), t.rank()), x, g, b, t, grad_t, opt, t_start);
}

}  // namespace ringattn
