// The CPU flash engine against the fp64 oracle, on fresh random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

namespace ringattn {
namespace {

using test::HostState;
using test::HostTensor;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The worked example of the design notes: scores [0, 1, 2, -1] against values [2, 4, 1, 3], two
// tiles of two keys.
TEST(OnlineSoftmax, WorkedExample) {
  float m = kNegInf, l = 0.f, acc = 0.f;
  float s1[2] = {0.f, 1.f}, v1[2] = {2.f, 4.f};
  cpu::online_softmax_step(m, l, &acc, s1, 2, v1, 1);
  EXPECT_NEAR(m, 1.0, 1e-6);
  EXPECT_NEAR(l, 1.3679, 1e-4);
  EXPECT_NEAR(acc, 4.7358, 1e-4);
  float s2[2] = {2.f, -1.f}, v2[2] = {1.f, 3.f};
  cpu::online_softmax_step(m, l, &acc, s2, 2, v2, 1);
  EXPECT_NEAR(m, 2.0, 1e-6);
  EXPECT_NEAR(acc / l, 1.8619, 1e-4);

  // The same through the tiled kernel: q = 1, k = scores, D = 1, scale 1, tiles of two keys.
  float q = 1.f, k[4] = {0.f, 1.f, 2.f, -1.f}, v[4] = {2.f, 4.f, 1.f, 3.f}, o = NAN, lse = NAN;
  FlashParams p;
  p.q = bhtd_view(&q, DType::F32, 1, 1, 1, 1);
  p.k = bhtd_view(k, DType::F32, 1, 1, 4, 1);
  p.v = bhtd_view(v, DType::F32, 1, 1, 4, 1);
  p.state = contiguous_state(&o, &lse, 1, 1, 1, 1);
  p.scale = 1.f;
  p.tile_k = 2;
  cpu::flash_forward(p);
  EXPECT_NEAR(o, 1.8619, 1e-4);
  EXPECT_NEAR(lse, 2.0 + std::log(std::exp(-2.0) + std::exp(-1.0) + 1.0 + std::exp(-3.0)), 1e-5);
}

struct Shape {
  int64_t b, hq, hkv, t, s, d;
  bool causal;
  int64_t q_offset;  // for causal; kv_len - q_len is the default
  int64_t window = -1;  // the lower edge (MaskSpec::window): -1 none
};

// Runs the tiled kernel and the oracle on fresh random inputs; returns the relative errors.
struct Errors {
  double o, lse;
};
Errors run_case(const Shape& sh, DType dtype, int tq, int tk, uint64_t seed, bool bthd = false) {
  std::mt19937_64 rng(seed);
  HostTensor q(dtype, sh.b, sh.hq, sh.t, sh.d, rng, bthd), k(dtype, sh.b, sh.hkv, sh.s, sh.d, rng, bthd),
      v(dtype, sh.b, sh.hkv, sh.s, sh.d, rng, bthd);
  HostState st(sh.b, sh.hq, sh.t, sh.d);
  FlashParams p;
  p.q = q.view;
  p.k = k.view;
  p.v = v.view;
  p.state = st.view;
  p.scale = 1.f / std::sqrt(float(sh.d));
  p.mask = MaskSpec{sh.causal, sh.q_offset, sh.window};
  p.tile_q = tq;
  p.tile_k = tk;
  cpu::flash_forward(p);
  const auto ref = cpu::naive_attention(p);
  return {test::rel_error(st.o, ref.o), test::max_abs_error(st.lse, ref.lse)};
}

TEST(CpuFlash, MatchesNaiveOnRandomShapes) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t dims[] = {32, 64, 80, 128};
  const int64_t groups[] = {1, 4, 8};
  for (int trial = 0; trial < 24; ++trial) {
    Shape sh;
    sh.b = 1 + int64_t(rng() % 2);
    sh.hkv = 1 + int64_t(rng() % 2);
    sh.hq = sh.hkv * groups[trial % 3];
    sh.d = dims[(trial / 3) % 4];
    sh.s = 1 + int64_t(rng() % 150);
    const int kind = trial % 4;  // full prefill, chunked prefill, decode, non-causal cross
    sh.causal = kind != 3;
    sh.t = kind == 0 ? sh.s : kind == 1 ? 1 + int64_t(rng() % uint64_t(sh.s)) : kind == 2 ? 1 : 1 + int64_t(rng() % 97);
    sh.q_offset = sh.causal ? sh.s - sh.t : 0;
    const int tq = 1 + int(rng() % 40), tk = 1 + int(rng() % 40);
    const Errors e = run_case(sh, DType::F32, tq, tk, rng());
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " trial " << trial << " b=" << sh.b << " hq=" << sh.hq
                                      << " hkv=" << sh.hkv << " t=" << sh.t << " s=" << sh.s << " d=" << sh.d
                                      << " causal=" << sh.causal << " tiles " << tq << "x" << tk);
    EXPECT_LT(e.o, 1e-5);
    EXPECT_LT(e.lse, 1e-4);
  }
}

