// Helpers of the GPU tests: a fixture that skips without a GPU, device copies of host tensors
// and states (outputs poisoned with NaN), and the "naive in the same dtype" reference that
// bounds how accurate a bf16/fp16 kernel can be expected to be.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "common/test_util.hpp"
#include "kernels/backend.hpp"

namespace ringattn::test {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
    be = make_cuda_backend(0);
  }
  std::unique_ptr<Backend> be;
};

template <typename P>
class GpuTestP : public ::testing::TestWithParam<P> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
    be = make_cuda_backend(0);
  }
  std::unique_ptr<Backend> be;
};

// A device copy of a host tensor, with the same layout (strides) as the host view.
struct DeviceTensor {
  DeviceBuffer buf;
  TensorView view;
  DeviceTensor(Backend& be, const HostTensor& h) : buf(be, h.bytes.size()) {
    be.copy_from_host(buf.get(), h.bytes.data(), h.bytes.size());
    view = h.view;
    view.data = buf.get();
  }
};

// A contiguous device state; o and lse start as NaN unless `init` (host o, lse) is given.
struct DeviceState {
  DeviceBuffer o, lse;
  StateView view;
  int64_t n_o, n_lse;
  DeviceState(Backend& be, int64_t b, int64_t h, int64_t t, int64_t d, const HostState* init = nullptr)
      : o(be, size_t(b * h * t * d) * 4), lse(be, size_t(b * h * t) * 4), n_o(b * h * t * d), n_lse(b * h * t) {
    view = contiguous_state(o.as<float>(), lse.as<float>(), b, h, t, d);
    if (init) {
      be.copy_from_host(o.get(), init->o.data(), size_t(n_o) * 4);
      be.copy_from_host(lse.get(), init->lse.data(), size_t(n_lse) * 4);
    } else {
      const std::vector<float> nan_o(size_t(n_o), std::numeric_limits<float>::quiet_NaN());
      const std::vector<float> nan_l(size_t(n_lse), std::numeric_limits<float>::quiet_NaN());
      be.copy_from_host(o.get(), nan_o.data(), nan_o.size() * 4);
      be.copy_from_host(lse.get(), nan_l.data(), nan_l.size() * 4);
    }
  }
  // Waits for the backend's stream, then reads o and lse back.
  void read(Backend& be, std::vector<float>& ho, std::vector<float>& hl) const {
    be.synchronize();
    ho.resize(size_t(n_o));
    hl.resize(size_t(n_lse));
    be.copy_to_host(ho.data(), o.get(), ho.size() * 4);
    be.copy_to_host(hl.data(), lse.get(), hl.size() * 4);
  }
};

inline float round_to(DType t, float x) {
  switch (t) {
    case DType::F16: return fp16_to_float(float_to_fp16(x));
    case DType::BF16: return bf16_to_float(float_to_bf16(x));
    case DType::F32: return x;
  }
  return x;
}

// The same attention computed naively at the precision a 16-bit kernel works in: fp32 scores
// and sums, probabilities rounded to the input dtype before the P V product (as the tensor-core
// kernel must). Its error against the fp64 oracle is the yardstick for the kernel's error.
inline std::vector<double> naive_same_dtype(const FlashParams& p) {
  const int64_t B = p.q.batch, H = p.q.heads, T = p.q.len, D = p.q.dim;
  std::vector<double> out(size_t(B * H * T * D), 0.0);
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        // Row i sees keys [j0, j0 + n) (a window's lower edge moves j0 off 0).
        const KeyRange keys = visible_range(clamp_offset(p.mask, T, p.k.len), i, p.k.len);
        const int64_t hk = h / (H / p.k.heads), j0 = keys.begin, n = keys.size();
        if (n == 0) continue;
        std::vector<float> s(static_cast<size_t>(n)), acc(static_cast<size_t>(D), 0.f);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          float dot = 0.f;
          for (int64_t d = 0; d < D; ++d)
            dot += load_as_float(p.q.data, p.q.dtype, p.q.offset(b, h, i) + d) *
                   load_as_float(p.k.data, p.k.dtype, p.k.offset(b, hk, j0 + j) + d);
          s[size_t(j)] = dot * p.scale;
          m = std::max(m, s[size_t(j)]);
        }
        float l = 0.f;
        for (int64_t j = 0; j < n; ++j) {
          const float pj = std::exp(s[size_t(j)] - m);
          l += pj;
          const float pr = round_to(p.q.dtype, pj);
          for (int64_t d = 0; d < D; ++d)
            acc[size_t(d)] += pr * load_as_float(p.v.data, p.v.dtype, p.v.offset(b, hk, j0 + j) + d);
        }
        for (int64_t d = 0; d < D; ++d) out[size_t(((b * H + h) * T + i) * D + d)] = acc[size_t(d)] / l;
      }
  return out;
}

// The bound on a 16-bit kernel's error: twice the naive same-dtype error, but never below 1e-6
// (fp32 rounding of the softmax sum): rows that see a single key (a window of 0) make the naive
// result exact, while the kernel's exp2(x * scale - max * scale) is 1 only up to an fp32 ulp.
inline double same_dtype_bound(double naive) { return std::max(2.0 * naive, 1e-6); }

}  // namespace ringattn::test
