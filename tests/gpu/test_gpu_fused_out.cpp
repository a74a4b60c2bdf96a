// FlashParams::out: the last call on a row writes the final output itself (the Hopper kernel in
// its epilogue; other kernels through the state and a cast). It must equal the state written by
// the same call and cast afterwards, in Write and Fold mode, for rows and whole tiles that see no
// key, and in Write mode it must match the fp64 oracle.
#include <cstring>
#include <random>

#include "gpu_test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cuda/flash_dispatch.hpp"

namespace ringattn {
namespace {

using test::DeviceState;
using test::DeviceTensor;
using test::HostState;
using test::HostTensor;

// (dtype, head dim, kernel: 0 dispatch default (Hopper on sm_90), 2 the portable kernel)
class FusedOut : public test::GpuTestP<std::tuple<DType, int, int>> {};

std::vector<float> read_out(Backend& be, const DeviceBuffer& buf, DType dt, int64_t n) {
  std::vector<uint8_t> raw(size_t(n) * size_t(dtype_size(dt)));
  be.synchronize();
  be.copy_to_host(raw.data(), buf.get(), raw.size());
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = load_as_float(raw.data(), dt, i);
  return out;
}

TEST_P(FusedOut, EqualsStateThenCast) {
  const auto [dtype, dim, kernel] = GetParam();
  cuda::FlashKernelOptions options = cuda::flash_options(settings().kernels());
  options.kernel = kernel == 0 ? cuda::FlashKernel::Auto : cuda::FlashKernel::Portable;
  be = make_cuda_backend(0, options);
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t B = 2, HKV = 2, HQ = 8, T = 300, S = 170, D = dim;
  HostTensor q(dtype, B, HQ, T, D, rng), k(dtype, B, HKV, S, D, rng), v(dtype, B, HKV, S, D, rng);
  HostState init(B, HQ, T, D);  // an incoming partial state for Fold, every 5th row empty
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& x : init.o) x = n(rng);
  for (size_t r = 0; r < init.lse.size(); ++r) {
    init.lse[r] = 2.f + n(rng);
    if (r % 5 == 0) {
      init.lse[r] = -std::numeric_limits<float>::infinity();
      for (int64_t d = 0; d < D; ++d) init.o[r * size_t(D) + size_t(d)] = 0.f;
    }
  }
  DeviceTensor dq(*be, q), dk(*be, k), dv(*be, v);
  const int64_t n_out = B * HQ * T * D;
  const std::vector<uint8_t> poison(size_t(n_out) * size_t(dtype_size(dtype)), 0xff);  // NaN in bf16/fp16
  for (StateMode mode : {StateMode::Write, StateMode::Fold}) {
    // q_offset -140: query rows 0..139 see no key, so whole 128-row tiles see none.
    for (int64_t q_offset : {int64_t(-140), int64_t(S - T)}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " mode " << int(mode) << " q_offset " << q_offset);
      FlashParams p;
      p.q = dq.view, p.k = dk.view, p.v = dv.view;
      p.scale = 1.f / std::sqrt(float(D));
      p.mask = MaskSpec{true, q_offset};
      p.mode = mode;
      // The reference path: the state, then the cast.
      DeviceState ref_state(*be, B, HQ, T, D, mode == StateMode::Fold ? &init : nullptr);
      DeviceBuffer ref_out(*be, poison.size());
      p.state = ref_state.view;
      be->flash(p);
      be->finalize(FinalizeParams{ref_state.view, bhtd_view(ref_out.get(), dtype, B, HQ, T, D)});
      // The fused path.
      DeviceState st(*be, B, HQ, T, D, mode == StateMode::Fold ? &init : nullptr);
      DeviceBuffer out(*be, poison.size());
      be->copy_from_host(out.get(), poison.data(), poison.size());
      p.state = st.view;
      p.out = bhtd_view(out.get(), dtype, B, HQ, T, D);
      be->flash(p);
      const std::vector<float> want = read_out(*be, ref_out, dtype, n_out), got = read_out(*be, out, dtype, n_out);
      std::vector<float> lse_ref, lse, o_unused;
      ref_state.read(*be, o_unused, lse_ref);
      st.read(*be, o_unused, lse);
      for (int64_t i = 0; i < n_out; ++i) {
        const float a = got[size_t(i)], b = want[size_t(i)];
        ASSERT_FALSE(std::isnan(a)) << "output element " << i << " unwritten";
        ASSERT_LE(std::abs(a - b), 1e-2f * std::abs(b) + 1e-6f) << "element " << i;
      }
      for (size_t r = 0; r < lse.size(); ++r)
        ASSERT_TRUE(lse[r] == lse_ref[r] || std::abs(lse[r] - lse_ref[r]) <= 1e-6f * std::abs(lse_ref[r])) << "row " << r;
      if (mode == StateMode::Write && q_offset >= 0) {  // a complete attention: against the oracle too
        FlashParams hp = p;
        hp.q = q.view, hp.k = k.view, hp.v = v.view;
        const cpu::Reference ref = cpu::naive_attention(hp);
        EXPECT_LT(test::rel_error(got, ref.o), 1e-2);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, FusedOut,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F16), ::testing::Values(64, 128),
                                            ::testing::Values(0, 2)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_d" +
                                  std::to_string(std::get<1>(info.param)) + "_k" +
                                  std::to_string(std::get<2>(info.param));
                         });

}  // namespace
}  // namespace ringattn