// Sliding windows (the lower edge): causal bands and lower edges alone, windows narrower and
// wider than the tiles, offsets that put some rows' windows before or past the keys.
TEST(CpuFlash, WindowsMatchNaive) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    Shape sh{1 + int64_t(rng() % 2), 4, 2, 1 + int64_t(rng() % 90), 1 + int64_t(rng() % 120), trial % 2 ? 64 : 24,
             trial % 3 != 2, 0, int64_t(rng() % 70)};
    sh.q_offset = trial % 4 == 0 ? sh.s - sh.t : int64_t(rng() % uint64_t(sh.s + sh.t)) - sh.t / 2;
    const int tq = 1 + int(rng() % 40), tk = 1 + int(rng() % 40);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " trial " << trial << " t=" << sh.t << " s=" << sh.s
                                      << " causal=" << sh.causal << " q_offset=" << sh.q_offset << " window="
                                      << sh.window << " tiles " << tq << "x" << tk);
    const Errors e = run_case(sh, DType::F32, tq, tk, rng());
    EXPECT_LT(e.o, 1e-5);
    EXPECT_LT(e.lse, 1e-4);
  }
}

TEST(CpuFlash, CausalWithExplicitOffsets) {
  const uint64_t seed = test::fresh_seed();
  // Larger and smaller offsets than the default, including rows that see every key.
  for (int64_t off : {0, 3, 17, 200}) {
    const Errors e = run_case({1, 4, 2, 37, 53, 64, true, off}, DType::F32, 16, 8, seed + off);
    EXPECT_LT(e.o, 1e-5) << "seed " << seed << " q_offset " << off;
    EXPECT_LT(e.lse, 1e-4) << "seed " << seed << " q_offset " << off;
  }
}

TEST(CpuFlash, HalfInputsAreWidened) {
  const uint64_t seed = test::fresh_seed();
  for (DType dt : {DType::F16, DType::BF16}) {
    const Errors e = run_case({2, 8, 2, 45, 61, 64, true, 16}, dt, 16, 16, seed);
    // The oracle reads the same half values, so only fp32 arithmetic separates the two.
    EXPECT_LT(e.o, 1e-5) << "seed " << seed << " dtype " << dtype_name(dt);
  }
}

TEST(CpuFlash, StridedBthdLayout) {
  const uint64_t seed = test::fresh_seed();
  const Errors e = run_case({2, 6, 3, 33, 47, 32, true, 14}, DType::F32, 8, 8, seed, /*bthd=*/true);
  EXPECT_LT(e.o, 1e-5) << "seed " << seed;
}

TEST(CpuFlash, InvariantToTileSizes) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  HostTensor q(DType::F32, 1, 4, 71, 64, rng), k(DType::F32, 1, 2, 71, 64, rng), v(DType::F32, 1, 2, 71, 64, rng);
  std::vector<float> first;
  for (auto [tq, tk] : {std::pair{64, 64}, {1, 1}, {7, 13}, {71, 71}, {128, 3}}) {
    HostState st(1, 4, 71, 64);
    FlashParams p;
    p.q = q.view;
    p.k = k.view;
    p.v = v.view;
    p.state = st.view;
    p.scale = 0.125f;
    p.mask.causal = true;
    p.tile_q = tq;
    p.tile_k = tk;
    cpu::flash_forward(p);
    if (first.empty()) {
      first = st.o;
      continue;
    }
    double worst = 0;
    for (size_t i = 0; i < first.size(); ++i) worst = std::max(worst, double(std::abs(first[i] - st.o[i])));
    EXPECT_LT(worst, 1e-5) << "seed " << seed << " tiles " << tq << "x" << tk;
  }
}

TEST(CpuFlash, PartialRowsWithoutKeysGetEmptyState) {
  std::mt19937_64 rng(test::fresh_seed());
  HostTensor q(DType::F32, 1, 2, 8, 16, rng), k(DType::F32, 1, 1, 8, 16, rng), v(DType::F32, 1, 1, 8, 16, rng);
  HostState st(1, 2, 8, 16);
  FlashParams p;
  p.q = q.view;
  p.k = k.view;
  p.v = v.view;
  p.state = st.view;
  p.scale = 0.25f;
  p.mask = MaskSpec{true, -3};  // rows 0..2 see nothing
  cpu::flash_forward(p);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 8; ++i) {
      const float lse = st.lse[size_t(h * 8 + i)];
      if (i < 3) {
        EXPECT_EQ(lse, kNegInf);
        for (int d = 0; d < 16; ++d) EXPECT_EQ(st.o[size_t((h * 8 + i) * 16 + d)], 0.f);
      } else {
        EXPECT_TRUE(std::isfinite(lse));
      }
    }
  const auto ref = cpu::naive_attention(p);
  EXPECT_LT(test::rel_error(st.o, ref.o), 1e-5);
}

TEST(CpuFlash, WorkspaceIndependentOfKvLen) {
  std::mt19937_64 rng(test::fresh_seed());
  size_t seen = 0;
  for (int64_t s : {64, 512, 4096}) {
    HostTensor q(DType::F32, 1, 2, 64, 64, rng), k(DType::F32, 1, 2, s, 64, rng), v(DType::F32, 1, 2, s, 64, rng);
    HostState st(1, 2, 64, 64);
    FlashParams p;
    p.q = q.view;
    p.k = k.view;
    p.v = v.view;
    p.state = st.view;
    p.scale = 0.125f;
    cpu::flash_forward(p);
    const size_t used = cpu::last_flash_workspace_bytes();
    EXPECT_GT(used, 0u);
    if (seen == 0) seen = used;
    EXPECT_EQ(used, seen) << "workspace grew with kv_len=" << s;
    // Far below one score matrix (q_len x kv_len floats) at the largest kv_len.
    if (s == 4096) {
      EXPECT_LT(used, size_t(64 * 4096 * 4));
    }
  }
}

}  // namespace
}  // namespace ringattn
