// The Backend defaults: host staging memory from the heap, and zero_f32 and add_f32 on fp32 views
// of any strides.
#include "kernels/backend.hpp"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "core/error.hpp"

namespace ringattn {
namespace {

void require_f32(const char* what, const TensorView& x) {
  if (x.dtype != DType::F32) fail_arg("{} needs an fp32 view (got {})", what, dtype_name(x.dtype));
}

// Calls f(row of x, row of y) for every (b, h, t): rows of x.dim contiguous floats.
template <typename F>
void for_each_row(const TensorView& x, const TensorView& y, F&& f) {
  for (int64_t b = 0; b < x.batch; ++b)
    for (int64_t h = 0; h < x.heads; ++h)
      for (int64_t t = 0; t < x.len; ++t)
        f(static_cast<float*>(x.data) + x.offset(b, h, t), static_cast<float*>(y.data) + y.offset(b, h, t));
}

}  // namespace

void Backend::check_zero_f32(const TensorView& x) { require_f32("zero_f32", x); }

void Backend::check_add_f32(const TensorView& dst, const TensorView& src) {
  require_f32("add_f32", dst);
  require_f32("add_f32", src);
  if (dst.batch != src.batch || dst.heads != src.heads || dst.len != src.len || dst.dim != src.dim)
    fail_arg("add_f32 needs views of one shape (got [{}, {}, {}, {}] and [{}, {}, {}, {}])", dst.batch, dst.heads,
             dst.len, dst.dim, src.batch, src.heads, src.len, src.dim);
}

void* Backend::allocate_host(size_t bytes) {
  void* p = std::malloc(bytes > 0 ? bytes : 1);
  if (p == nullptr) fail_runtime("{}: {} bytes of host memory for staging could not be allocated", name(), bytes);
  return p;
}

void Backend::free_host(void* p) noexcept { std::free(p); }

void Backend::zero_f32(const TensorView& x) {
  check_zero_f32(x);
  const std::vector<float> zeros(size_t(std::max<int64_t>(x.dim, 0)), 0.f);
  for_each_row(x, x, [&](float* row, float*) {
    if (device_memory())
      copy_from_host(row, zeros.data(), zeros.size() * sizeof(float));
    else
      std::fill(row, row + x.dim, 0.f);
  });
}

void Backend::add_f32(const TensorView& dst, const TensorView& src) {
  check_add_f32(dst, src);
  std::vector<float> a(size_t(std::max<int64_t>(dst.dim, 0))), c(a.size());
  const size_t bytes = a.size() * sizeof(float);
  if (device_memory()) synchronize();  // the rows are read on the host
  for_each_row(dst, src, [&](float* d, float* s) {
    if (!device_memory()) {
      for (int64_t i = 0; i < dst.dim; ++i) d[i] += s[i];
      return;
    }
    copy_to_host(a.data(), d, bytes);
    copy_to_host(c.data(), s, bytes);
    for (size_t i = 0; i < a.size(); ++i) a[i] += c[i];
    copy_from_host(d, a.data(), bytes);
  });
}

}  // namespace ringattn
