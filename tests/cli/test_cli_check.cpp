// The reference check of `ringattn run --check` must fail when the output is wrong: a perturbed
// element, a row left unwritten (NaN poison), a wrong LSE. It passes on the runtime's output.
#include <gtest/gtest.h>

#include <cmath>

#include "cli/check.hpp"
#include "common/test_util.hpp"

namespace ringattn::cli {
namespace {

struct Fixture {
  GlobalProblem p;
  InputSource src;
  std::unique_ptr<Backend> b = make_cpu_backend();
  std::unique_ptr<Transport> t = make_local_transport();
  std::optional<RingPlan> ring;
  LocalProblem local;
  HostResult result;

  Fixture(uint64_t seed, DType dtype) : src(seed) {
    p.batch = 2;
    p.q_heads = 4;
    p.kv_heads = 2;
    p.q_len = p.kv_len = 96;
    p.head_dim = 32;
    p.causal = true;
    p.dtype = dtype;
    ring.emplace(ring_plan(p, 1, 0));
    local = load_local(p, &*ring, src, *b, 0, 1);
    run_forward(p, local, *b, *t, {});
    result = copy_result(p, local, *b);
  }
  CheckResult check() { return check_rows(p, src, local, result, 0, 1, 0, 1); }
};

TEST(CliCheck, PassesOnTheRuntimeOutput) {
  const uint64_t seed = test::fresh_seed();
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Fixture f(seed, dt);
    const CheckResult c = f.check();
    EXPECT_TRUE(c.pass()) << "seed " << seed << " " << dtype_name(dt) << " max abs " << c.max_abs;
    EXPECT_EQ(c.rows_checked, 2 * 4 * 96) << "small problems check every row";
    EXPECT_GT(c.max_abs, 0.0) << "the oracle is fp64, so some rounding shows";
    EXPECT_LT(c.max_abs, dtype_info(dt).tolerance.atol);
  }
}

TEST(CliCheck, FailsOnAPerturbedElement) {
  const uint64_t seed = test::fresh_seed();
  Fixture f(seed, DType::F32);
  std::mt19937_64 rng(seed);
  const int64_t n = int64_t(f.result.out.size() / sizeof(float));
  const int64_t i = int64_t(rng() % uint64_t(n));
  float* o = reinterpret_cast<float*>(f.result.out.data());
  o[i] += 1e-3f;  // ten times the fp32 tolerance
  const CheckResult c = f.check();
  EXPECT_FALSE(c.pass()) << "seed " << seed << " element " << i;
  EXPECT_EQ(c.violations, 1);
  EXPECT_NEAR(c.max_abs, 1e-3, 1e-5);
}

TEST(CliCheck, FailsOnAnUnwrittenRowAndAWrongLse) {
  const uint64_t seed = test::fresh_seed();
  Fixture f(seed, DType::BF16);
  store_from_float(f.result.out.data(), DType::BF16, 5, NAN);  // as if the poison survived
  CheckResult c = f.check();
  EXPECT_FALSE(c.pass()) << "seed " << seed;
  EXPECT_EQ(c.nan_count, 1);
  Fixture g(seed, DType::F32);
  g.result.lse[17] += 0.5f;
  c = g.check();
  EXPECT_FALSE(c.pass()) << "seed " << seed;
  EXPECT_NEAR(c.max_lse_abs, 0.5, 1e-4);
}

}  // namespace
}  // namespace ringattn::cli
