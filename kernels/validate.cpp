// Validation of a flash call, shared by every backend: bad input never reaches a kernel.
#include <cmath>

#include "kernels/params.hpp"
#include "core/error.hpp"

namespace ringattn {

DType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::F32;
  if (name == "fp16" || name == "f16" || name == "float16" || name == "half") return DType::F16;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  fail_arg("unknown dtype '{}': allowed are fp32, fp16, bf16", name);
}

void validate_flash(const FlashParams& p, bool complete) {
  const TensorView &q = p.q, &k = p.k, &v = p.v;
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
  if (!std::isfinite(p.scale)) fail_arg("softmax scale must be finite (got {})", p.scale);
  if (p.tile_q < 0 || p.tile_k < 0 || p.tile_q > kMaxTile || p.tile_k > kMaxTile)
    fail_arg("tile sizes must be 1 to {}, or 0 for the default (got {}x{})", kMaxTile, p.tile_q, p.tile_k);
  const StateView& s = p.state;
  if (s.o == nullptr || s.lse == nullptr) fail_arg("the output state (o, lse) must point to memory");
  if (s.batch != q.batch || s.heads != q.heads || s.len != q.len || s.dim != q.dim)
    fail_arg("state shape [{}, {}, {}, {}] does not match q [{}, {}, {}, {}]", s.batch, s.heads, s.len, s.dim, q.batch,
             q.heads, q.len, q.dim);
  const TensorView& o = p.out;
  if (o.data != nullptr && (o.batch != q.batch || o.heads != q.heads || o.len != q.len || o.dim != q.dim))
    fail_arg("output shape [{}, {}, {}, {}] does not match q [{}, {}, {}, {}]", o.batch, o.heads, o.len, o.dim, q.batch,
             q.heads, q.len, q.dim);
  // Visible ranges grow with the row: row 0 sees the fewest keys.
  if (complete && visible_range(p.mask, 0, k.len).empty())
    fail_arg("causal attention with q_offset={} leaves query row 0 with no visible key; a complete attention needs "
             "q_offset >= 0 (the default is kv_len - q_len)", p.mask.q_offset);
}

}  // namespace ringattn
