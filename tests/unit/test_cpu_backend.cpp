// The CPU engine behind the Backend interface: FlashParams::out gives the final output cast once,
// equal to the state cast afterwards, in Write and Fold mode.
#include <gtest/gtest.h>

#include <random>

#include "common/test_util.hpp"
#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

namespace ringattn {
namespace {

// zero_f32 and add_f32 (the ring backward's accumulators) on strided views: [B,T,H,D] rows of a
// larger buffer; elements outside the views stay untouched.
TEST(CpuBackend, ZeroAndAddF32OnStridedViews) {
  auto b = make_cpu_backend();
  std::mt19937 rng(uint32_t(test::fresh_seed()));
  std::normal_distribution<float> nd;
  const int64_t B = 2, H = 3, T = 5, D = 4;
  std::vector<float> x(size_t(B * T * H * D)), y(x.size());
  for (float& e : x) e = nd(rng);
  for (float& e : y) e = nd(rng);
  const std::vector<float> x0 = x;
  const TensorView xv = bthd_view(x.data(), DType::F32, B, H, T, D).rows(1, 3);
  const TensorView yv = bthd_view(y.data(), DType::F32, B, H, T, D).rows(2, 3);
  b->add_f32(xv, yv);
  for (int64_t i = 0; i < B; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const size_t at = size_t(((i * T + t) * H + h) * D + d);
          const float want = t >= 1 && t < 4 ? x0[at] + y[size_t(((i * T + t + 1) * H + h) * D + d)] : x0[at];
          EXPECT_EQ(x[at], want);
        }
  b->zero_f32(xv);
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H * D; ++j) {
        const size_t at = size_t((i * T + t) * H * D + j);
        EXPECT_EQ(x[at], t >= 1 && t < 4 ? 0.f : x0[at]);
      }
  EXPECT_THROW(b->add_f32(xv, yv.rows(0, 2)), InvalidArgument);
}

TEST(CpuBackend, FlashWithOutputEqualsStateThenCast) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  auto be = make_cpu_backend();
  test::HostTensor q(DType::F16, 1, 4, 37, 32, rng), k(DType::F16, 1, 2, 29, 32, rng), v(DType::F16, 1, 2, 29, 32, rng);
  for (StateMode mode : {StateMode::Write, StateMode::Fold}) {
    test::HostState a(1, 4, 37, 32), b(1, 4, 37, 32);
    if (mode == StateMode::Fold) {  // an incoming state over other keys
      std::normal_distribution<float> n;
      for (size_t i = 0; i < a.o.size(); ++i) a.o[i] = b.o[i] = n(rng);
      for (size_t i = 0; i < a.lse.size(); ++i) a.lse[i] = b.lse[i] = 1.f + n(rng);
    }
    FlashParams p;
    p.q = q.view, p.k = k.view, p.v = v.view;
    p.scale = 0.2f, p.mask = MaskSpec{true, -4}, p.mode = mode;
    p.state = a.view;
    be->flash(p);
    std::vector<uint16_t> want(size_t(4 * 37 * 32)), got(want.size(), 0x7e00);  // fp16 NaN poison
    be->finalize(FinalizeParams{a.view, bhtd_view(want.data(), DType::F16, 1, 4, 37, 32)});
    p.state = b.view;
    p.out = bhtd_view(got.data(), DType::F16, 1, 4, 37, 32);
    be->flash(p);
    EXPECT_EQ(got, want) << "seed " << seed << " mode " << int(mode);
    EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4));
  }
}

}  // namespace
}  // namespace ringattn
