// The C ABI (ringattn_c.h): DLPack descriptors checked and turned into an op::AttentionCall, run
// on the backend of the tensors' device, every exception caught at the boundary and returned as
// a status and one line of text.
#include "ringattn_c.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "attention_op.hpp"
#include "descriptors.hpp"
#include "core/error.hpp"

namespace ringattn::op {

std::string shape_text(const ringattn_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", t.shape[i]);
  return s + "]";
}

// The row of the dtype table (core/dtype.hpp) with DLPack type d; null when none has it.
const DTypeInfo* table_dtype(const ringattn_dtype& d) {
  for (const DTypeInfo& t : kDTypes)
    if (d.lanes == 1 && d.code == t.dlpack_code && d.bits == 8 * t.bytes) return &t;
  return nullptr;
}

std::string dtype_text(const ringattn_dtype& d) {
  if (const DTypeInfo* t = table_dtype(d)) return t->full_name;
  if (d.lanes == 1 && d.code == 0) return fmt::format("int{}", d.bits);
  return fmt::format("(code {}, bits {}, lanes {})", d.code, d.bits, d.lanes);
}

std::string device_text(const ringattn_device& d) {
  if (d.device_type == kCpu) return "cpu";
  if (d.device_type == kCuda) return fmt::format("cuda:{}", d.device_id);
  return fmt::format("device type {}", d.device_type);
}

// The stride of axis i in elements (DLPack: NULL strides are compact row-major).
int64_t stride_of(const ringattn_tensor& t, int i) {
  if (t.strides) return t.strides[i];
  int64_t s = 1;
  for (int j = t.ndim - 1; j > i; --j) s *= t.shape[j];
  return s;
}

const ringattn_tensor& need(const char* name, const ringattn_tensor* t) {
  if (t == nullptr) fail_arg("{} is missing (a null descriptor)", name);
  if (t->ndim < 0 || t->ndim > 8 || (t->ndim > 0 && t->shape == nullptr))
    fail_arg("{} has a malformed descriptor (ndim {}, shape {})", name, t->ndim, t->shape ? "set" : "null");
  if (t->data == nullptr) fail_arg("{} has no data (a null pointer)", name);
  return *t;
}

DType float_dtype(const char* name, const ringattn_tensor& t) {
  if (const DTypeInfo* d = table_dtype(t.dtype)) return d->id;
  // The table's dtypes, last first (the order of ringattn.torch's message): "bfloat16, float16 and float32".
  std::string allowed;
  for (size_t i = kDTypes.size(); i-- > 0;)
    allowed += fmt::format("{}{}", i + 1 == kDTypes.size() ? "" : i == 0 ? " and " : ", ", kDTypes[i].full_name);
  fail_arg("{} has dtype {}; allowed are {}", name, dtype_text(t.dtype), allowed);
}

// q, k, v, out, dout and the gradients: [B, T, H, D] (or [T, H, D] packed) as a [B, H, T, D] view.
TensorView attention_view(const char* name, const ringattn_tensor* tp, bool packed) {
  const ringattn_tensor& t = need(name, tp);
  const int want = packed ? 3 : 4;
  if (t.ndim != want)
    fail_arg("{} has {} dimensions (shape {}); {} must be {}", name, t.ndim, shape_text(t), name,
             packed ? "[total_tokens, heads, head_dim] with cu_seqlens" : "[batch, seq_len, heads, head_dim]");
  const int o = packed ? -1 : 0;  // axis of the batch; tokens at o + 1, heads o + 2, dim o + 3
  const int64_t dim = t.shape[o + 3];
  if (dim > 1 && stride_of(t, o + 3) != 1)
    fail_arg("{} has stride {} along head_dim (shape {}); the head dim must be contiguous (stride 1)", name,
             stride_of(t, o + 3), shape_text(t));
  const int64_t batch = packed ? 1 : t.shape[0], len = t.shape[o + 1], heads = t.shape[o + 2];
  const int64_t sb = packed ? len * stride_of(t, 0) : stride_of(t, 0);
  const DType dt = float_dtype(name, t);
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  return TensorView{data, dt, batch, heads, len, dim, sb, stride_of(t, o + 2), stride_of(t, o + 1)};
}

std::string view_shape(const TensorView& v, bool packed) {
  return packed ? fmt::format("[{}, {}, {}]", v.len, v.heads, v.dim)
                : fmt::format("[{}, {}, {}, {}]", v.batch, v.len, v.heads, v.dim);
}

void same_device(const char* name, const ringattn_tensor* t, const ringattn_tensor* q) {
  if (t->device.device_type != q->device.device_type || t->device.device_id != q->device.device_id)
    fail_arg("{} is on {} but q is on {}; all tensors must be on one device", name, device_text(t->device),
             device_text(q->device));
}

// The tensor `name` must have exactly the shape and dtype of `like`.
void same_as(const char* name, const TensorView& t, const char* like_name, const TensorView& like, bool packed) {
  if (t.batch != like.batch || t.heads != like.heads || t.len != like.len || t.dim != like.dim)
    fail_arg("{} has shape {} but {} has {}; they must be equal", name, view_shape(t, packed), like_name,
             view_shape(like, packed));
  if (t.dtype != like.dtype)
    fail_arg("{} is {} but {} is {}; they must be equal", name, dtype_name(t.dtype), like_name, dtype_name(like.dtype));
}

// lse: fp32 [B, Hq, T] (packed: [Hq, T]), contiguous along the tokens.
void parse_lse(AttentionCall& c, const ringattn_tensor* tp, bool packed) {
  const ringattn_tensor& t = need("lse", tp);
  const int want = packed ? 2 : 3;
  const std::string expect = packed ? fmt::format("[{}, {}] (q_heads, total_tokens)", c.q.heads, c.q.len)
                                    : fmt::format("[{}, {}, {}] (batch, q_heads, q_len)", c.q.batch, c.q.heads, c.q.len);
  if (const DTypeInfo* d = table_dtype(t.dtype); d == nullptr || d->id != DType::F32)
    fail_arg("lse has dtype {}; lse is float32", dtype_text(t.dtype));
  const int o = packed ? -1 : 0;
  if (t.ndim != want || (!packed && t.shape[0] != c.q.batch) || t.shape[o + 1] != c.q.heads || t.shape[o + 2] != c.q.len)
    fail_arg("lse has shape {}; it must be {}", shape_text(t), expect);
  if (c.q.len > 1 && stride_of(t, o + 2) != 1)
    fail_arg("lse has stride {} along the tokens; it must be contiguous there (stride 1)", stride_of(t, o + 2));
  c.lse = reinterpret_cast<float*>(static_cast<char*>(t.data) + t.byte_offset);
  c.lse_stride_h = stride_of(t, o + 1);
  c.lse_stride_b = packed ? c.q.heads * c.lse_stride_h : stride_of(t, 0);
}

// cu_seqlens: int32/int64 [docs + 1] in host memory, 0 = cu[0] <= cu[1] <= ... <= cu[docs] = tokens.
std::vector<int64_t> parse_cu_seqlens(const ringattn_tensor* tp, int64_t tokens, int64_t max_seqlen) {
  const ringattn_tensor& t = need("cu_seqlens", tp);
  if (t.dtype.code != 0 || (t.dtype.bits != 32 && t.dtype.bits != 64) || t.dtype.lanes != 1)
    fail_arg("cu_seqlens has dtype {}; allowed are int32 and int64", dtype_text(t.dtype));
  if (t.ndim != 1 || t.shape[0] < 2)
    fail_arg("cu_seqlens has shape {}; it must be [docs + 1] with at least one document", shape_text(t));
  if (t.device.device_type != kCpu) fail_arg("cu_seqlens is on {}; it must be in host memory", device_text(t.device));
  std::vector<int64_t> cu(size_t(t.shape[0]));
  const char* base = static_cast<const char*>(t.data) + t.byte_offset;
  for (size_t i = 0; i < cu.size(); ++i) {
    const int64_t at = int64_t(i) * stride_of(t, 0);
    cu[i] = t.dtype.bits == 32 ? reinterpret_cast<const int32_t*>(base)[at] : reinterpret_cast<const int64_t*>(base)[at];
  }
  if (cu[0] != 0) fail_arg("cu_seqlens[0] is {}; the boundaries must start at 0", cu[0]);
  int64_t longest = 0;
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1])
      fail_arg("cu_seqlens decreases at index {} ({} after {}); the boundaries must not decrease", i, cu[i], cu[i - 1]);
    longest = std::max(longest, cu[i] - cu[i - 1]);
  }
  if (cu.back() != tokens)
    fail_arg("cu_seqlens ends at {} but q has {} tokens; the last boundary must be total_tokens", cu.back(), tokens);
  if (max_seqlen != 0 && max_seqlen < longest)
    fail_arg("max_seqlen is {} but the longest document (cu_seqlens) has {} tokens; it must be at least that",
             max_seqlen, longest);
  return cu;
}

