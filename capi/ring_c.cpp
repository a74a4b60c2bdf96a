// The C ABI's ring calls (ringattn_c.h, "Ring attention over the caller's communicator"): each
// rank's descriptors checked locally, the verdicts agreed over the communicator before anything
// depends on them, then the runner's ring forward or backward (runner/ring/runner.hpp) over a
// callback transport (comm/callback_transport.hpp) on the backend of the tensors' device: the CPU
// engine, or CUDA on the caller's stream with K/V blocks and dK/dV accumulators staged through
// host memory (the callbacks move host memory), or moved GPU to GPU over ring.nccl (capi/nccl_c.hpp).
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "comm/callback_transport.hpp"
#include "descriptors.hpp"
#include "nccl_c.hpp"
#include "runner/diagnostics/flight_recorder.hpp"
#include "runner/problem/agree.hpp"
#include "runner/ring/ring_buffers.hpp"
#include "runner/ring/ring_plan.hpp"
#include "runner/ring/runner.hpp"

namespace ringattn::op {
namespace {

Sharding layout_of(int32_t layout) {
  if (layout < RINGATTN_LAYOUT_AUTO || layout > RINGATTN_LAYOUT_DOC_ZIGZAG)
    fail_arg("layout is {}; allowed are -1 (auto), 0 (contiguous), 1 (zigzag), 2 (striped) and 3 (doc-zigzag)",
             layout);
  return Sharding(layout);
}

CallbackComm comm_of(const ringattn_ring_args* ring) {
  if (ring == nullptr) fail_arg("ring is missing (a null pointer)");
  if (ring->comm == nullptr) fail_arg("ring.comm is missing (a null pointer)");
  const ringattn_communicator& c = *ring->comm;
  CallbackComm comm{c.ctx, c.rank, c.size, c.post, c.wait, c.allgather};
  check_callback_comm(comm);
  return comm;
}

// A rank may hold no tokens (more ranks than tokens): its empty tensors may have no data.
const ringattn_tensor* maybe_empty(const ringattn_tensor* t, ringattn_tensor& copy) {
  static char dummy[16];
  if (t == nullptr || t->data != nullptr || t->shape == nullptr || t->ndim < 1 || t->ndim > 8) return t;
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] == 0) {
      copy = *t;
      copy.data = dummy;
      return &copy;
    }
  return t;
}

TensorView local_view(const char* name, const ringattn_tensor* t, bool packed, const ringattn_tensor* q) {
  ringattn_tensor copy;
  const ringattn_tensor* d = maybe_empty(t, copy);
  same_device(name, &need(name, d), q);
  return attention_view(name, d, packed);
}

// One rank's call as it passed it: the views, the mask and scale, and its lse (fp32, compact).
struct LocalRing {
  AttentionCall c;
  bool packed = false;
  std::vector<char> k_copy, v_copy;  // K and V in [B, T, H, D] when the caller's were laid out otherwise
  ringattn_device device{kCpu, 0};    // q's device, whose backend runs the call
};

// K and V travel between ranks as blocks in their view's layout, which every rank must share (the
// agreement compares it): a view in another layout than [B, T, H, D] (a transposed tensor, or the
// strides torch gives a tensor of no tokens) is copied into one, or re-strided when it holds nothing.
// Device memory is not copied here: a CUDA tensor in another layout is refused (ringattn.torch
// passes K and V contiguous).
void as_bthd(const char* name, TensorView& x, std::vector<char>& copy, const ringattn_device& device) {
  if (x.len == 0 || x.numel() == 0) {
    x = bthd_view(x.data, x.dtype, x.batch, x.heads, x.len, x.dim);
    return;
  }
  if (layout_of(x) == layout_of(bthd_view(x.data, x.dtype, x.batch, x.heads, x.len, x.dim))) return;
  if (device.device_type != kCpu)
    fail_arg("{} on {} has strides (batch {}, tokens {}, heads {}, head_dim 1) in elements; the ring moves K and V of "
             "device tensors as they lie, so they must be contiguous [B, T, H, D] (or [T, H, D] packed)", name,
             device_text(device), x.stride_b, x.stride_t, x.stride_h);
  const size_t e = dtype_size(x.dtype);
  copy.resize(size_t(x.numel()) * e);
  const TensorView to = bthd_view(copy.data(), x.dtype, x.batch, x.heads, x.len, x.dim);
  for (int64_t b = 0; b < x.batch; ++b)
    for (int64_t h = 0; h < x.heads; ++h)
      for (int64_t t = 0; t < x.len; ++t)
        std::memcpy(static_cast<char*>(to.data) + to.offset(b, h, t) * e,
                    static_cast<const char*>(x.data) + x.offset(b, h, t) * e, size_t(x.dim) * e);
  x = to;
}

