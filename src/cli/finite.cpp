#include "cli/finite.hpp"

#include <cmath>
#include <vector>

#include <fmt/format.h>

namespace ringattn::cli {
namespace {

// Scans a contiguous [B, H, T, D] tensor (D = 1 for lse) whose rows follow `layout`.
std::string first_nonfinite(const char* name, const void* data, DType dtype, int64_t B, int64_t H,
                            const ShardLayout& layout, int64_t D, int rank) {
  const int64_t T = layout.tokens(), n = B * H * T * D;
  for (int64_t i = 0; i < n; ++i) {
    const float x = load_as_float(data, dtype, i);
    if (std::isfinite(x)) continue;
    const int64_t d = i % D, t = (i / D) % T, h = (i / D / T) % H, b = i / D / T / H;
    const std::string where = D > 1 ? fmt::format("[batch {}, head {}, token {}, dim {}]", b, h,
                                                  layout.global_position(t), d)
                                    : fmt::format("[batch {}, head {}, token {}]", b, h, layout.global_position(t));
    return fmt::format("rank {}: --check-finite: {} holds {} at {} (the first non-finite element of this rank's "
                       "{} rows)", rank, name, x, where, T);
  }
  return "";
}

}  // namespace

std::string check_inputs_finite(const GlobalProblem& p, const LocalProblem& l, Backend& b, int rank) {
  struct Input {
    const char* name;
    const DeviceBuffer* buf;
    int64_t heads;
    const ShardLayout* layout;
  };
  std::vector<uint8_t> host;
  b.synchronize();
  for (const Input& in : {Input{"q", &l.q, p.q_heads, &l.q_layout}, Input{"k", &l.k, p.kv_heads, &l.kv_layout},
                          Input{"v", &l.v, p.kv_heads, &l.kv_layout}}) {
    const void* data = in.buf->get();
    if (b.device_memory()) {
      host.resize(in.buf->bytes());
      b.copy_to_host(host.data(), data, host.size());
      data = host.data();
    }
    if (std::string e = first_nonfinite(in.name, data, p.dtype, p.batch, in.heads, *in.layout, p.head_dim, rank);
        !e.empty())
      return e + "; the run was not started";
  }
  return "";
}

std::string check_outputs_finite(const GlobalProblem& p, const LocalProblem& l, const HostResult& r, int rank) {
  if (std::string e = first_nonfinite("out", r.out.data(), p.dtype, p.batch, p.q_heads, l.q_layout, p.head_dim, rank);
      !e.empty())
    return e;
  return first_nonfinite("lse", r.lse.data(), DType::F32, p.batch, p.q_heads, l.q_layout, 1, rank);
}

}  // namespace ringattn::cli
