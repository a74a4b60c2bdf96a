#include "cli/finite.hpp"

#include <cmath>
#include <vector>

#include <fmt/format.h>

namespace ringattn::cli {
namespace {

struct NonFinite {
  bool found = false;
  float value = 0;
  int64_t b = 0, h = 0, token = 0, d = 0;  // token: the global position
  std::string where;
};

// Scans a contiguous [B, H, T, D] tensor (D = 1 for lse) whose rows follow `layout`.
NonFinite find_nonfinite(const void* data, DType dtype, int64_t B, int64_t H, const ShardLayout& layout, int64_t D) {
  NonFinite f;
  const int64_t T = layout.tokens(), n = B * H * T * D;
  for (int64_t i = 0; i < n; ++i) {
    const float x = load_as_float(data, dtype, i);
    if (std::isfinite(x)) continue;
    f = {true, x, i / D / T / H, (i / D / T) % H, layout.global_position((i / D) % T), i % D, ""};
    f.where = D > 1 ? fmt::format("[batch {}, head {}, token {}, dim {}]", f.b, f.h, f.token, f.d)
                    : fmt::format("[batch {}, head {}, token {}]", f.b, f.h, f.token);
    return f;
  }
  return f;
}

std::string first_nonfinite(const char* name, const void* data, DType dtype, int64_t B, int64_t H,
                            const ShardLayout& layout, int64_t D, int rank) {
  const NonFinite f = find_nonfinite(data, dtype, B, H, layout, D);
  if (!f.found) return "";
  return fmt::format("rank {}: --check-finite: {} holds {} at {} (the first non-finite element of this rank's {} rows)",
                     rank, name, f.value, f.where, layout.tokens());
}

}  // namespace

namespace {

// One input tensor of this rank: its buffer, global sizes, rows and where its elements come from.
struct Input {
  const char* name;
  InputTensor which;
  const DeviceBuffer* buf;
  int64_t heads, len;
  const ShardLayout* layout;
  InputSource* src;
};

std::string check_input(const GlobalProblem& p, const Input& in, Backend& b, int rank, std::vector<uint8_t>& host) {
  const void* data = in.buf->get();
  if (b.device_memory()) {
    host.resize(in.buf->bytes());
    b.copy_to_host(host.data(), data, host.size());
    data = host.data();
  }
  const NonFinite f = find_nonfinite(data, p.dtype, p.batch, in.heads, *in.layout, p.head_dim);
  if (!f.found) return "";
  // An infinity in a half dtype may be a finite input that the conversion overflowed: read the
  // source element in fp32 to tell.
  std::vector<float> row(size_t(p.head_dim));
  if (std::isinf(f.value) && p.dtype != DType::F32) {
    in.src->rows(in.which, f.b, f.h, f.token, 1, in.heads, in.len, p.head_dim, row.data(), DType::F32);
    const float orig = row[size_t(f.d)];
    if (std::isfinite(orig))
      return fmt::format("rank {}: --check-finite: {} holds {} at {}, which overflows {} (largest finite {:g}); the "
                         "run was not started (scale the inputs, or use --dtype fp32)",
                         rank, in.name, orig, f.where, dtype_name(p.dtype), dtype_info(p.dtype).max_finite);
  }
  return fmt::format("rank {}: --check-finite: {} holds {} at {} (the first non-finite element of this rank's {} "
                     "rows); the run was not started", rank, in.name, f.value, f.where, in.layout->tokens());
}

}  // namespace

std::string check_inputs_finite(const GlobalProblem& p, const LocalProblem& l, Backend& b, int rank,
                                InputSource& src) {
  std::vector<uint8_t> host;
  b.synchronize();
  for (const Input& in : {Input{"q", InputTensor::Q, &l.q, p.q_heads, p.q_len, &l.q_layout, &src},
                          Input{"k", InputTensor::K, &l.k, p.kv_heads, p.kv_len, &l.kv_layout, &src},
                          Input{"v", InputTensor::V, &l.v, p.kv_heads, p.kv_len, &l.kv_layout, &src}})
    if (std::string e = check_input(p, in, b, rank, host); !e.empty()) return e;
  return "";
}

std::string check_dout_finite(const GlobalProblem& p, const LocalProblem& l, const DeviceBuffer& dout, Backend& b,
                              int rank, InputSource& src, InputTensor which) {
  std::vector<uint8_t> host;
  b.synchronize();
  return check_input(p, Input{"dO", which, &dout, p.q_heads, p.q_len, &l.q_layout, &src}, b, rank, host);
}

std::string check_outputs_finite(const GlobalProblem& p, const LocalProblem& l, const HostResult& r, int rank) {
  if (std::string e = first_nonfinite("out", r.out.data(), p.dtype, p.batch, p.q_heads, l.q_layout, p.head_dim, rank);
      !e.empty())
    return e;
  return first_nonfinite("lse", r.lse.data(), DType::F32, p.batch, p.q_heads, l.q_layout, 1, rank);
}

}  // namespace ringattn::cli
