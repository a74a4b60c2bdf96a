// The CUDA flash forward against the fp64 oracle (cpu::naive_attention): bf16/fp16 on tensor
// cores, the fp32 SIMT path, GQA, causal with q_offset, sliding windows (the lower edge, causal or
// not), lengths that are not tile multiples, strided [B,T,H,D] views, Write and Fold.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <tuple>

#include "gpu/gpu_test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cuda/flash_dispatch.hpp"
#include "core/error.hpp"

namespace ringattn {
namespace {

using test::DeviceState;
using test::DeviceTensor;
using test::HostState;
using test::HostTensor;
class CudaFlash : public test::GpuTest {};

struct Case {
  const char* name;
  int64_t batch, kv_heads, group, q_len, kv_len;
  bool causal;
  int64_t q_offset;
  bool bthd;
  int64_t window = -1;  // >= 0: the mask's lower edge (MaskSpec::window)
};

// Prefill, chunked prefill, decode, full attention, rows that see nothing, odd lengths.
const Case kCases[] = {
    {"prefill", 1, 2, 1, 200, 200, true, 0, false},
    {"full", 2, 2, 4, 130, 333, false, 0, false},
    {"chunked_prefill_bthd", 1, 1, 8, 77, 300, true, 223, true},
    {"decode", 2, 1, 8, 1, 1000, true, 999, false},
    {"empty_rows", 1, 2, 4, 70, 90, true, -10, true},
    {"long_gqa4_bthd", 1, 2, 4, 129, 1100, true, 971, true},
};

// Sliding windows: the lower edge alone (not causal) and with the causal edge, windows of 0 and 1
// key, odd sizes below and above the key tiles (32/64 portable, 128/176 Hopper) and on their
// multiples, causal offsets (chunked prefill, decode), rows and whole query tiles that see no
// key, and odd lengths.
const Case kWindowCases[] = {
    {"win0_causal", 1, 2, 2, 200, 200, true, 0, false, 0},
    {"win1_causal_gqa4", 1, 2, 4, 333, 333, true, 0, false, 1},
    {"win37_causal_bthd", 2, 1, 4, 300, 300, true, 0, true, 37},
    {"win63_causal", 1, 2, 1, 257, 257, true, 0, false, 63},
    {"win128_causal", 1, 1, 2, 517, 517, true, 0, false, 128},
    {"win175_causal_gqa8", 1, 1, 8, 400, 400, true, 0, false, 175},
    {"win300_chunked_prefill_bthd", 1, 1, 8, 129, 1100, true, 971, true, 300},
    {"win1000_offset", 1, 2, 2, 500, 1300, true, 800, false, 1000},
    {"win5_rows_without_keys", 1, 2, 2, 90, 70, true, -10, false, 5},
    {"win257_decode", 2, 1, 8, 1, 1000, true, 999, false, 257},
    {"lower_edge_only", 2, 2, 4, 130, 333, false, 100, false, 50},
    {"lower_edge_win0", 1, 2, 1, 211, 301, false, 0, false, 0},
    {"lower_edge_tiles_without_keys", 1, 1, 2, 350, 300, false, 100, false, 20},
};

// The flash options of one tensor-core kernel configuration (0: the default). Variant 0 is the
// backend's dispatch default (the Hopper kernel on sm_90 where it applies); 1..3 force the
// portable mma.sync kernel in that configuration (cuda::MmaVariant).
cuda::FlashKernelOptions variant_options(int v) {
  cuda::FlashKernelOptions o = cuda::flash_options(settings().kernels());
  o.kernel = v == 0 ? cuda::FlashKernel::Auto : cuda::FlashKernel::Portable;
  o.mma_variant = v;
  return o;
}

// Runs case c on `be` with fresh random inputs and a NaN-poisoned state, and checks it against
// the fp64 oracle with the dtype's tolerance; rows that see no key must hold the empty state.
void check_case(Backend& be, const Case& c, DType dtype, int dim, std::mt19937_64& rng, uint64_t seed) {
  const int64_t hq = c.kv_heads * c.group;
  HostTensor q(dtype, c.batch, hq, c.q_len, dim, rng, c.bthd),
      k(dtype, c.batch, c.kv_heads, c.kv_len, dim, rng, c.bthd),
      v(dtype, c.batch, c.kv_heads, c.kv_len, dim, rng, c.bthd);
  DeviceTensor dq(be, q), dk(be, k), dv(be, v);
  DeviceState st(be, c.batch, hq, c.q_len, dim);
  FlashParams p;
  p.q = dq.view;
  p.k = dk.view;
  p.v = dv.view;
  p.state = st.view;
  p.scale = 1.f / std::sqrt(float(dim));
  p.mask = MaskSpec{c.causal, c.q_offset, c.window};
  be.flash(p);
  std::vector<float> o, lse;
  st.read(be, o, lse);

  FlashParams hp = p;
  hp.q = q.view;
  hp.k = k.view;
  hp.v = v.view;
  const cpu::Reference ref = cpu::naive_attention(hp);
  SCOPED_TRACE(::testing::Message() << "case " << c.name << " dtype " << dtype_name(dtype) << " dim " << dim
                                    << " window " << c.window << " seed " << seed);
  const double err = test::rel_error(o, ref.o);
  const double lse_err = test::max_abs_error(lse, ref.lse);
  if (dtype == DType::F32) {
    EXPECT_LT(err, 1e-5);
    EXPECT_LT(lse_err, 2e-5);
  } else {
    const double naive = test::rel_error(test::naive_same_dtype(hp), ref.o);
    EXPECT_LT(err, 1e-2);
    EXPECT_LE(err, test::same_dtype_bound(naive)) << "naive same-dtype error " << naive;
    EXPECT_LT(lse_err, 1e-3);
  }
  // Rows that see no key hold exactly the empty state.
  for (int64_t r = 0; r < c.batch * hq * c.q_len; ++r) {
    if (!std::isinf(ref.lse[size_t(r)])) continue;
    EXPECT_EQ(lse[size_t(r)], -std::numeric_limits<float>::infinity()) << "row " << r;
    for (int64_t d = 0; d < dim; ++d) ASSERT_EQ(o[size_t(r * dim + d)], 0.f) << "row " << r;
  }
}

// (dtype, head dim, kernel configuration: 0 default, 1..3 see variant_options)
class FlashVsOracle : public test::GpuTestP<std::tuple<DType, int, int>> {};

TEST_P(FlashVsOracle, MatchesFp64Reference) {
  const auto [dtype, dim, variant] = GetParam();
  be = make_cuda_backend(0, variant_options(variant));
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (const Case& c : kCases) check_case(*be, c, dtype, dim, rng, seed);
}

TEST_P(FlashVsOracle, SlidingWindowMatchesFp64Reference) {
  const auto [dtype, dim, variant] = GetParam();
  be = make_cuda_backend(0, variant_options(variant));
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (const Case& c : kWindowCases) check_case(*be, c, dtype, dim, rng, seed);
}

std::string flash_case_name(const ::testing::TestParamInfo<std::tuple<DType, int, int>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_d" + std::to_string(std::get<1>(info.param)) + "_v" +
         std::to_string(std::get<2>(info.param));
}
INSTANTIATE_TEST_SUITE_P(TensorCores, FlashVsOracle,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F16), ::testing::Values(64, 128),
                                            ::testing::Values(0, 1, 2, 3)),
                         flash_case_name);
