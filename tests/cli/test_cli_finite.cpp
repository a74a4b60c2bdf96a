// --check-finite on outputs: the first NaN or Inf of out or lse is named by tensor and global
// index, whatever the sharding puts on the rank.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cli/finite.hpp"

namespace ringattn::cli {
namespace {

TEST(CliFinite, NamesTheFirstNonFiniteOutputByGlobalIndex) {
  GlobalProblem p;
  p.batch = 2, p.q_heads = 2, p.kv_heads = 1, p.head_dim = 4;
  p.q_len = p.kv_len = 16;
  p.sharding = Sharding::Zigzag;
  LocalProblem l;
  const RingPlan ring = ring_plan(p, 2, 1);
  layouts_for(p, &ring, 1, 2, l.q_layout, l.kv_layout);  // rank 1 of 2: tokens 4..11
  const int64_t T = l.q_layout.tokens();
  ASSERT_EQ(T, 8);
  HostResult r;
  r.out.assign(size_t(p.batch * p.q_heads * T * p.head_dim) * sizeof(float), 0);
  r.lse.assign(size_t(p.batch * p.q_heads * T), 0.f);
  EXPECT_EQ(check_outputs_finite(p, l, r, 1), "");

  // out[batch 1, head 0, local row 2, dim 3]: local row 2 of rank 1 is global token 6.
  float* out = reinterpret_cast<float*>(r.out.data());
  out[((1 * 2 + 0) * T + 2) * 4 + 3] = std::numeric_limits<float>::quiet_NaN();
  const std::string m = check_outputs_finite(p, l, r, 1);
  EXPECT_NE(m.find("rank 1: --check-finite: out holds nan at [batch 1, head 0, token 6, dim 3]"), std::string::npos)
      << m;

  out[((1 * 2 + 0) * T + 2) * 4 + 3] = 0;
  r.lse[size_t((0 * 2 + 1) * T + 7)] = -INFINITY;  // batch 0, head 1, local row 7 = token 11
  const std::string m2 = check_outputs_finite(p, l, r, 1);
  EXPECT_NE(m2.find("lse holds -inf at [batch 0, head 1, token 11]"), std::string::npos) << m2;
}

}  // namespace
}  // namespace ringattn::cli