std::string strides_text(const ringattn_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", stride_of(t, i));
  return s + "]";
}

float* compact_lse(const ringattn_tensor* t, const TensorView& q, bool packed) {
  ringattn_tensor copy;
  const ringattn_tensor& l = need("lse", maybe_empty(t, copy));
  const std::vector<int64_t> want = packed ? std::vector<int64_t>{q.heads, q.len}
                                           : std::vector<int64_t>{q.batch, q.heads, q.len};
  bool ok = l.ndim == int(want.size()) && l.dtype.code == 2 && l.dtype.bits == 32 && l.dtype.lanes == 1;
  for (int i = 0; ok && i < l.ndim; ++i) ok = l.shape[i] == want[size_t(i)];
  int64_t expect = 1, elements = 1;
  for (int i = 0; ok && i < l.ndim; ++i) elements *= l.shape[i];
  for (int i = l.ndim - 1; ok && elements > 0 && i >= 0; --i) {
    ok = l.shape[i] <= 1 || stride_of(l, i) == expect;
    expect *= l.shape[i];
  }
  if (!ok)
    fail_arg("lse has shape {} ({} bits, strides {}); it must be a compact float32 tensor of shape {}", shape_text(l),
             l.dtype.bits, strides_text(l),
             packed ? fmt::format("[{}, {}] (q_heads, local tokens)", q.heads, q.len)
                    : fmt::format("[{}, {}, {}] (batch, q_heads, local tokens)", q.batch, q.heads, q.len));
  return reinterpret_cast<float*>(static_cast<char*>(l.data) + l.byte_offset);
}

LocalRing parse_local(const ringattn_attention_args* a, const ringattn_tensor* q, const ringattn_tensor* k,
                      const ringattn_tensor* v, const ringattn_tensor* out, const ringattn_tensor* lse) {
  LocalRing r;
  parse_args(r.c, a);
  r.packed = a->cu_seqlens != nullptr;
  ringattn_tensor copy;
  const ringattn_tensor& q0 = need("q", maybe_empty(q, copy));
  if (q0.device.device_type != kCpu && q0.device.device_type != kCuda)
    fail_arg("q is on {}; allowed are cpu and cuda", device_text(q0.device));
  if (q0.device.device_type == kCuda && !cuda_built())
    fail_arg("q is on {} but this ringattn_c was built without CUDA; rebuild it with RINGATTN_CUDA=ON (pip: "
             "-C cmake.define.RINGATTN_CUDA=ON) or pass CPU tensors", device_text(q0.device));
  r.device = q0.device;
  r.c.q = attention_view("q", &q0, r.packed);
  r.c.k = local_view("k", k, r.packed, &q0);
  r.c.v = local_view("v", v, r.packed, &q0);
  same_as("k", r.c.k, "v", r.c.v, r.packed);
  if (r.c.k.dtype != r.c.q.dtype)
    fail_arg("k is {} but q is {}; q, k and v must have one dtype", dtype_name(r.c.k.dtype), dtype_name(r.c.q.dtype));
  for (const auto& [n, x] : {std::pair{"batch", r.c.q.batch}, std::pair{"q_heads", r.c.q.heads},
                             std::pair{"head_dim", r.c.q.dim}, std::pair{"kv_heads", r.c.k.heads}})
    if (x < 1) fail_arg("{} is {} (q {}); it must be >= 1", n, x, view_shape(r.c.q, r.packed));
  if (r.c.k.batch != r.c.q.batch || r.c.k.len != r.c.q.len || r.c.k.dim != r.c.q.dim)
    fail_arg("k has shape {} but q has {}; a rank holds the same rows of q, k and v (batch, tokens and head_dim equal)",
             view_shape(r.c.k, r.packed), view_shape(r.c.q, r.packed));
  if (r.c.q.heads % r.c.k.heads != 0)
    fail_arg("q has {} heads and k {}; q_heads must be a multiple of kv_heads (grouped-query attention)", r.c.q.heads,
             r.c.k.heads);
  as_bthd("k", r.c.k, r.k_copy, r.device);
  as_bthd("v", r.c.v, r.v_copy, r.device);
  r.c.out = local_view("out", out, r.packed, &q0);
  same_as("out", r.c.out, "q", r.c.q, r.packed);
  r.c.lse = compact_lse(lse, r.c.q, r.packed);
  r.c.scale = a->has_softmax_scale ? float(a->softmax_scale) : float(1.0 / std::sqrt(double(r.c.q.dim)));
  return r;
}

