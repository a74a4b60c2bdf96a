// ranks: 1 2 4 6
// Hybrid context parallelism over real MPI ranks with the CPU backend (runner/ring/hybrid.hpp):
// for every group size U that divides the world (U = P: all-to-all only; U = 1: the ring), the
// layouts cover the sequence once, and out and lse of every rank's rows match the fp64 oracle and
// the world-of-one run of the same inputs, and so do the gradients of the hybrid backward, over
// shardings, causal and full, GQA, windows, packed documents and uneven lengths; heads that do not
// divide by U, and tensors that do not fit, are refused on every rank alike.
#include <algorithm>
#include <cmath>

#include "comm/mpi_transport.hpp"
#include "mpi_test_util.hpp"
#include "runner/ring/hybrid.hpp"

namespace ringattn {
namespace {

using test::GlobalInputs;
using test::BwdShard;
using test::ShardTensor;

struct HybridCase {
  Sharding sharding;
  bool causal;
  int64_t q_heads, kv_heads, len, dim;
  std::vector<int64_t> docs = {};
  Window window = {};
};

// The world split into groups of U consecutive ranks and the rings across them.
struct Split {
  std::unique_ptr<Transport> world, group, ring;
  explicit Split(int U) : world(make_mpi_transport(MPI_COMM_WORLD)) {
    const int r = world->rank();
    group = world->split(r / U, r % U);
    ring = world->split(r % U, r / U);
  }
};

GlobalProblem problem_of(const HybridCase& c) {
  GlobalProblem p;
  p.batch = 2;
  p.q_heads = c.q_heads;
  p.kv_heads = c.kv_heads;
  p.q_len = p.kv_len = c.len;
  p.head_dim = c.dim;
  p.dtype = DType::F32;
  p.causal = c.causal;
  p.sharding = c.sharding;
  p.doc_lens = c.docs;
  p.window = c.window;
  return p;
}

class Hybrid : public ::testing::TestWithParam<HybridCase> {};

TEST_P(Hybrid, EveryGroupSizeMatchesTheOracleAndTheWorldOfOne) {
  const HybridCase& c = GetParam();
  const int P = test::world_size(), r = test::world_rank();
  const uint64_t seed = test::shared_seed();
  const GlobalProblem p = problem_of(c);
  auto backend = make_cpu_backend();
  // The world of one over the whole sequence: what every group size must give, row by row.
  ShardTensor q1(p.dtype, p.batch, p.q_heads, p.q_len, p.head_dim), k1(p.dtype, p.batch, p.kv_heads, p.kv_len, p.head_dim),
      v1(p.dtype, p.batch, p.kv_heads, p.kv_len, p.head_dim), o1(p.dtype, p.batch, p.q_heads, p.q_len, p.head_dim);
  for (auto [t, which] : {std::pair{&q1, InputTensor::Q}, {&k1, InputTensor::K}, {&v1, InputTensor::V}})
    t->fill(seed, which, {{0, p.q_len, 1}});
  std::vector<float> l1(size_t(p.batch * p.q_heads * p.q_len));
  auto one = make_local_transport();
  run_ring_attention(p, LocalTensors{q1.view, k1.view, v1.view, o1.view, l1.data()}, *backend, *one);
  const GlobalInputs g(p, seed);
  for (int U = 1; U <= P; ++U) {
    if (P % U != 0 || p.q_heads % U != 0 || p.kv_heads % U != 0) continue;
    SCOPED_TRACE(fmt::format("seed {} rank {} of {}, groups of {}", seed, r, P, U));
    // The layouts cover [0, len) once.
    std::vector<int> seen(size_t(p.q_len), 0);
    for (int w = 0; w < P; ++w) {
      const ShardLayout l = hybrid_layout(p, U, w, P);
      for (int64_t i = 0; i < l.tokens(); ++i) ++seen[size_t(l.global_position(i))];
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), p.q_len);
    const ShardLayout mine = hybrid_layout(p, U, r, P);
    const int64_t T = mine.tokens();
    ShardTensor q(p.dtype, p.batch, p.q_heads, T, p.head_dim), k(p.dtype, p.batch, p.kv_heads, T, p.head_dim),
        v(p.dtype, p.batch, p.kv_heads, T, p.head_dim), out(p.dtype, p.batch, p.q_heads, T, p.head_dim);
    q.fill(seed, InputTensor::Q, mine.segments);
    k.fill(seed, InputTensor::K, mine.segments);
    v.fill(seed, InputTensor::V, mine.segments);
    out.poison();
    std::vector<float> lse(std::max<size_t>(1, size_t(p.batch * p.q_heads * T)), NAN);
    Split s(U);
    RunOptions opt;
    opt.tile_q = opt.tile_k = 16;
    const RankStats st = run_hybrid_attention(p, LocalTensors{q.view, k.view, v.view, out.view, lse.data()},
                                              *backend, *s.group, *s.ring, opt);
    // The bytes it counts are the model's (plan prints it), inside the group and across.
    const HybridBytes want = hybrid_bytes(p, U, P, false)[size_t(r)];
    EXPECT_EQ(st.group_bytes_sent, want.group);
    EXPECT_EQ(st.bytes_sent, want.total());
    if (U > 1 && r % U == 0 && P > 1) EXPECT_GT(want.group, 0u);
    const test::RingErrors e = test::ring_errors_vs_oracle(p, g, mine, out, lse);
    EXPECT_LT(e.out, 2e-6);
    EXPECT_LT(e.lse, 2e-6);
    // Against the world of one: the same rows, within fp32 rounding of another order of blocks.
    double worst = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.q_heads; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const int64_t t = mine.global_position(i);
          for (int64_t d = 0; d < p.head_dim; ++d)
            worst = std::max(worst, double(std::abs(out.at(b, h, i, d) - o1.at(b, h, t, d))));
          worst = std::max(worst, double(std::abs(lse[size_t((b * p.q_heads + h) * T + i)] -
                                                  l1[size_t((b * p.q_heads + h) * p.q_len + t)])));
        }
    EXPECT_TRUE(test::all_ranks(worst < 1e-5)) << "worst difference from the world of one " << worst;
  }
}

