// The CPU engine behind the Backend interface: FlashParams::out gives the final output cast once,
// equal to the state cast afterwards, in Write and Fold mode.
#include <gtest/gtest.h>

#include <random>

#include "common/test_util.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

namespace ringattn {
namespace {

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