// The global problem of the ranks' local calls (`tokens`: every rank's, agreed), its plan, and the
// check that every rank holds what the layout gives it.
struct RingSetup {
  GlobalProblem p;
  std::unique_ptr<RingPlan> plan;
};

GlobalProblem problem_of(const LocalRing& r, const ringattn_attention_args* a, int64_t seq_len) {
  GlobalProblem p;
  p.batch = r.c.q.batch;
  p.q_heads = r.c.q.heads;
  p.kv_heads = r.c.k.heads;
  p.q_len = p.kv_len = seq_len;
  p.head_dim = r.c.q.dim;
  p.dtype = r.c.q.dtype;
  p.causal = r.c.causal;
  p.window = r.c.window;
  p.scale = r.c.scale;
  if (r.packed) {
    const std::vector<int64_t> cu = parse_cu_seqlens(a->cu_seqlens, seq_len, a->max_seqlen);
    for (size_t i = 1; i < cu.size(); ++i) {
      if (cu[i] == cu[i - 1])
        fail_arg("cu_seqlens holds an empty document (index {}: {} after {}); the ring's documents have >= 1 token",
                 i, cu[i], cu[i - 1]);
      p.doc_lens.push_back(cu[i] - cu[i - 1]);
    }
  }
  return p;
}

RingSetup setup_ring(const LocalRing& r, const ringattn_attention_args* a, int32_t layout,
                     const std::vector<int64_t>& tokens, int rank) {
  const int world = int(tokens.size());
  int64_t seq_len = 0;
  for (int64_t n : tokens) seq_len += n;
  if (seq_len < 1) fail_arg("the ranks hold {} tokens in all; the sequence needs at least one", seq_len);
  RingSetup s;
  s.p = problem_of(r, a, seq_len);
  s.p.sharding = layout == RINGATTN_LAYOUT_AUTO ? best_sharding(s.p, world) : layout_of(layout);
  validate_problem(s.p, world);
  s.plan = std::make_unique<RingPlan>(ring_plan(s.p, world, rank));
  for (int q = 0; q < world; ++q)
    if (s.plan->layout(q).tokens() != tokens[size_t(q)])
      fail_arg("rank {} holds {} tokens but the {} layout of {} tokens over {} ranks gives it {}; shard the sequence "
               "with the same layout (ringattn.torch.shard, or ringattn_shard_positions)", q, tokens[size_t(q)],
               sharding_name(s.p.sharding), seq_len, world, s.plan->layout(q).tokens());
  return s;
}

// The transports of a call: the caller's communicator on channels 0 (K/V and the agreement) and 1
// (dK/dV), or the world of one without it; with ring.nccl, its two NCCL transports carry the blocks
// and their host collectives go over those (NcclCall, made once the ranks agree on using it).
struct Transports {
  std::unique_ptr<Transport> host, grad_host;
  std::unique_ptr<NcclCall> nccl;
  Transport& kv() const { return nccl ? nccl->kv() : *host; }
  Transport& grad() const { return nccl ? nccl->grad() : grad_host ? *grad_host : *host; }
};

Transports transports_of(const ringattn_ring_args* ring, bool backward) {
  const CallbackComm comm = comm_of(ring);
  Transports t;
  t.host = host_transport(comm, 0);
  if (backward && comm.size > 1) t.grad_host = host_transport(comm, 1);
  return t;
}