INSTANTIATE_TEST_SUITE_P(Fp32, FlashVsOracle,
                         ::testing::Combine(::testing::Values(DType::F32), ::testing::Values(64, 128, 80),
                                            ::testing::Values(0)),
                         flash_case_name);

// Fold: state := merge(state, this call). The incoming state has empty rows, and some query rows
// see no key (negative q_offset): those rows must stay bit-for-bit unchanged.
class FlashFold : public test::GpuTestP<DType> {};

TEST_P(FlashFold, MergesIntoIncomingState) {
  const DType dtype = GetParam();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t B = 2, HKV = 2, HQ = 8, T = 100, S = 150, D = 128;
  HostTensor q(dtype, B, HQ, T, D, rng), k(dtype, B, HKV, S, D, rng), v(dtype, B, HKV, S, D, rng);
  // The incoming state: a random partial (lse around 3), every 7th row empty.
  HostState init(B, HQ, T, D);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& x : init.o) x = n(rng);
  for (size_t r = 0; r < init.lse.size(); ++r) {
    init.lse[r] = 3.f + n(rng);
    if (r % 7 == 0) {
      init.lse[r] = -std::numeric_limits<float>::infinity();
      for (int64_t d = 0; d < D; ++d) init.o[r * D + size_t(d)] = 0.f;
    }
  }
  DeviceTensor dq(*be, q), dk(*be, k), dv(*be, v);
  for (int variant : dtype == DType::F32 ? std::vector<int>{0} : std::vector<int>{0, 1, 2, 3}) {
    // Without and with a window (rows 20.. then see at most 31 keys, from their lower edge).
    for (const int64_t window : {int64_t(-1), int64_t(30)}) {
      // A backend of its own per variant: the inputs stay in the fixture's (replacing it would free them).
      const std::unique_ptr<Backend> vb = make_cuda_backend(0, variant_options(variant));
      DeviceState st(*vb, B, HQ, T, D, &init);
      FlashParams p;
      p.q = dq.view;
      p.k = dk.view;
      p.v = dv.view;
      p.state = st.view;
      p.scale = 0.09f;
      p.mask = MaskSpec{true, -20, window};  // rows 0..19 see no key
      p.mode = StateMode::Fold;
      vb->flash(p);
      std::vector<float> o, lse;
      st.read(*vb, o, lse);

      FlashParams hp = p;
      hp.q = q.view;
      hp.k = k.view;
      hp.v = v.view;
      const cpu::Reference ref = cpu::naive_attention(hp);
      // Expected: the fp64 merge of the incoming state with the oracle's partial.
      std::vector<double> want_o(init.o.size()), want_lse(init.lse.size());
      for (size_t r = 0; r < init.lse.size(); ++r) {
        const double la = init.lse[r], lb = ref.lse[r];
        double wa = 1, wb = 0, l = la;
        if (std::isinf(la) && std::isinf(lb)) {
          wa = 0;
        } else if (std::isinf(la)) {
          wa = 0, wb = 1, l = lb;
        } else if (!std::isinf(lb)) {
          const double mx = std::max(la, lb), s = std::exp(la - mx) + std::exp(lb - mx);
          wa = std::exp(la - mx) / s, wb = std::exp(lb - mx) / s, l = mx + std::log(s);
        }
        want_lse[r] = l;
        for (int64_t d = 0; d < D; ++d)
          want_o[r * D + size_t(d)] = wa * init.o[r * D + size_t(d)] + wb * ref.o[r * D + size_t(d)];
      }
      SCOPED_TRACE(::testing::Message() << "dtype " << dtype_name(dtype) << " variant " << variant << " window "
                                        << window << " seed " << seed);
      EXPECT_LT(test::rel_error(o, want_o), dtype == DType::F32 ? 1e-5 : 1e-2);
      EXPECT_LT(test::max_abs_error(lse, want_lse), dtype == DType::F32 ? 2e-5 : 1e-3);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < HQ; ++h)
          for (int64_t i = 0; i < 20; ++i) {
            const size_t r = size_t((b * HQ + h) * T + i);
            ASSERT_EQ(std::memcmp(&lse[r], &init.lse[r], 4), 0) << "row " << r << " changed";
            ASSERT_EQ(std::memcmp(&o[r * D], &init.o[r * D], size_t(D) * 4), 0) << "row " << r << " changed";
          }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FlashFold, ::testing::Values(DType::BF16, DType::F16, DType::F32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// A zero or negative softmax scale is unusual but valid: same result as the oracle.
TEST_F(CudaFlash, NonPositiveScale) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (float scale : {-0.07f, 0.f}) {
    HostTensor q(DType::BF16, 1, 4, 90, 128, rng), k(DType::BF16, 1, 2, 150, 128, rng),
        v(DType::BF16, 1, 2, 150, 128, rng);
    DeviceTensor dq(*be, q), dk(*be, k), dv(*be, v);
    DeviceState st(*be, 1, 4, 90, 128);
    FlashParams p;
    p.q = dq.view;
    p.k = dk.view;
    p.v = dv.view;
    p.state = st.view;
    p.scale = scale;
    p.mask = MaskSpec{true, 30};
    be->flash(p);
    std::vector<float> o, lse;
    st.read(*be, o, lse);
    FlashParams hp = p;
    hp.q = q.view;
    hp.k = k.view;
    hp.v = v.view;
    const cpu::Reference ref = cpu::naive_attention(hp);
    EXPECT_LT(test::rel_error(o, ref.o), 1e-2) << "scale " << scale << " seed " << seed;
    EXPECT_LT(test::max_abs_error(lse, ref.lse), 1e-3) << "scale " << scale << " seed " << seed;
  }
}

// Unsupported input is rejected before any launch, with the value and what is allowed.
TEST_F(CudaFlash, RejectsUnsupportedHeadDimAndLayout) {
  std::mt19937_64 rng(7);
  auto expect_invalid = [&](DType dt, int64_t d, bool misalign, const std::string& needle) {
    HostTensor q(dt, 1, 2, 8, d, rng), k(dt, 1, 2, 8, d, rng), v(dt, 1, 2, 8, d, rng);
    DeviceTensor dq(*be, q), dk(*be, k), dv(*be, v);
    DeviceState st(*be, 1, 2, 8, d);
    FlashParams p;
    p.q = dq.view;
    p.k = dk.view;
    p.v = dv.view;
    p.state = st.view;
    p.scale = 0.1f;
    if (misalign) p.k.stride_t = p.v.stride_t = d + 4, p.k.len = p.v.len = 7;  // rows 8 bytes off
    try {
      be->flash(p);
      ADD_FAILURE() << "accepted, expected an error mentioning '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid(DType::BF16, 96, false, "head_dim=96");
  expect_invalid(DType::F16, 32, false, "allowed are 64, 128 and 256");
  expect_invalid(DType::F32, 320, false, "head_dim=320");
  expect_invalid(DType::BF16, 64, true, "multiples of 8");
}

}  // namespace
}  // namespace ringattn
