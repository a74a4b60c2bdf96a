// The (o, lse) merge, split-KV decode and the validation of flash calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "common/test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "core/error.hpp"

namespace ringattn {
namespace {

using test::HostState;
using test::HostTensor;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Partial states of one query row over disjoint key chunks, plus the fp64 state over all keys.
struct Partials {
  int64_t d;
  std::vector<std::vector<float>> o;
  std::vector<float> lse;
  std::vector<double> ref_o;
  double ref_lse;
};

Partials make_partials(int n, int64_t d, std::mt19937_64& rng, int empty_every = 0) {
  const int64_t keys_per = 5;
  std::mt19937_64 r2(rng());
  HostTensor q(DType::F32, 1, 1, 1, d, r2), k(DType::F32, 1, 1, n * keys_per, d, r2),
      v(DType::F32, 1, 1, n * keys_per, d, r2);
  Partials out{d, {}, {}, {}, 0};
  for (int c = 0; c < n; ++c) {
    std::vector<float> o(static_cast<size_t>(d));
    float lse;
    FlashParams p;
    p.q = q.view;
    p.k = k.view.rows(c * keys_per, keys_per);
    p.v = v.view.rows(c * keys_per, keys_per);
    p.state = contiguous_state(o.data(), &lse, 1, 1, 1, d);
    p.scale = 0.3f;
    // Every `empty_every`-th chunk is made invisible through a causal offset.
    p.mask = MaskSpec{empty_every > 0 && c % empty_every == 0, -1};
    cpu::flash_forward(p);
    out.o.push_back(o);
    out.lse.push_back(lse);
  }
  FlashParams all;
  all.q = q.view;
  all.k = k.view;
  all.v = v.view;
  all.scale = 0.3f;
  std::vector<float> dummy(static_cast<size_t>(d));
  float dl;
  all.state = contiguous_state(dummy.data(), &dl, 1, 1, 1, d);
  // Reference over the visible chunks only.
  std::vector<double> ro(size_t(d), 0.0);
  double rl = -std::numeric_limits<double>::infinity();
  for (int c = 0; c < n; ++c) {
    if (empty_every > 0 && c % empty_every == 0) continue;
    FlashParams pc = all;
    pc.k = k.view.rows(c * keys_per, keys_per);
    pc.v = v.view.rows(c * keys_per, keys_per);
    std::vector<double> o(static_cast<size_t>(d));
    double l;
    cpu::naive_row(pc, 0, 0, 0, o.data(), &l);
    if (rl == -std::numeric_limits<double>::infinity()) {
      ro = o;
      rl = l;
      continue;
    }
    const double mx = std::max(rl, l), s = std::exp(rl - mx) + std::exp(l - mx);
    for (int64_t i = 0; i < d; ++i) ro[size_t(i)] = (ro[size_t(i)] * std::exp(rl - mx) + o[size_t(i)] * std::exp(l - mx)) / s;
    rl = mx + std::log(s);
  }
  out.ref_o = ro;
  out.ref_lse = rl;
  return out;
}

// Folds the partials in the given order, each group merged first, then the groups.
std::pair<std::vector<float>, float> fold(const Partials& p, const std::vector<int>& order, int group) {
  std::vector<float> acc(size_t(p.d), 0.f);
  float acc_lse = kNegInf;
  for (size_t g = 0; g < order.size(); g += size_t(group)) {
    std::vector<float> part(size_t(p.d), 0.f);
    float part_lse = kNegInf;
    for (size_t i = g; i < std::min(order.size(), g + size_t(group)); ++i)
      cpu::merge_row(part.data(), &part_lse, p.o[size_t(order[i])].data(), p.lse[size_t(order[i])], p.d);
    cpu::merge_row(acc.data(), &acc_lse, part.data(), part_lse, p.d);
  }
  return {acc, acc_lse};
}

TEST(Merge, AssociativeAndOrderIndependent) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const int n = 1 + int(rng() % 16);
    const Partials p = make_partials(n, 32, rng, trial % 3 == 0 ? 3 : 0);
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    for (int perm = 0; perm < 5; ++perm) {
      std::shuffle(order.begin(), order.end(), rng);
      const int group = 1 + int(rng() % 4);
      auto [o, lse] = fold(p, order, group);
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " n " << n << " group " << group);
      if (std::isinf(p.ref_lse)) {
        EXPECT_EQ(lse, kNegInf);
        continue;
      }
      EXPECT_NEAR(lse, p.ref_lse, 1e-5 * std::max(1.0, std::abs(p.ref_lse)));
      EXPECT_LT(test::rel_error(o, p.ref_o), 1e-5);
    }
  }
}