// Every rank passes ring.nccl or none (`uses`: each rank's choice, agreed): the same refusal on
// every rank otherwise.
void agree_on_nccl(const std::vector<int64_t>& uses) {
  std::vector<size_t> with, without;
  for (size_t q = 0; q < uses.size(); ++q) (uses[q] ? with : without).push_back(q);
  if (!with.empty() && !without.empty())
    fail_arg("ring.nccl is given on ranks {} but not on ranks {}; pass it on every rank or on none",
             fmt::join(with, ", "), fmt::join(without, ", "));
}

// The two agreed steps of a ring call: every rank's local checks (`parse`, which fills `r`; the
// caller's own refusal instead when it gave one) with its token count, then the problem, the
// layout and the plan of those counts, with whether it passed ring.nccl. Then the call's NCCL
// transports, when the ranks pass them.
template <typename Parse>
RingSetup agreed_ring(Transports& t, const ringattn_attention_args* args, const ringattn_ring_args* ring,
                      LocalRing& r, Parse&& parse) {
  Transport& host = *t.host;
  const std::vector<int64_t> tokens = agreed(host, ring->caller_error, [&] {
    parse();
    if (ring->nccl != nullptr) check_nccl(*ring->nccl, r.device, host.size());
    return r.c.q.len;
  });
  RingSetup s;
  const std::vector<int64_t> uses = agreed(host, nullptr, [&] {
    s = setup_ring(r, args, ring->layout, tokens, host.rank());
    return int64_t(ring->nccl != nullptr);
  });
  agree_on_nccl(uses);
  if (ring->nccl != nullptr) t.nccl = std::make_unique<NcclCall>(*ring->nccl, host, t.grad_host.get());
  return s;
}

// A failure's text with the last hop events of this call (its own recorder: calls and threads
// share none), as the CLI prints the process's after a failure; the error buffer is short, so a few.
std::string with_hop_events(const char* what, const FlightRecorder& recorder) {
  constexpr size_t kEvents = 6;
  const std::vector<FlightEvent> ev = recorder.events();
  if (ev.empty()) return what;
  std::string text = fmt::format("{}; this rank's last hop events, oldest first:", what);
  for (size_t i = ev.size() > kEvents ? ev.size() - kEvents : 0; i < ev.size(); ++i) {
    const FlightEvent& e = ev[i];
    text += fmt::format(" [t={:.6f}s {}hop {} {}{}]", e.t, e.phase == RingPhase::Backward ? "backward " : "", e.hop,
                        hop_event_name(e.what), e.peer >= 0 ? fmt::format(" peer {}", e.peer) : std::string());
  }
  return text;
}

// Runs the ring `f`; a failure with ring.nccl (other than a refusal) marks the communicator failed (its NCCL state is
// not known to be usable after a failed exchange) before it propagates, with the call's hop events.
template <typename F>
void run_marking(Transports& t, const FlightRecorder& recorder, F&& f) {
  try {
    f();
  } catch (const InvalidArgument&) {
    throw;  // refused on every rank before any exchange: the communicator is untouched
  } catch (const std::exception& e) {
    if (t.nccl) t.nccl->failed(e.what());
    throw RuntimeError(with_hop_events(e.what(), recorder));
  }
}

RunOptions options_of(const LocalRing& r, FlightRecorder& recorder) {
  RunOptions opt;
  opt.deterministic = r.c.deterministic;
  opt.recorder = &recorder;
  return opt;
}

}  // namespace
}  // namespace ringattn::op

using namespace ringattn;