// The arguments that are not tensors.
void parse_args(AttentionCall& c, const ringattn_attention_args* a) {
  if (a == nullptr) fail_arg("args is missing (a null pointer)");
  if (a->abi_version != RINGATTN_C_ABI_VERSION)
    fail_arg("args.abi_version is {} but this library is ABI version {}; rebuild the caller against its ringattn_c.h",
             a->abi_version, RINGATTN_C_ABI_VERSION);
  c.causal = a->causal != 0;
  c.window = Window{a->window_left, a->window_right};
  for (const auto& [side, w] : {std::pair{"left", c.window.left}, std::pair{"right", c.window.right}})
    if (w < -1) fail_arg("window {} {} is out of range: a side is -1 (unbounded) or >= 0 tokens", side, w);
  if (c.causal && c.window.right > 0)
    fail_arg("window right {} does not fit causal attention: with causal the right edge is the diagonal, so right "
             "must be 0 or -1", c.window.right);
  if (a->max_seqlen < 0) fail_arg("max_seqlen is {}; it must be >= 0 (0: not given)", a->max_seqlen);
  if (a->cu_seqlens == nullptr && a->max_seqlen != 0)
    fail_arg("max_seqlen is {} without cu_seqlens; it is only meaningful with packed documents", a->max_seqlen);
  if (a->has_softmax_scale && !std::isfinite(a->softmax_scale))
    fail_arg("softmax_scale is {}; it must be finite", a->softmax_scale);
  c.deterministic = a->deterministic != 0;
}

