// The op's calls on a Backend: one flash (or flash_backward) call per segment, StateMode::Write /
// GradMode::Write, into fp32 scratch that Backend::finalize casts to the inputs' dtype. Nothing
// here waits for a device: a GPU call returns once its work is queued.
#include "attention_op.hpp"

#include <utility>

#include "core/error.hpp"

namespace ringattn::op {
namespace {

// A scratch buffer from the caller's allocator or the backend.
class Scratch {
 public:
  Scratch(Backend& b, const Allocator& a, size_t bytes) : b_(b), a_(a), bytes_(bytes) {
    if (bytes == 0) return;
    p_ = a.allocate ? a.allocate(a.ctx, bytes, a.stream) : b.allocate(bytes);
    if (p_ == nullptr) fail_runtime("the caller's allocator returned no memory for {} bytes of scratch", bytes);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (p_ == nullptr) return;
    if (a_.allocate) {
      if (a_.deallocate) a_.deallocate(a_.ctx, p_, bytes_, a_.stream);
    } else {
      b_.deallocate(p_);
    }
  }
  float* f32() const { return static_cast<float*>(p_); }

 private:
  Backend& b_;
  Allocator a_;
  size_t bytes_;
  void* p_ = nullptr;
};

size_t f32_bytes(const TensorView& like) { return size_t(like.numel()) * sizeof(float); }

// Query rows up to which a batched call on a GPU runs the split-KV decode kernel instead of the
// flash kernel (whose query tiles would be nearly empty): ringattn_gpu_bench's rule.
constexpr int64_t kDecodeMaxRows = 16;

// A contiguous fp32 [B, H, T, D] view of `like`'s shape over `data`.
TensorView f32_like(float* data, const TensorView& like) {
  return bhtd_view(data, DType::F32, like.batch, like.heads, like.len, like.dim);
}

// The state view of the forward: o over `o` (strides of `ov`), lse from the call.
StateView state_of(const AttentionCall& c, const TensorView& ov) {
  return StateView{static_cast<float*>(ov.data), c.lse, ov.batch, ov.heads, ov.len, ov.dim,
                   ov.stride_b, ov.stride_h, ov.stride_t, c.lse_stride_b, c.lse_stride_h};
}

// fp32 gradients cast into the caller's tensor (a no-op when the caller's is the fp32 buffer).
void cast_into(Backend& b, const TensorView& f32, const TensorView& dst) {
  if (f32.data == dst.data) return;
  b.finalize(FinalizeParams{state_of(AttentionCall{}, f32), dst});
}

}  // namespace

std::vector<Segment> segments(const AttentionCall& c) {
  if (c.cu.empty()) {
    // q_offset = kv_len - q_len: the queries are the last positions (prefill, decode, chunks).
    return {Segment{0, c.q.len, 0, c.k.len, band_mask(c.causal, c.window, c.k.len - c.q.len, 1)}};
  }
  std::vector<Segment> s;
  const MaskSpec self = band_mask(c.causal, c.window, 0, 1);  // a document against itself
  for (size_t d = 0; d + 1 < c.cu.size(); ++d)
    if (const int64_t n = c.cu[d + 1] - c.cu[d]; n > 0) s.push_back(Segment{c.cu[d], n, c.cu[d], n, self});
  return s;
}

void attention_forward(Backend& b, const AttentionCall& c, const Allocator& a) {
  // fp32 inputs: the state's o is the output itself. Else a GPU decode (one segment of a few
  // rows) has its split merge write the output directly, without an fp32 o (DecodeParams), and
  // the rest write fp32 scratch that the call casts.
  const bool f32 = c.q.dtype == DType::F32;
  const bool decode = b.device_memory() && c.cu.empty() && c.q.len <= kDecodeMaxRows;
  Scratch o(b, a, f32 || decode ? 0 : f32_bytes(c.q));
  const StateView state = state_of(c, f32 ? c.out : f32_like(o.f32(), c.q));  // o.f32() null for a decode
  for (const Segment& s : segments(c)) {
    FlashParams f;
    f.q = c.q.rows(s.q0, s.rows);
    f.k = c.k.rows(s.k0, s.keys);
    f.v = c.v.rows(s.k0, s.keys);
    f.state = state.rows(s.q0, s.rows);
    if (!f32) f.out = c.out.rows(s.q0, s.rows);
    f.scale = c.scale;
    f.mask = s.mask;
    f.mode = StateMode::Write;
    if (decode)
      b.decode(DecodeParams{f, 0});
    else
      b.flash(f);
  }
  // No synchronization: on a GPU the work is queued on the backend's stream (the caller's), and
  // the scratch goes back in stream order; the CPU engine has finished when it returns.
}

void attention_backward(Backend& b, const AttentionCall& c, const GradViews& g, const Allocator& a) {
  const bool f32 = c.q.dtype == DType::F32;
  Scratch sq(b, a, f32 ? 0 : f32_bytes(c.q)), sk(b, a, f32 ? 0 : f32_bytes(c.k)), sv(b, a, f32 ? 0 : f32_bytes(c.v));
  const TensorView dq = f32 ? g.dq : f32_like(sq.f32(), c.q), dk = f32 ? g.dk : f32_like(sk.f32(), c.k),
                   dv = f32 ? g.dv : f32_like(sv.f32(), c.v);
  for (const Segment& s : segments(c)) {
    BackwardParams p;
    p.q = c.q.rows(s.q0, s.rows);
    p.k = c.k.rows(s.k0, s.keys);
    p.v = c.v.rows(s.k0, s.keys);
    p.o = c.out.rows(s.q0, s.rows);
    p.dout = g.dout.rows(s.q0, s.rows);
    p.lse = LseView{c.lse + s.q0, c.q.batch, c.q.heads, s.rows, c.lse_stride_b, c.lse_stride_h};
    p.dq = dq.rows(s.q0, s.rows);
    p.dk = dk.rows(s.k0, s.keys);
    p.dv = dv.rows(s.k0, s.keys);
    p.scale = c.scale;
    p.mask = s.mask;
    p.mode = GradMode::Write;
    p.deterministic = c.deterministic;
    b.flash_backward(p);
  }
  cast_into(b, dq, g.dq);
  cast_into(b, dk, g.dk);
  cast_into(b, dv, g.dv);
}

}  // namespace ringattn::op