extern "C" {

int32_t ringattn_shard_positions(const ringattn_attention_args* args, int32_t layout, int64_t seq_len, int32_t rank,
                                 int32_t world, int64_t* positions, int64_t capacity, int64_t* count,
                                 int32_t* chosen, char* error, size_t error_size) {
  return op::guarded(error, error_size, [&] {
    op::AttentionCall c;
    op::parse_args(c, args);
    if (world < 1) fail_arg("world is {}; it must be >= 1", world);
    if (rank < 0 || rank >= world) fail_arg("rank is {}; it must be 0 to {} (world {})", rank, world - 1, world);
    if (seq_len < 1) fail_arg("seq_len is {}; it must be >= 1", seq_len);
    if (count == nullptr) fail_arg("count is missing (a null pointer)");
    op::LocalRing r;
    r.c = c;
    r.packed = args->cu_seqlens != nullptr;
    r.c.q = r.c.k = TensorView{nullptr, DType::F32, 1, 1, seq_len, 1, 0, 0, 0};
    r.c.scale = 1.f;
    GlobalProblem p = op::problem_of(r, args, seq_len);
    p.sharding = layout == RINGATTN_LAYOUT_AUTO ? best_sharding(p, world) : op::layout_of(layout);
    const std::vector<int64_t> bounds = p.doc_bounds();
    const ShardLayout l = shard_layout(p.sharding, seq_len, rank, world, documents_of(bounds));
    *count = l.tokens();
    if (chosen != nullptr) *chosen = int32_t(p.sharding);
    if (positions == nullptr) return;  // the count alone
    if (capacity < l.tokens())
      fail_arg("positions has room for {} tokens but rank {} holds {}", capacity, rank, l.tokens());
    int64_t at = 0;
    for (const Segment& s : l.segments)
      for (int64_t i = 0; i < s.len; ++i) positions[at++] = s.position(i);
  });
}

int32_t ringattn_ring_fwd(const ringattn_attention_args* args, const ringattn_ring_args* ring,
                          const ringattn_tensor* q, const ringattn_tensor* k, const ringattn_tensor* v,
                          const ringattn_tensor* out, const ringattn_tensor* lse, char* error, size_t error_size) {
  return op::guarded(error, error_size, [&] {
    op::Transports t = op::transports_of(ring, false);
    op::LocalRing r;
    const op::RingSetup s = op::agreed_ring(t, args, ring, r, [&] { r = op::parse_local(args, q, k, v, out, lse); });
    const op::DeviceGuard guard(*q);
    const std::unique_ptr<Backend> b = op::backend_for(*q, *args);
    LocalTensors x{r.c.q, r.c.k, r.c.v, r.c.out, r.c.lse};
    FlightRecorder recorder;
    op::run_marking(t, recorder, [&] { run_ring_attention(s.p, *s.plan, x, *b, t.kv(), op::options_of(r, recorder)); });
  });
}

int32_t ringattn_ring_bwd(const ringattn_attention_args* args, const ringattn_ring_args* ring,
                          const ringattn_tensor* dout, const ringattn_tensor* q, const ringattn_tensor* k,
                          const ringattn_tensor* v, const ringattn_tensor* out, const ringattn_tensor* lse,
                          const ringattn_tensor* dq, const ringattn_tensor* dk, const ringattn_tensor* dv, char* error,
                          size_t error_size) {
  return op::guarded(error, error_size, [&] {
    op::Transports t = op::transports_of(ring, true);
    op::LocalRing r;
    BackwardTensors g;
    const op::RingSetup s = op::agreed_ring(t, args, ring, r, [&] {
      r = op::parse_local(args, q, k, v, out, lse);
      g.dout = op::local_view("dout", dout, r.packed, q);
      op::same_as("dout", g.dout, "q", r.c.q, r.packed);
      const std::pair<const char*, const ringattn_tensor*> grads[] = {{"dq", dq}, {"dk", dk}, {"dv", dv}};
      TensorView* views[] = {&g.dq, &g.dk, &g.dv};
      for (int i = 0; i < 3; ++i) {
        *views[i] = op::local_view(grads[i].first, grads[i].second, r.packed, q);
        TensorView like = i == 0 ? r.c.q : r.c.k;
        like.dtype = DType::F32;
        op::same_as(grads[i].first, *views[i], i == 0 ? "q (in float32)" : "k (in float32)", like, r.packed);
      }
    });
    const op::DeviceGuard guard(*q);
    const std::unique_ptr<Backend> b = op::backend_for(*q, *args);
    LocalTensors x{r.c.q, r.c.k, r.c.v, r.c.out, r.c.lse};
    FlightRecorder recorder;
    op::run_marking(t, recorder, [&] {
      run_attention_backward(s.p, *s.plan, x, g, *b, t.kv(), t.grad(), op::options_of(r, recorder));
    });
  });
}

}  // extern "C"