// q, k, v, out and lse of a call, checked against each other.
AttentionCall parse_call(const ringattn_attention_args* a, const ringattn_tensor* q, const ringattn_tensor* k,
                         const ringattn_tensor* v, const ringattn_tensor* out, const ringattn_tensor* lse) {
  AttentionCall c;
  parse_args(c, a);
  const bool packed = a->cu_seqlens != nullptr;
  c.q = attention_view("q", q, packed);
  c.k = attention_view("k", k, packed);
  c.v = attention_view("v", v, packed);
  same_as("v", c.v, "k", c.k, packed);
  for (const auto& [n, t] : {std::pair{"k", k}, std::pair{"v", v}, std::pair{"out", out}, std::pair{"lse", lse}})
    same_device(n, &need(n, t), q);
  if (c.k.dtype != c.q.dtype)
    fail_arg("k is {} but q is {}; q, k and v must have one dtype", dtype_name(c.k.dtype), dtype_name(c.q.dtype));
  for (const auto& [n, x] : {std::pair{"batch", c.q.batch}, std::pair{"q_len", c.q.len}, std::pair{"q_heads", c.q.heads},
                             std::pair{"head_dim", c.q.dim}, std::pair{"kv_len", c.k.len}, std::pair{"kv_heads", c.k.heads}})
    if (x < 1) fail_arg("{} is {} (q {}, k {}); it must be >= 1", n, x, view_shape(c.q, packed), view_shape(c.k, packed));
  if (c.k.batch != c.q.batch) fail_arg("k has batch {} but q has {}; they must be equal", c.k.batch, c.q.batch);
  if (c.k.dim != c.q.dim) fail_arg("k has head_dim {} but q has {}; they must be equal", c.k.dim, c.q.dim);
  if (c.q.heads % c.k.heads != 0)
    fail_arg("q has {} heads and k {}; q_heads must be a multiple of kv_heads (grouped-query attention)", c.q.heads,
             c.k.heads);
  if (packed && c.k.len != c.q.len)
    fail_arg("k has {} tokens but q has {}; with cu_seqlens q, k and v hold the same packed documents", c.k.len,
             c.q.len);
  if (packed) c.cu = parse_cu_seqlens(a->cu_seqlens, c.q.len, a->max_seqlen);
  c.out = attention_view("out", out, packed);
  same_as("out", c.out, "q", c.q, packed);
  parse_lse(c, lse, packed);
  c.scale = a->has_softmax_scale ? float(a->softmax_scale) : float(1.0 / std::sqrt(double(c.q.dim)));
  return c;
}