TEST(Merge, EmptyStateIsIdentity) {
  std::mt19937_64 rng(test::fresh_seed());
  std::normal_distribution<float> n;
  std::vector<float> a(16), empty(16, 0.f);
  for (auto& x : a) x = n(rng);
  const std::vector<float> a0 = a;
  float lse = 1.25f;
  cpu::merge_row(a.data(), &lse, empty.data(), kNegInf, 16);
  EXPECT_EQ(a, a0);
  EXPECT_EQ(lse, 1.25f);
  std::vector<float> e2(16, 0.f);
  float le = kNegInf;
  cpu::merge_row(e2.data(), &le, a0.data(), 1.25f, 16);
  EXPECT_EQ(e2, a0);
  EXPECT_EQ(le, 1.25f);
}

TEST(Merge, BothEmptyStaysEmptyWithoutNaN) {
  std::vector<float> a(8, 0.f), b(8, 0.f);
  float la = kNegInf;
  cpu::merge_row(a.data(), &la, b.data(), kNegInf, 8);
  EXPECT_EQ(la, kNegInf);
  for (float x : a) EXPECT_EQ(x, 0.f);
}

TEST(Merge, FarApartStatesStayFinite) {
  std::vector<float> a = {1.f, 2.f}, b = {3.f, -4.f};
  float la = 0.f;
  cpu::merge_row(a.data(), &la, b.data(), 250.f, 2);
  EXPECT_FLOAT_EQ(la, 250.f);
  EXPECT_FLOAT_EQ(a[0], 3.f);
  EXPECT_FLOAT_EQ(a[1], -4.f);
  std::vector<float> c = {1.f, 2.f}, d = {3.f, -4.f};
  float lc = 100.f;
  cpu::merge_row(c.data(), &lc, d.data(), -150.f, 2);
  EXPECT_FLOAT_EQ(lc, 100.f);
  EXPECT_FLOAT_EQ(c[0], 1.f);
  EXPECT_TRUE(std::isfinite(c[1]));
}

TEST(Merge, StatesOfDifferentShapesAreRejected) {
  HostState a(1, 2, 3, 4), b(1, 2, 4, 4);
  EXPECT_THROW(cpu::merge_states(MergeParams{a.view, b.view}), InvalidArgument);
}

// Split-KV decode equals the unsplit kernel for 1..32 splits, also when splits see no key.
TEST(SplitDecode, EqualsUnsplit) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t B = 2, HQ = 8, HKV = 2, T = 3, S = 77, D = 64;
  HostTensor q(DType::F32, B, HQ, T, D, rng), k(DType::F32, B, HKV, S, D, rng), v(DType::F32, B, HKV, S, D, rng);
  for (bool causal : {false, true}) {
    HostState whole(B, HQ, T, D);
    FlashParams p;
    p.q = q.view;
    p.k = k.view;
    p.v = v.view;
    p.state = whole.view;
    p.scale = 0.125f;
    p.mask = MaskSpec{causal, causal ? 20 : 0};  // chunked prefill: keys past 22 are invisible to every row
    cpu::flash_forward(p);
    for (int splits = 1; splits <= 32; ++splits) {
      HostState split(B, HQ, T, D);
      DecodeParams dp{p, splits};
      dp.flash.state = split.view;
      cpu::decode_split_kv(dp);
      double worst = 0;
      for (size_t i = 0; i < whole.o.size(); ++i)
        worst = std::max(worst, double(std::abs(whole.o[i] - split.o[i])));
      for (size_t i = 0; i < whole.lse.size(); ++i)
        worst = std::max(worst, double(std::abs(whole.lse[i] - split.lse[i])));
      EXPECT_LT(worst, 1e-5) << "seed " << seed << " splits " << splits << " causal " << causal;
    }
  }
}

// A decode asked for the final output (FlashParams::out) writes it, in the output's dtype, as the
// flash call does: the state's o cast once.
TEST(SplitDecode, WritesTheFinalOutputWhenAsked) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t B = 1, HQ = 4, HKV = 1, T = 2, S = 40, D = 16;
  HostTensor q(DType::BF16, B, HQ, T, D, rng), k(DType::BF16, B, HKV, S, D, rng), v(DType::BF16, B, HKV, S, D, rng);
  HostTensor out(DType::BF16, B, HQ, T, D, rng);
  for (int64_t i = 0; i < out.view.numel(); ++i) store_from_float(out.bytes.data(), DType::BF16, i, std::nanf(""));
  HostState st(B, HQ, T, D);
  FlashParams p;
  p.q = q.view;
  p.k = k.view;
  p.v = v.view;
  p.state = st.view;
  p.scale = 0.25f;
  p.mask = MaskSpec{true, S - T};
  p.out = out.view;
  cpu::decode_split_kv(DecodeParams{p, 3});
  for (int64_t i = 0; i < out.view.numel(); ++i) {
    const float want = load_as_float(st.o.data(), DType::F32, i);
    const float got = load_as_float(out.bytes.data(), DType::BF16, i);
    ASSERT_TRUE(std::isfinite(got)) << "element " << i << " not written (seed " << seed << ")";
    EXPECT_NEAR(got, want, 1e-2 * std::max(1.f, std::abs(want))) << "element " << i << " seed " << seed;
  }
}