// max |x - whole| over this rank's rows (whole at their global positions) / max |whole|, over all
// ranks; NaN (an unwritten element: the poison) counts as infinity.
double rows_error(const ShardTensor& x, const ShardTensor& whole, const ShardLayout& l) {
  double m[2] = {0, 0};
  for (int64_t b = 0; b < x.view.batch; ++b)
    for (int64_t h = 0; h < x.view.heads; ++h)
      for (int64_t i = 0; i < x.view.len; ++i)
        for (int64_t d = 0; d < x.view.dim; ++d) {
          const double w = whole.at(b, h, l.global_position(i), d), e = std::abs(x.at(b, h, i, d) - w);
          m[0] = std::isnan(e) ? INFINITY : std::max(m[0], e);
          m[1] = std::max(m[1], std::abs(w));
        }
  double g[2];
  MPI_Allreduce(m, g, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return g[0] / std::max(g[1], 1e-30);
}

TEST_P(Hybrid, TheBackwardOfEveryGroupSizeMatchesTheWorldOfOne) {
  const HybridCase& c = GetParam();
  const int P = test::world_size(), r = test::world_rank();
  const uint64_t seed = test::shared_seed();
  const GlobalProblem p = problem_of(c);
  auto backend = make_cpu_backend();
  RunOptions opt;
  opt.tile_q = opt.tile_k = 16;
  BwdShard whole(p, {{0, p.q_len, 1}}, p.q_len, seed);
  auto one = make_local_transport();
  run_ring_attention(p, whole.tensors(), *backend, *one, opt);
  run_attention_backward(p, whole.tensors(), whole.grads(), *backend, *one, *one, opt);
  for (int U = 1; U <= P; ++U) {
    if (P % U != 0 || p.q_heads % U != 0 || p.kv_heads % U != 0) continue;
    SCOPED_TRACE(fmt::format("seed {} rank {} of {}, groups of {}", seed, r, P, U));
    const ShardLayout mine = hybrid_layout(p, U, r, P);
    BwdShard x(p, mine.segments, mine.tokens(), seed);
    Split s(U);
    auto grad_ring = s.world->split(r % U, r / U);
    run_hybrid_attention(p, x.tensors(), *backend, *s.group, *s.ring, opt);
    const RankStats st =
        run_hybrid_attention_backward(p, x.tensors(), x.grads(), *backend, *s.group, *s.ring, *grad_ring, opt);
    const HybridBytes want = hybrid_bytes(p, U, P, true)[size_t(r)];
    EXPECT_EQ(st.group_bytes_sent, want.group);
    EXPECT_EQ(st.bytes_sent, want.total());
    // fp32 gradients summed in another order of blocks: a few roundings of the largest.
    EXPECT_LT(rows_error(x.dq, whole.dq, mine), 1e-5) << "dq";
    EXPECT_LT(rows_error(x.dk, whole.dk, mine), 1e-5) << "dk";
    EXPECT_LT(rows_error(x.dv, whole.dv, mine), 1e-5) << "dv";
  }
}

std::vector<HybridCase> cases() {
  return {
      {Sharding::Zigzag, true, 12, 6, 96, 16},
      {Sharding::Contiguous, false, 12, 12, 61, 8},
      {Sharding::Striped, true, 12, 6, 50, 8},
      {Sharding::Zigzag, true, 24, 12, 77, 8, {}, Window{9, 0}},
      {Sharding::DocZigzag, true, 12, 6, 90, 8, {30, 1, 59}},
      {Sharding::Contiguous, true, 12, 12, 5, 8},  // fewer tokens than ranks: some hold none
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, Hybrid, ::testing::ValuesIn(cases()));

TEST(HybridRefusals, HeadsThatDoNotDivideAndBadGroupSizesAreNamed) {
  const int P = test::world_size(), r = test::world_rank();
  GlobalProblem p = problem_of({Sharding::Zigzag, true, 12, 6, 64, 8});
  try {
    hybrid_layout(p, 5, 0, 6);
    ADD_FAILURE() << "a group of 5 in a world of 6 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "hybrid context parallelism: groups of 5 ranks do not divide a world of 6; the "
                                     "group size must be a divisor of the world");
  }
  if (P < 2) return;
  p.q_heads = p.kv_heads = 3;  // not a multiple of 2 ranks a group (P even)
  if (P % 2 != 0) return;
  Split s(2);
  auto backend = make_cpu_backend();
  const ShardLayout mine = hybrid_layout(p, 2, r, P);
  ShardTensor q(p.dtype, p.batch, 3, mine.tokens(), 8), k(p.dtype, p.batch, 3, mine.tokens(), 8),
      v(p.dtype, p.batch, 3, mine.tokens(), 8), out(p.dtype, p.batch, 3, mine.tokens(), 8);
  try {
    run_hybrid_attention(p, LocalTensors{q.view, k.view, v.view, out.view, nullptr}, *backend, *s.group, *s.ring);
    ADD_FAILURE() << "3 heads over groups of 2 were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "hybrid context parallelism over groups of 2 ranks: q_heads 3 and kv_heads 3 must "
                                     "both divide by 2 (each rank of a group attends q_heads / 2 and kv_heads / 2 of "
                                     "them)");
  }
  // A rank whose tensors do not fit its rows stops every rank, with one message.
  p.q_heads = p.kv_heads = 4;
  ShardTensor q4(p.dtype, p.batch, 4, mine.tokens() + (r == 0 ? 1 : 0), 8), k4(p.dtype, p.batch, 4, mine.tokens(), 8),
      v4(p.dtype, p.batch, 4, mine.tokens(), 8), o4(p.dtype, p.batch, 4, mine.tokens(), 8);
  const int64_t rank0 = hybrid_layout(p, 2, 0, P).tokens();
  std::string msg;
  try {
    run_hybrid_attention(p, LocalTensors{q4.view, k4.view, v4.view, o4.view, nullptr}, *backend, *s.group, *s.ring);
  } catch (const InvalidArgument& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg.rfind(fmt::format("ranks stopped before the first hop: rank 0: in group 0, rank 0: q is [2, 4, {}, 8] "
                                  "but this rank needs [2, 4, {}, 8] (batch, heads, tokens, head_dim)",
                                  rank0 + 1, rank0), 0),
            0u) << msg;
  EXPECT_TRUE(test::same_on_all_ranks(msg)) << msg;
  // The backward: the ring as its own dK/dV ring is refused on every rank, before any exchange.
  Split ring_only(1);
  BwdShard x(p, hybrid_layout(p, 1, r, P).segments, hybrid_layout(p, 1, r, P).tokens(), test::shared_seed());
  msg.clear();
  try {
    run_hybrid_attention_backward(p, x.tensors(), x.grads(), *backend, *ring_only.group, *ring_only.ring,
                                  *ring_only.ring);
  } catch (const InvalidArgument& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg.rfind(fmt::format("ranks stopped before the first hop: rank 0: in group 0, rank 0: the dK/dV ring is "
                                  "rank 0 of {} (the ring itself) but the ring rank 0 of {}: pass a second transport "
                                  "over the same ranks as the ring", P, P), 0),
            0u) << msg;
  EXPECT_TRUE(test::same_on_all_ranks(msg)) << msg;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
