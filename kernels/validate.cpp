// Validation of a flash call, shared by every backend: bad input never reaches a kernel.
#include <cmath>

#include <string>

#include <fmt/format.h>

#include "kernels/params.hpp"
#include "core/error.hpp"

namespace ringattn {
namespace {

// Scale factors: the params have their place, no kernel takes them yet.
void refuse_descale(const Descale& d) {
  if (!d.any()) return;
  fail_arg("scale factors are not supported by any kernel yet: the descale of {} is set; leave the descale of q, k "
           "and v unset (null)", d.q != nullptr ? "q" : d.k != nullptr ? "k" : "v");
}

// The attention inputs, the scale and the CPU tiles: the rules the forward and backward share.
void validate_inputs(const TensorView& q, const TensorView& k, const TensorView& v, float scale, int tile_q,
                     int tile_k, const Descale& descale) {
  if (q.data == nullptr || k.data == nullptr || v.data == nullptr) fail_arg("q, k and v must point to data");
  if (q.batch < 1) fail_arg("batch must be >= 1 (got {})", q.batch);
  if (k.batch != q.batch || v.batch != q.batch)
    fail_arg("batch mismatch: q has {}, k has {}, v has {}; all three must be equal", q.batch, k.batch, v.batch);
  if (q.heads < 1) fail_arg("q_heads must be >= 1 (got {})", q.heads);
  if (k.heads < 1) fail_arg("kv_heads must be >= 1 (got {})", k.heads);
  if (v.heads != k.heads) fail_arg("k has {} heads but v has {}; they must be equal", k.heads, v.heads);
  if (q.heads % k.heads != 0)
    fail_arg("q_heads={} is not a multiple of kv_heads={}: grouped-query attention needs q_heads = g * kv_heads",
             q.heads, k.heads);
  if (q.dim < 1) fail_arg("head_dim must be >= 1 (got {})", q.dim);
  if (k.dim != q.dim || v.dim != q.dim)
    fail_arg("head_dim mismatch: q has {}, k has {}, v has {}; all three must be equal", q.dim, k.dim, v.dim);
  if (q.len < 1) fail_arg("q_len must be >= 1 (got {})", q.len);
  if (k.len < 1) fail_arg("kv_len must be >= 1 (got {})", k.len);
  if (v.len != k.len) fail_arg("k has kv_len={} but v has {}; they must be equal", k.len, v.len);
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    fail_arg("dtype mismatch: q is {}, k is {}, v is {}; all three must be equal", dtype_name(q.dtype),
             dtype_name(k.dtype), dtype_name(v.dtype));
  if (!std::isfinite(scale)) fail_arg("softmax scale must be finite (got {})", scale);
  if (tile_q < 0 || tile_k < 0 || tile_q > kMaxTile || tile_k > kMaxTile)
    fail_arg("tile sizes must be 1 to {}, or 0 for the default (got {}x{})", kMaxTile, tile_q, tile_k);
  refuse_descale(descale);
}

bool same_shape(const TensorView& a, const TensorView& b) {
  return a.batch == b.batch && a.heads == b.heads && a.len == b.len && a.dim == b.dim;
}

std::string shape_of(const TensorView& x) { return fmt::format("[{}, {}, {}, {}]", x.batch, x.heads, x.len, x.dim); }

// A gradient output: fp32, the shape of the input it belongs to (`like`).
void validate_grad(const char* name, const TensorView& g, const char* like_name, const TensorView& like) {
  if (g.data == nullptr) fail_arg("{} must point to memory", name);
  if (g.dtype != DType::F32)
    fail_arg("{} is {}; gradients are fp32 (accumulated in fp32 whatever the input dtype)", name, dtype_name(g.dtype));
  if (!same_shape(g, like))
    fail_arg("{} has shape {} but {} has {}; they must be equal", name, shape_of(g), like_name, shape_of(like));
}

// Two buffers that the kernels write must not be one buffer.
void refuse_alias(const char* a_name, const TensorView& a, const char* b_name, const TensorView& b) {
  if (a.data == b.data) fail_arg("{} and {} point to the same memory; each gradient needs a buffer of its own", a_name, b_name);
}

}  // namespace

void validate_flash(const FlashParams& p, bool complete, bool o_optional) {
  const TensorView &q = p.q, &k = p.k;
  validate_inputs(p.q, p.k, p.v, p.scale, p.tile_q, p.tile_k, p.descale);
  const StateView& s = p.state;
  const bool o_left_out = o_optional && s.o == nullptr && p.mode == StateMode::Write && p.out.data != nullptr;
  if ((s.o == nullptr && !o_left_out) || s.lse == nullptr) fail_arg("the output state (o, lse) must point to memory");
  if (s.batch != q.batch || s.heads != q.heads || s.len != q.len || s.dim != q.dim)
    fail_arg("state shape [{}, {}, {}, {}] does not match q [{}, {}, {}, {}]", s.batch, s.heads, s.len, s.dim, q.batch,
             q.heads, q.len, q.dim);
  const TensorView& o = p.out;
  if (o.data != nullptr && (o.batch != q.batch || o.heads != q.heads || o.len != q.len || o.dim != q.dim))
    fail_arg("output shape [{}, {}, {}, {}] does not match q [{}, {}, {}, {}]", o.batch, o.heads, o.len, o.dim, q.batch,
             q.heads, q.len, q.dim);
  if (o.data != nullptr && o.dtype != q.dtype)
    fail_arg("output dtype {} does not match q's dtype {}: the final output is written in the input dtype",
             dtype_name(o.dtype), dtype_name(q.dtype));
  // Both ends of the visible range grow with the row, and a band never skips a row: when the first
  // and the last row see a key, every row does.
  if (!complete) return;
  const MaskSpec m = clamp_offset(p.mask, q.len, k.len);
  for (const int64_t row : {int64_t(0), q.len - 1})
    if (visible_range(m, row, k.len).empty())
      fail_arg("the mask (causal {}, q_offset {}, window {}) leaves query row {} with no visible key; a complete "
               "attention needs a key for every row (causal: q_offset >= 0, the default kv_len - q_len)",
               p.mask.causal, p.mask.q_offset, p.mask.window, row);
}

void validate_backward(const BackwardParams& p) {
  const TensorView &q = p.q, &k = p.k;
  validate_inputs(p.q, p.k, p.v, p.scale, p.tile_q, p.tile_k, p.descale);
  for (const auto& [name, x] : {std::pair<const char*, const TensorView&>{"o", p.o}, {"dout", p.dout}}) {
    if (x.data == nullptr) fail_arg("{} must point to data", name);
    if (!same_shape(x, q)) fail_arg("{} has shape {} but q has {}; they must be equal", name, shape_of(x), shape_of(q));
    if (x.dtype != q.dtype)
      fail_arg("{} is {} but q is {}; o and dout must be in the inputs' dtype", name, dtype_name(x.dtype),
               dtype_name(q.dtype));
  }
  const LseView& l = p.lse;
  if (l.data == nullptr) fail_arg("lse (the forward's log-sum-exp) must point to data");
  if (l.batch != q.batch || l.heads != q.heads || l.len != q.len)
    fail_arg("lse has shape [{}, {}, {}] but q has [{}, {}, {}, ...]; lse must be [batch, q_heads, q_len]", l.batch,
             l.heads, l.len, q.batch, q.heads, q.len);
  validate_grad("dq", p.dq, "q", q);
  validate_grad("dk", p.dk, "k", k);
  validate_grad("dv", p.dv, "v", p.v);
  refuse_alias("dq", p.dq, "dk", p.dk);
  refuse_alias("dq", p.dq, "dv", p.dv);
  refuse_alias("dk", p.dk, "dv", p.dv);
  if (p.mode != GradMode::Write && p.mode != GradMode::Accumulate)
    fail_arg("gradient mode {} is unknown: allowed are Write (0) and Accumulate (1)", int(p.mode));
}

}  // namespace ringattn
