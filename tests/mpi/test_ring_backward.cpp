// ranks: 1 2 3 4
// The ring backward over real MPI ranks with the CPU backend: every sharding, causal and full, GQA
// and odd head counts, odd lengths (uneven shards, ranks with no tokens), packed documents and
// sliding windows, and layouts no sharding names (a ring plan made from them); the gradients against the fp64 oracle (naive_backward per document), their
// error against a world of one's (it must not grow with P), and the exact bytes both rings send.
#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "common/layouts.hpp"
#include "mpi_test_util.hpp"

namespace ringattn {
namespace {

using test::GlobalInputs;
using test::BwdShard;
using test::ShardTensor;

struct BwdCase {
  Sharding sharding;
  bool causal;
  int64_t batch, q_heads, kv_heads, len, dim;
  DType dtype = DType::F32;
  std::vector<int64_t> docs = {};
  Window window = {};
  int custom = 0;  // layouts no sharding names, run with a RingPlan made from them (test::custom_layouts)
};

std::string case_name(const ::testing::TestParamInfo<BwdCase>& i) {
  const BwdCase& c = i.param;
  const char* shard = c.custom                          ? test::custom_name(c.custom)
                      : c.sharding == Sharding::DocZigzag ? "doczigzag"  // no '-'
                                                          : sharding_name(c.sharding);
  return fmt::format("{}_{}_b{}h{}kv{}d{}_n{}_{}", shard, c.causal ? "causal" : "full", c.batch,
                     c.q_heads, c.kv_heads, c.dim, c.len, dtype_name(c.dtype)) +
         (c.docs.empty() ? "" : fmt::format("_docs{}", c.docs.size())) +
         (c.window.none() ? "" : fmt::format("_window{}_{}", c.window.left + 1, c.window.right + 1)) +
         fmt::format("_{}", i.index);
}

bool test_visible(const BwdCase& c, int64_t q, int64_t k) {
  return test::visible_by_definition(c.causal, c.window, c.docs, q, k);
}

GlobalProblem problem_of(const BwdCase& c) {
  GlobalProblem p;
  p.batch = c.batch;
  p.q_heads = c.q_heads;
  p.kv_heads = c.kv_heads;
  p.q_len = p.kv_len = c.len;
  p.head_dim = c.dim;
  p.dtype = c.dtype;
  p.causal = c.causal;
  p.sharding = c.sharding;
  p.doc_lens = c.docs;
  p.window = c.window;
  return p;
}

// The layout of `rank` (doc-zigzag lays shards out by document).
ShardLayout rank_layout(const GlobalProblem& p, int rank, int P) {
  const std::vector<int64_t> bounds = p.doc_bounds();
  return shard_layout(p.sharding, p.q_len, rank, P, documents_of(bounds));
}

// Every rank's layout of a case: the sharding's, or the custom ones (the same on every rank).
std::vector<ShardLayout> case_layouts(const BwdCase& c, const GlobalProblem& p, int P, uint64_t seed) {
  if (c.custom) return test::custom_layouts(c.custom, p.q_len, P, seed);
  std::vector<ShardLayout> all;
  for (int r = 0; r < P; ++r) all.push_back(rank_layout(p, r, P));
  return all;
}

// The fp64 gradients of the whole problem: naive_backward per document (one without documents).
cpu::GradReference reference_grads(const BwdCase& c, const GlobalProblem& p, const GlobalInputs& g,
                                   const ShardTensor& dout) {
  const int64_t N = p.q_len, D = p.head_dim;
  cpu::GradReference all;
  all.dq.assign(size_t(p.batch * p.q_heads * N * D), 0.0);
  all.dk.assign(size_t(p.batch * p.kv_heads * N * D), 0.0);
  all.dv = all.dk;
  const std::vector<int64_t> docs = c.docs.empty() ? std::vector<int64_t>{N} : c.docs;
  int64_t a = 0;
  for (int64_t n : docs) {
    BackwardParams bp;
    bp.q = g.q.view.rows(a, n);
    bp.k = g.k.view.rows(a, n);
    bp.v = g.v.view.rows(a, n);
    bp.dout = dout.view.rows(a, n);
    bp.scale = p.resolved_scale();
    bp.mask = band_mask(c.causal, c.window, 0, 1);
    const cpu::GradReference r = cpu::naive_backward(bp);
    auto put = [&](std::vector<double>& dst, const std::vector<double>& src, int64_t H) {
      for (int64_t bh = 0; bh < p.batch * H; ++bh)
        std::copy_n(src.begin() + bh * n * D, n * D, dst.begin() + (bh * N + a) * D);
    };
    put(all.dq, r.dq, p.q_heads);
    put(all.dk, r.dk, p.kv_heads);
    put(all.dv, r.dv, p.kv_heads);
    a += n;
  }
  return all;
}

// max |g - ref| / max |ref| of one gradient over all ranks (NaN: infinity).
double grad_error(const ShardTensor& grad, const std::vector<double>& ref, const ShardLayout& l, int64_t N,
                  bool whole) {
  const TensorView& x = grad.view;
  double m[2] = {0, 0};
  for (int64_t b = 0; b < x.batch; ++b)
    for (int64_t h = 0; h < x.heads; ++h)
      for (int64_t i = 0; i < x.len; ++i)
        for (int64_t d = 0; d < x.dim; ++d) {
          const int64_t pos = whole ? i : l.global_position(i);
          const double r = ref[size_t(((b * x.heads + h) * N + pos) * x.dim + d)], e = std::abs(grad.at(b, h, i, d) - r);
          m[0] = std::isnan(e) ? INFINITY : std::max(m[0], e);
          m[1] = std::max(m[1], std::abs(r));
        }
  double g[2];
  MPI_Allreduce(m, g, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return g[1] > 0 ? g[0] / g[1] : g[0];
}

// The bytes rank r must send, by brute force over positions: the K/V ring as the forward's test
// counts it, plus per dK/dV exchange s = 2..P the accumulator of block q = r - s + 1 when a rank
// q + h (1 <= h <= s - 1) computed on it: fp32 dK and dV of the rows of q other ranks see.
uint64_t brute_force_bytes(const BwdCase& c, const GlobalProblem& p, const std::vector<ShardLayout>& layouts, int r) {
  const int P = int(layouts.size());
  uint64_t bytes = 0;
  const uint64_t kv_token = 2 * uint64_t(p.batch * p.kv_heads * p.head_dim * dtype_size(p.dtype));
  const uint64_t grad_token = 2 * uint64_t(p.batch * p.kv_heads * p.head_dim) * 4;
  for (int q = 0; q < P; ++q) {
    const ShardLayout& kl = layouts[size_t(q)];
    int64_t lo = kl.tokens(), hi = -1;
    int first = P;  // the first hop h >= 1 whose holder q + h sees a key of q
    for (int h = 1; h < P; ++h) {
      const ShardLayout& ql = layouts[size_t((q + h) % P)];
      for (int64_t i = 0; i < ql.tokens(); ++i)
        for (int64_t j = 0; j < kl.tokens(); ++j)
          if (test_visible(c, ql.global_position(i), kl.global_position(j))) {
            first = std::min(first, h);
            lo = std::min(lo, j), hi = std::max(hi, j);
          }
    }
    const uint64_t rows = uint64_t(hi - lo + 1);
    const int s_kv = ((r - q) % P + P) % P;  // the hop at which r holds q's block
    if (s_kv + 1 < P && first < P) {          // the K/V exchange s_kv passes it on if a later hop needs it
      bool later = false;
      for (int h = s_kv + 1; h < P && !later; ++h) {
        const ShardLayout& ql = layouts[size_t((q + h) % P)];
        for (int64_t i = 0; i < ql.tokens() && !later; ++i)
          for (int64_t j = 0; j < kl.tokens() && !later; ++j)
            later = test_visible(c, ql.global_position(i), kl.global_position(j));
      }
      if (later) bytes += rows * kv_token;
    }
    const int s_grad = s_kv + 1;  // r sends q's accumulator in exchange s_kv + 1 (home at exchange P)
    if (s_grad >= 2 && first <= s_grad - 1) bytes += rows * grad_token;
  }
  return bytes;
}

class RingBackward : public ::testing::TestWithParam<BwdCase> {};

TEST_P(RingBackward, MatchesOracleAndWorldOfOneWithExactBytes) {
  const BwdCase& c = GetParam();
  const int P = test::world_size(), r = test::world_rank();
  const uint64_t seed = test::shared_seed();
  const GlobalProblem p = problem_of(c);
  SCOPED_TRACE(fmt::format("seed {} rank {} of {} N {}", seed, r, P, p.q_len));
  const std::vector<ShardLayout> layouts = case_layouts(c, p, P, seed);
  const ShardLayout& layout = layouts[size_t(r)];
  BwdShard shard(p, layout.segments, layout.tokens(), seed);
  auto backend = make_cpu_backend();
  auto t = make_mpi_transport(MPI_COMM_WORLD), grad_t = make_mpi_transport(MPI_COMM_WORLD);
  RunOptions opt;
  opt.tile_q = opt.tile_k = 16;
  // A sharding's runs make their own plans; a custom case's one plan serves both runs.
  const RingPlan plan(p, layouts, r);
  if (c.custom)
    run_ring_attention(p, plan, shard.tensors(), *backend, *t, opt);
  else
    run_ring_attention(p, shard.tensors(), *backend, *t, opt);
  const uint64_t before = t->bytes_sent() + grad_t->bytes_sent();
  const RankStats st =
      c.custom ? run_attention_backward(p, plan, shard.tensors(), shard.grads(), *backend, *t, *grad_t, opt)
               : run_attention_backward(p, shard.tensors(), shard.grads(), *backend, *t, *grad_t, opt);

  // Bytes: both rings, exact.
  const uint64_t want = brute_force_bytes(c, p, layouts, r);
  EXPECT_EQ(st.bytes_sent, want);
  EXPECT_EQ(t->bytes_sent() + grad_t->bytes_sent() - before, want);
  EXPECT_EQ(plan.backward_bytes(r), want);
  uint64_t hop_bytes = 0;
  for (const HopStats& h : st.hops) hop_bytes += h.bytes_sent;
  EXPECT_EQ(hop_bytes, st.bytes_sent);

  // The gradients against the fp64 oracle, every element (the poison catches unwritten ones).
  const GlobalInputs g(p, seed);
  ShardTensor gdout(p.dtype, p.batch, p.q_heads, p.q_len, p.head_dim);
  gdout.fill(seed, InputTensor::DO, {{0, p.q_len, 1}});
  const cpu::GradReference ref = reference_grads(c, p, g, gdout);
  const double tol = dtype_info(p.dtype).grad_tolerance;  // the CLI check's bound (core/dtype.hpp)
  const double e[3] = {grad_error(shard.dq, ref.dq, layout, p.q_len, false),
                       grad_error(shard.dk, ref.dk, layout, p.q_len, false),
                       grad_error(shard.dv, ref.dv, layout, p.q_len, false)};
  EXPECT_LE(e[0], tol) << "dq";
  EXPECT_LE(e[1], tol) << "dk";
  EXPECT_LE(e[2], tol) << "dv";

  // A world of one over the whole sequence: the same run with one block; the ring's error must
  // not grow with P (at most 2x, with a floor of fp32's rounding of the largest gradient: the
  // gradients accumulate in fp32 whatever the inputs' dtype, and a 16-bit case whose errors are
  // both at that level, 3.2e-7 against 1.6e-7, failed the bare 2x on one seed).
  auto local = make_local_transport();
  BwdShard whole(p, {{0, p.q_len, 1}}, p.q_len, seed);
  run_ring_attention(p, whole.tensors(), *backend, *local, opt);
  const RankStats st1 = run_attention_backward(p, whole.tensors(), whole.grads(), *backend, *local, *local, opt);
  EXPECT_EQ(st1.bytes_sent, 0u);
  const double e1[3] = {grad_error(whole.dq, ref.dq, layout, p.q_len, true),
                        grad_error(whole.dk, ref.dk, layout, p.q_len, true),
                        grad_error(whole.dv, ref.dv, layout, p.q_len, true)};
  const double floor = 1e-6;
  for (int i = 0; i < 3; ++i) EXPECT_LE(e[i], 2 * std::max(e1[i], floor)) << "gradient " << i << " at P=" << P;
}

std::vector<BwdCase> backward_cases() {
  std::vector<BwdCase> v;
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped, Sharding::DocZigzag})
    for (bool causal : {true, false}) {
      v.push_back({sh, causal, 2, 3, 1, 40, 16});                   // GQA 3:1, odd heads
      for (int64_t n : {1, 3, 77}) v.push_back({sh, causal, 1, 4, 2, n, 8});  // odd lengths, empty shards
      v.push_back({sh, causal, 1, 4, 2, 19, 8, DType::F32, {1, 5, 1, 9, 3}});  // packed documents
      v.push_back({sh, causal, 1, 2, 1, 78, 16, DType::F32, {37, 1, 40}});
      v.push_back({sh, causal, 1, 4, 2, 77, 8, DType::F32, {}, {5, causal ? 0 : 3}});  // windows
      v.push_back({sh, causal, 1, 2, 1, 101, 16, DType::F32, {}, {40, -1}});
      v.push_back({sh, causal, 1, 2, 2, 19, 8, DType::F32, {1, 5, 1, 9, 3}, {2, causal ? -1 : 1}});
    }
  v.push_back({Sharding::Zigzag, true, 1, 5, 5, 33, 24, DType::F16});
  v.push_back({Sharding::Striped, true, 1, 4, 2, 29, 16, DType::BF16});
  for (int custom : {1, 2})  // layouts no sharding names: causal and full, documents, a window
    for (bool causal : {true, false}) {
      v.push_back({Sharding::Contiguous, causal, 1, 4, 2, 77, 8, DType::F32, {}, {}, custom});
      v.push_back({Sharding::Contiguous, causal, 1, 2, 1, 78, 16, DType::F32, {37, 1, 40}, {}, custom});
      v.push_back({Sharding::Contiguous, causal, 1, 4, 2, 77, 8, DType::F32, {}, {9, causal ? 0 : 4}, custom});
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, RingBackward, ::testing::ValuesIn(backward_cases()), case_name);

// A rank running the forward and ranks running the backward disagree before the first hop, by
// name, with the same message on every rank.
TEST(RingBackwardAgreement, ForwardAndBackwardRanksDisagree) {
  const int P = test::world_size(), r = test::world_rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  const BwdCase c{Sharding::Zigzag, true, 1, 2, 1, 24, 8};
  const GlobalProblem p = problem_of(c);
  const ShardLayout layout = rank_layout(p, r, P);
  BwdShard shard(p, layout.segments, layout.tokens(), test::shared_seed());
  auto backend = make_cpu_backend();
  auto t = make_mpi_transport(MPI_COMM_WORLD), grad_t = make_mpi_transport(MPI_COMM_WORLD);
  std::string msg;
  try {
    if (r == P - 1)
      run_ring_attention(p, shard.tensors(), *backend, *t);
    else
      run_attention_backward(p, shard.tensors(), shard.grads(), *backend, *t, *grad_t);
  } catch (const InvalidArgument& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(fmt::format("rank {}: operation (1 ring, 2 decode, 3 ring backward) = 1", P - 1)),
            std::string::npos) << msg;
  EXPECT_TRUE(test::same_on_all_ranks(msg));
}

// The dK/dV ring needs a transport of its own: passing the K/V ring's is refused on every rank.
TEST(RingBackwardAgreement, SharedTransportIsRefused) {
  const int P = test::world_size(), r = test::world_rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  const GlobalProblem p = problem_of({Sharding::Contiguous, false, 1, 2, 2, 16, 8});
  const ShardLayout layout = rank_layout(p, r, P);
  BwdShard shard(p, layout.segments, layout.tokens(), test::shared_seed());
  auto backend = make_cpu_backend();
  auto t = make_mpi_transport(MPI_COMM_WORLD);
  std::string msg;
  try {
    run_attention_backward(p, shard.tensors(), shard.grads(), *backend, *t, *t);
  } catch (const InvalidArgument& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("the dK/dV ring needs a transport of its own"), std::string::npos) << msg;
  EXPECT_TRUE(test::same_on_all_ranks(msg));
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
