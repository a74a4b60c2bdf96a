#include "runner/ring/ring_buffers.hpp"

#include <chrono>

#include <fmt/format.h>

#include "core/error.hpp"

namespace ringattn {

BlockLayout layout_of(const TensorView& x) {
  const int64_t B = x.batch, H = x.heads, T = x.len, D = x.dim;
  // A dimension of extent 1 may carry any stride; only the others decide the layout.
  auto eq = [](int64_t n, int64_t stride, int64_t want) { return n <= 1 || stride == want; };
  const bool bhtd = eq(T, x.stride_t, D) && eq(H, x.stride_h, T * D) && eq(B, x.stride_b, H * T * D);
  const bool bthd = eq(H, x.stride_h, D) && eq(T, x.stride_t, H * D) && eq(B, x.stride_b, T * H * D);
  // A one-token shard (uneven shards) is dense in both layouts, but it must name the layout that
  // the other ranks' blocks travel in (the agreement compares them): bthd_view gives it away by
  // its token stride. (With one head the two layouts are the same memory at any length: bhtd.)
  if (bhtd && bthd && H > 1 && T == 1 && x.stride_t == H * D) return BlockLayout::Bthd;
  if (bhtd) return BlockLayout::Bhtd;
  if (bthd) return BlockLayout::Bthd;
  return BlockLayout::Strided;
}

TensorView block_view(void* data, const TensorView& x, BlockLayout l) {
  return l == BlockLayout::Bthd ? bthd_view(data, x.dtype, x.batch, x.heads, x.len, x.dim)
                                : bhtd_view(data, x.dtype, x.batch, x.heads, x.len, x.dim);
}

void pack_block(Backend& b, void* dst, const TensorView& x, BlockLayout l) {
  const size_t es = size_t(dtype_size(x.dtype));
  const TensorView to = block_view(dst, x, l);
  if (layout_of(x) == layout_of(to)) {
    b.copy(dst, x.data, size_t(block_elems(x)) * es);
    return;
  }
  // A part of a shard's rows (a block that ships some of them), or a strided view: row by row (a
  // head's run at once where both hold it densely). Packing happens once per run, before the hop
  // loop, so per-row copies cost nothing per hop.
  for (int64_t bi = 0; bi < x.batch; ++bi)
    for (int64_t h = 0; h < x.heads; ++h) {
      char* out = static_cast<char*>(dst) + size_t(to.offset(bi, h, 0)) * es;
      const char* in = static_cast<const char*>(x.data) + size_t(x.offset(bi, h, 0)) * es;
      if (x.stride_t == x.dim && to.stride_t == x.dim) {
        b.copy(out, in, size_t(x.len * x.dim) * es);
      } else {
        for (int64_t t = 0; t < x.len; ++t)
          b.copy(out + size_t(t * to.stride_t) * es, in + size_t(t * x.stride_t) * es, size_t(x.dim) * es);
      }
    }
}

std::string check_view(const char* what, const TensorView& x, int64_t batch, int64_t heads, int64_t len,
                       int64_t dim, DType dtype) {
  if (x.data == nullptr && x.numel() > 0) return fmt::format("{} has no data", what);
  if (x.batch != batch || x.heads != heads || x.len != len || x.dim != dim)
    return fmt::format("{} is [{}, {}, {}, {}] but this rank needs [{}, {}, {}, {}] (batch, heads, tokens, head_dim)",
                       what, x.batch, x.heads, x.len, x.dim, batch, heads, len, dim);
  if (x.dtype != dtype) return fmt::format("{} is {} but the problem is {}", what, dtype_name(x.dtype), dtype_name(dtype));
  return "";
}

RankStats begin_run(const GlobalProblem& p, const LocalVerdict& local, Transport& t, const RunOptions& opt) {
  RankStats st;
  st.rank = t.rank();
  st.world = t.size();
  if (opt.check_agreement) {
    const auto t0 = std::chrono::steady_clock::now();
    agree_on_run(p, local, t);
    st.agree_s = seconds_since(t0);
  } else if (!local.error.empty()) {
    fail_arg("rank {}: {}", st.rank, local.error);
  }
  return st;
}

}  // namespace ringattn