// The backend of the tensors' device: the CPU engine, or a CUDA backend on the caller's stream
// whose scratch comes from the caller's allocator (the driver's stream-ordered pool without one).
// Made per call: the device's facts are read once per process (kernels/backend.hpp).
std::unique_ptr<Backend> backend_for(const ringattn_tensor& q, const ringattn_attention_args& a) {
  if (q.device.device_type == kCpu) return make_cpu_backend();
  if (q.device.device_type == kCuda) {
    if (!cuda_built())
      fail_arg("q is on {} but this ringattn_c was built without CUDA; rebuild it with RINGATTN_CUDA=ON (pip: "
               "-C cmake.define.RINGATTN_CUDA=ON) or pass CPU tensors", device_text(q.device));
    CudaBackendConfig config;
    config.device = q.device.device_id;
    config.caller_stream = true;
    config.stream = a.stream;
    if (a.allocator != nullptr) {
      config.allocator.ctx = a.allocator->ctx;
      config.allocator.allocate = a.allocator->allocate;
      config.allocator.deallocate = a.allocator->deallocate;
    }
    return make_cuda_backend(config);
  }
  fail_arg("q is on {}; allowed are cpu and cuda", device_text(q.device));
}

Allocator allocator_of(const ringattn_attention_args& a) {
  Allocator al;
  al.stream = a.stream;
  if (a.allocator != nullptr) {
    if (a.allocator->allocate == nullptr) fail_arg("args.allocator has no allocate function");
    al.ctx = a.allocator->ctx;
    al.allocate = a.allocator->allocate;
    al.deallocate = a.allocator->deallocate;
  }
  return al;
}

}  // namespace ringattn::op

using namespace ringattn;

extern "C" {

int32_t ringattn_c_abi_version(void) { return RINGATTN_C_ABI_VERSION; }

int32_t ringattn_attention_fwd(const ringattn_attention_args* args, const ringattn_tensor* q, const ringattn_tensor* k,
                               const ringattn_tensor* v, const ringattn_tensor* out, const ringattn_tensor* lse,
                               char* error, size_t error_size) {
  return op::guarded(error, error_size, [&] {
    const op::AttentionCall c = op::parse_call(args, q, k, v, out, lse);
    const op::DeviceGuard guard(*q);
    const std::unique_ptr<Backend> b = op::backend_for(*q, *args);
    op::attention_forward(*b, c, op::allocator_of(*args));
  });
}

int32_t ringattn_attention_bwd(const ringattn_attention_args* args, const ringattn_tensor* dout,
                               const ringattn_tensor* q, const ringattn_tensor* k, const ringattn_tensor* v,
                               const ringattn_tensor* out, const ringattn_tensor* lse, const ringattn_tensor* dq,
                               const ringattn_tensor* dk, const ringattn_tensor* dv, char* error, size_t error_size) {
  return op::guarded(error, error_size, [&] {
    const op::AttentionCall c = op::parse_call(args, q, k, v, out, lse);
    const bool packed = args->cu_seqlens != nullptr;
    op::GradViews g;
    const std::pair<const char*, const ringattn_tensor*> grads[] = {{"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}};
    for (const auto& [n, t] : grads) op::same_device(n, &op::need(n, t), q);
    g.dout = op::attention_view("dout", dout, packed);
    g.dq = op::attention_view("dq", dq, packed);
    g.dk = op::attention_view("dk", dk, packed);
    g.dv = op::attention_view("dv", dv, packed);
    op::same_as("dout", g.dout, "q", c.q, packed);
    op::same_as("dq", g.dq, "q", c.q, packed);
    op::same_as("dk", g.dk, "k", c.k, packed);
    op::same_as("dv", g.dv, "v", c.v, packed);
    const op::DeviceGuard guard(*q);
    const std::unique_ptr<Backend> b = op::backend_for(*q, *args);
    op::attention_backward(*b, c, g, op::allocator_of(*args));
  });
}

}  // extern "C"
