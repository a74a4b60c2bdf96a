// Non-finite inputs reach only the rows that see them, on every CUDA forward kernel: a NaN or
// inf planted at one key of K or V, at a position some rows of the same tiles cannot see (the
// causal edge, a window's lower edge, a decode's query positions), must make exactly the rows
// that see the key non-finite; every other row must stay finite and match the fp64 oracle of the
// same inputs with the planted key made finite. Each tensor-core configuration (the portable
// kernel's variants, every Hopper tile, the decode kernels) and the fp32 SIMT path is run, in
// Write, Write with the final output (the Hopper kernel's staged store) and Fold.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cuda/flash_dispatch.hpp"

namespace ringattn {
namespace {

using test::DeviceState;
using test::DeviceTensor;
using test::HostTensor;

enum class Plant { NanV, NanK, InfV };
const char* plant_name(Plant p) { return p == Plant::NanV ? "nan_v" : p == Plant::NanK ? "nan_k" : "inf_v"; }
constexpr int kInfDim = 3;  // InfV: the value's column that holds +inf

struct Shape {
  const char* name;
  int64_t kv_heads, group, q_len, kv_len;
  MaskSpec mask;
  int64_t key;  // the planted key (batch 0, kv head 0)
};

// Every shape puts the planted key inside a key tile that some rows of the same query tiles see
// and others do not.
const Shape kFlashShapes[] = {
    {"causal", 1, 2, 300, 300, MaskSpec{true, 0, -1}, 150},
    {"causal_window", 1, 2, 300, 300, MaskSpec{true, 0, 20}, 150},
    {"lower_edge", 1, 2, 260, 260, MaskSpec{false, 0, 40}, 100},
    {"chunked_prefill", 2, 2, 64, 500, MaskSpec{true, 436, -1}, 470},
};
const Shape kDecodeShapes[] = {
    {"decode_causal", 1, 8, 16, 1000, MaskSpec{true, 984, -1}, 989},      // rows t >= 5 see it
    {"decode_window", 1, 8, 16, 1000, MaskSpec{true, 984, 100}, 889},     // rows t <= 5 see it
    {"decode_two_tokens", 1, 8, 2, 1000, MaskSpec{true, 998, -1}, 999},   // 16 packed rows: t = 1 sees it
    {"decode_two_tokens_window", 1, 8, 2, 1000, MaskSpec{true, 998, 100}, 898},  // t = 0 sees it
    {"decode_one_row", 2, 4, 1, 700, MaskSpec{true, 699, 50}, 640},       // no row sees it
};

float load(const std::vector<uint8_t>& bytes, DType t, int64_t i) { return load_as_float(bytes.data(), t, i); }

// Plants the non-finite value into k or v on the device copy and returns the host copy with a
// finite value in its place (the oracle's inputs).
void plant(Backend& be, Plant what, HostTensor& k, HostTensor& v, const DeviceTensor& dk, const DeviceTensor& dv,
           int64_t key) {
  HostTensor& h = what == Plant::NanK ? k : v;
  const DeviceTensor& d = what == Plant::NanK ? dk : dv;
  const int64_t size = int64_t(dtype_size(h.view.dtype)), D = h.view.dim;
  std::vector<uint8_t> row(size_t(D * size));
  const int64_t off = h.view.offset(0, 0, key);
  for (int64_t c = 0; c < D; ++c) {
    const bool bad = what != Plant::InfV || c == kInfDim;
    const float x = what == Plant::InfV ? std::numeric_limits<float>::infinity() : std::nanf("");
    store_from_float(row.data(), h.view.dtype, c, bad ? x : load(h.bytes, h.view.dtype, off + c));
  }
  be.copy_from_host(static_cast<uint8_t*>(d.view.data) + off * size, row.data(), row.size());
}

struct Result {
  std::vector<float> o, lse;  // o: the state's, or the final output's when one was asked for
};

// Checks every row: those that see the planted key are not finite where the plant says, the others
// finite and close to the oracle.
void check_rows(const Result& got, const cpu::Reference& ref, const Shape& s, Plant what, DType dtype, int64_t hq,
                int64_t batch, int dim) {
  const MaskSpec mask = clamp_offset(s.mask, s.q_len, s.kv_len);
  const double tol_o = dtype == DType::F32 ? 1e-4 : 3e-2, tol_lse = dtype == DType::F32 ? 1e-4 : 2e-3;
  int seen = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < s.q_len; ++i) {
        const int64_t r = (b * hq + h) * s.q_len + i;
        const KeyRange keys = visible_range(mask, i, s.kv_len);
        const bool sees = b == 0 && h / s.group == 0 && keys.begin <= s.key && s.key < keys.end;
        SCOPED_TRACE(::testing::Message() << "batch " << b << " head " << h << " row " << i << " sees " << sees);
        const float lse = got.lse[size_t(r)];
        if (sees) {
          ++seen;
          if (what == Plant::NanK) EXPECT_TRUE(std::isnan(lse)) << "lse " << lse;
          for (int d = 0; d < dim; ++d) {
            if (what == Plant::InfV && d != kInfDim) continue;
            ASSERT_FALSE(std::isfinite(got.o[size_t(r * dim + d)])) << "column " << d;
          }
          continue;
        }
        ASSERT_EQ(std::isinf(ref.lse[size_t(r)]), std::isinf(lse)) << "lse " << lse;
        if (!std::isinf(lse)) ASSERT_NEAR(lse, ref.lse[size_t(r)], tol_lse);
        for (int d = 0; d < dim; ++d) {
          const float x = got.o[size_t(r * dim + d)];
          ASSERT_TRUE(std::isfinite(x)) << "column " << d << " = " << x;
          ASSERT_NEAR(x, ref.o[size_t(r * dim + d)], tol_o) << "column " << d;
        }
      }
  if (s.key < s.kv_len && std::string(s.name) != "decode_one_row") EXPECT_GT(seen, 0) << "the plant reached no row";
}

enum class Mode { Write, WriteOut, Fold };
const char* mode_name(Mode m) { return m == Mode::Write ? "write" : m == Mode::WriteOut ? "write_out" : "fold"; }

// One call: flash (or decode with `splits` > 0) on fresh inputs with the plant, checked row by row.
void run_case(Backend& be, const Shape& s, Plant what, Mode mode, DType dtype, int dim, int splits,
              std::mt19937_64& rng) {
  const int64_t B = s.kv_heads > 1 ? 2 : 1, hq = s.kv_heads * s.group;
  HostTensor q(dtype, B, hq, s.q_len, dim, rng), k(dtype, B, s.kv_heads, s.kv_len, dim, rng),
      v(dtype, B, s.kv_heads, s.kv_len, dim, rng);
  DeviceTensor dq(be, q), dk(be, k), dv(be, v);
  plant(be, what, k, v, dk, dv, s.key);
  // Fold: into the empty state, so that the oracle's result is the expected one (the fold of a
  // non-empty state is tested in test_gpu_flash.cpp; here it is the fold path's slow rows).
  test::HostState init(B, hq, s.q_len, dim);
  std::fill(init.o.begin(), init.o.end(), 0.f);
  std::fill(init.lse.begin(), init.lse.end(), -std::numeric_limits<float>::infinity());
  DeviceState st(be, B, hq, s.q_len, dim, mode == Mode::Fold ? &init : nullptr);
  HostTensor out_h(dtype, B, hq, s.q_len, dim, rng);
  DeviceTensor out(be, out_h);
  FlashParams p;
  p.q = dq.view;
  p.k = dk.view;
  p.v = dv.view;
  p.state = st.view;
  p.scale = 1.f / std::sqrt(float(dim));
  p.mask = s.mask;
  p.mode = mode == Mode::Fold ? StateMode::Fold : StateMode::Write;
  if (mode == Mode::WriteOut) p.out = out.view;
  if (splits > 0) be.decode(DecodeParams{p, splits});
  else be.flash(p);
  Result got;
  st.read(be, got.o, got.lse);
  if (mode == Mode::WriteOut) {
    std::vector<uint8_t> bytes(out_h.bytes.size());
    be.copy_to_host(bytes.data(), out.view.data, bytes.size());
    for (size_t i = 0; i < got.o.size(); ++i) got.o[i] = load(bytes, dtype, int64_t(i));
  }
  FlashParams hp = p;
  hp.q = q.view;
  hp.k = k.view;
  hp.v = v.view;
  hp.out = TensorView{};
  const cpu::Reference ref = cpu::naive_attention(hp);
  SCOPED_TRACE(::testing::Message() << "shape " << s.name << " plant " << plant_name(what) << " mode "
                                    << mode_name(mode) << " dtype " << dtype_name(dtype) << " dim " << dim
                                    << " splits " << splits);
  check_rows(got, ref, s, what, dtype, hq, B, dim);
}

struct Config {
  const char* name;
  DType dtype;
  int dim;
  cuda::FlashKernel kernel;
  int mma_variant;
  const char* hopper_tile;  // "" for the default
};

std::string config_name(const ::testing::TestParamInfo<Config>& info) { return info.param.name; }

class FlashNonFinite : public test::GpuTestP<Config> {};

TEST_P(FlashNonFinite, ReachesOnlyTheRowsThatSeeIt) {
  const Config& c = GetParam();
  cuda::FlashKernelOptions o = cuda::flash_options(settings().kernels());
  o.kernel = c.kernel;
  o.mma_variant = c.mma_variant;
  o.hopper_tile = c.hopper_tile;
  be = make_cuda_backend(0, o);
  std::mt19937_64 rng(test::fresh_seed());
  for (const Shape& s : kFlashShapes)
    for (Plant what : {Plant::NanV, Plant::NanK, Plant::InfV})
      for (Mode mode : {Mode::Write, Mode::WriteOut, Mode::Fold}) run_case(*be, s, what, mode, c.dtype, c.dim, 0, rng);
}

using cuda::FlashKernel;
INSTANTIATE_TEST_SUITE_P(
    Kernels, FlashNonFinite,
    ::testing::Values(Config{"simt_f32_d64", DType::F32, 64, FlashKernel::Auto, 0, ""},
                      Config{"simt_f32_d80", DType::F32, 80, FlashKernel::Auto, 0, ""},
                      Config{"mma_v1_bf16_d128", DType::BF16, 128, FlashKernel::Portable, 1, ""},
                      Config{"mma_v2_f16_d64", DType::F16, 64, FlashKernel::Portable, 2, ""},
                      Config{"mma_v3_bf16_d64", DType::BF16, 64, FlashKernel::Portable, 3, ""},
                      Config{"hopper_default_bf16_d128", DType::BF16, 128, FlashKernel::Auto, 0, ""},
                      Config{"hopper_default_f16_d64", DType::F16, 64, FlashKernel::Auto, 0, ""},
                      Config{"hopper_128x128_bf16_d128", DType::BF16, 128, FlashKernel::Hopper, 0, "128x128"},
                      Config{"hopper_128x176_bf16_d128", DType::BF16, 128, FlashKernel::Hopper, 0, "128x176"},
                      Config{"hopper_192x128_bf16_d128", DType::BF16, 128, FlashKernel::Hopper, 0, "192x128"},
                      Config{"hopper_128x128q2_bf16_d64", DType::BF16, 64, FlashKernel::Hopper, 0, "128x128q2"},
                      Config{"hopper_128x176c2_bf16_d128", DType::BF16, 128, FlashKernel::Hopper, 0, "128x176c2"},
                      Config{"hopper_128x128c2_f16_d64", DType::F16, 64, FlashKernel::Hopper, 0, "128x128c2"},
                      Config{"hopper_128x80_bf16_d256", DType::BF16, 256, FlashKernel::Hopper, 0, "128x80"}),
    config_name);

// Split-KV decode: the phased kernel (16 packed rows, head dims 64/128), the wide row blocks (64
// packed rows or more) and head dim 256's kernel, over several split counts; then merge_splits.
class DecodeNonFinite : public test::GpuTestP<std::tuple<DType, int>> {};

TEST_P(DecodeNonFinite, ReachesOnlyTheRowsThatSeeIt) {
  const auto [dtype, dim] = GetParam();
  std::mt19937_64 rng(test::fresh_seed());
  for (const Shape& s : kDecodeShapes)
    for (Plant what : {Plant::NanV, Plant::NanK, Plant::InfV})
      for (int splits : {1, 3, 50})
        for (Mode mode : {Mode::Write, Mode::Fold}) run_case(*be, s, what, mode, dtype, dim, splits, rng);
}

INSTANTIATE_TEST_SUITE_P(Dims, DecodeNonFinite,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F16, DType::F32),
                                            ::testing::Values(64, 128, 256)),
                         [](const ::testing::TestParamInfo<std::tuple<DType, int>>& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_d" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ringattn