// ---- validation: every bad input is an InvalidArgument whose message names the value ----

struct Valid {
  std::mt19937_64 rng{1};
  HostTensor q{DType::F32, 2, 8, 5, 16, rng}, k{DType::F32, 2, 2, 7, 16, rng}, v{DType::F32, 2, 2, 7, 16, rng};
  HostState st{2, 8, 5, 16};
  FlashParams p() {
    FlashParams f;
    f.q = q.view;
    f.k = k.view;
    f.v = v.view;
    f.state = st.view;
    f.scale = 0.25f;
    return f;
  }
};

void expect_rejected(const FlashParams& p, bool complete, const std::string& needle) {
  try {
    validate_flash(p, complete);
    ADD_FAILURE() << "accepted, expected an error mentioning '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Validation, RejectsBadInputWithClearMessages) {
  Valid ok;
  EXPECT_NO_THROW(validate_flash(ok.p(), true));
  FlashParams p = ok.p();
  p.q.heads = 7;
  p.state.heads = 7;
  expect_rejected(p, true, "q_heads=7 is not a multiple of kv_heads=2");
  p = ok.p();
  p.k.dim = 32;
  expect_rejected(p, true, "head_dim mismatch: q has 16, k has 32");
  p = ok.p();
  p.v.batch = 3;
  expect_rejected(p, true, "batch mismatch");
  p = ok.p();
  p.q.len = 0;
  expect_rejected(p, true, "q_len must be >= 1 (got 0)");
  p = ok.p();
  p.k.len = 0;
  p.v.len = 0;
  expect_rejected(p, true, "kv_len must be >= 1 (got 0)");
  p = ok.p();
  p.scale = std::numeric_limits<float>::infinity();
  expect_rejected(p, true, "scale must be finite");
  p = ok.p();
  p.scale = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(p, true, "scale must be finite");
  p = ok.p();
  p.mask = MaskSpec{true, -1};
  expect_rejected(p, true, "the mask (causal true, q_offset -1, window -1) leaves query row 0 with no visible key");
  EXPECT_NO_THROW(validate_flash(p, false));  // a partial attention may have empty rows
  p = ok.p();
  p.k.dtype = DType::F16;
  expect_rejected(p, true, "dtype mismatch");
  p = ok.p();
  p.state.len = 4;
  expect_rejected(p, true, "state shape");
  p = ok.p();
  p.out = ok.q.view;  // the output in q's shape, but another dtype
  p.out.dtype = DType::BF16;
  expect_rejected(p, true, "output dtype bf16 does not match q's dtype fp32");
  p.out.dtype = DType::F32;
  EXPECT_NO_THROW(validate_flash(p, true));
  // The state's o may be left out only where the caller allows it (a GPU decode), in Write mode,
  // with the output given; the CPU decode requires it.
  p.state.o = nullptr;
  EXPECT_NO_THROW(validate_flash(p, false, /*o_optional=*/true));
  expect_rejected(p, false, "the output state (o, lse) must point to memory");
  EXPECT_THROW(cpu::decode_split_kv(DecodeParams{p, 4}), InvalidArgument);
  p.mode = StateMode::Fold;
  try {
    validate_flash(p, false, true);
    ADD_FAILURE() << "a Fold without o was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "the output state (o, lse) must point to memory");
  }
  p.mode = StateMode::Write;
  p.out = TensorView{};
  EXPECT_THROW(validate_flash(p, false, true), InvalidArgument);
  // Scale factors have their place in the params, and no kernel takes them yet.
  const float one = 1.f;
  p = ok.p();
  p.descale.v = &one;
  expect_rejected(p, true, "scale factors are not supported by any kernel yet: the descale of v is set");
  p.descale.v = nullptr;
  p.descale.q = &one;
  expect_rejected(p, false, "the descale of q is set");
  EXPECT_THROW(cpu::decode_split_kv(DecodeParams{p, 4}), InvalidArgument);
  // The kernel entry points validate too.
  p = ok.p();
  p.q.heads = 6;
  p.state.heads = 6;
  p.k.heads = 4;
  p.v.heads = 4;
  EXPECT_THROW(cpu::flash_forward(p), InvalidArgument);
  EXPECT_THROW(cpu::decode_split_kv(DecodeParams{p, 4}), InvalidArgument);
}

}  // namespace
}  // namespace ringattn
