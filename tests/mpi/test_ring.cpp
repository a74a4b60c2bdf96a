// ranks: 1 2 3 4
// Ring attention over real MPI ranks with the CPU backend: every sharding, causal and full, GQA
// and odd head counts, any length (uneven shards, ranks with no tokens), and layouts no sharding
// names (a ring plan made from them), checked against the fp64 oracle and a world-of-one run of
// the same inputs, bitwise determinism, and the exact bytes each rank must have sent.
#include <cstring>
#include <tuple>

#include "common/layouts.hpp"
#include "mpi_test_util.hpp"

namespace ringattn {
namespace {

using test::ErrorSums;
using test::GlobalInputs;
using test::ShardTensor;

struct RingCase {
  Sharding sharding;
  bool causal;
  int64_t batch, q_heads, kv_heads, units, dim;  // seq_len = units * 2P (zigzag) or units * P (others)
  DType dtype = DType::F32;
  bool bthd = false;
  MpiProgress progress = MpiProgress::Auto;
  int64_t len = 0;  // > 0: seq_len itself, any length (uneven shards, ranks with no tokens)
  std::vector<int64_t> docs = {};  // packed documents (their lengths sum to len)
  Window window = {};              // sliding window (left, right; -1 unbounded)
  // Layouts no sharding names, run with a RingPlan made from them (test::custom_layouts): 1 a
  // permuted union of contiguous shards, 2 striped groups.
  int custom = 0;
};

// The ranks' layouts of a case: the sharding's, or the custom ones, the same on every rank.
std::vector<ShardLayout> case_layouts(const RingCase& c, const GlobalProblem& p, int P, uint64_t seed) {
  const std::vector<int64_t> bounds = p.doc_bounds();
  if (c.custom == 0) return shard_layouts(p.sharding, p.q_len, P, documents_of(bounds));
  return test::custom_layouts(c.custom, p.q_len, P, seed);
}

void PrintTo(const RingCase& c, std::ostream* os) {
  *os << (c.custom ? test::custom_name(c.custom) : sharding_name(c.sharding)) << (c.causal ? " causal" : " full") << " B=" << c.batch << " Hq=" << c.q_heads
      << " Hkv=" << c.kv_heads << " D=" << c.dim << " " << dtype_name(c.dtype);
}

std::string case_name(const ::testing::TestParamInfo<RingCase>& i) {
  const RingCase& c = i.param;
  return fmt::format("{}_{}_b{}h{}kv{}d{}_{}{}{}{}_{}",
                     c.custom                          ? test::custom_name(c.custom)
                     : c.sharding == Sharding::DocZigzag ? "doczigzag"
                                                         : sharding_name(c.sharding),
                     c.causal ? "causal" : "full",
                     c.batch, c.q_heads, c.kv_heads, c.dim, dtype_name(c.dtype), c.bthd ? "_bthd" : "",
                     c.progress == MpiProgress::Nonblocking ? "_nonblocking" : "",
                     c.len > 0 ? fmt::format("_n{}", c.len) : "", i.index) +
         (c.docs.empty() ? "" : fmt::format("_docs{}", c.docs.size())) +
         (c.window.none() ? "" : fmt::format("_window{}_{}", c.window.left + 1, c.window.right + 1));
}

bool test_visible(const RingCase& c, int64_t q, int64_t k) {
  return test::visible_by_definition(c.causal, c.window, c.docs, q, k);
}

// One rank's tensors for a ring problem, inputs filled from the deterministic global inputs.
struct RingShard {
  ShardTensor q, k, v, out;
  std::vector<float> lse;
  RingShard(const GlobalProblem& p, const ShardLayout& l, uint64_t seed, bool bthd)
      : q(p.dtype, p.batch, p.q_heads, l.tokens(), p.head_dim, bthd),
        k(p.dtype, p.batch, p.kv_heads, l.tokens(), p.head_dim, bthd),
        v(p.dtype, p.batch, p.kv_heads, l.tokens(), p.head_dim, bthd),
        out(p.dtype, p.batch, p.q_heads, l.tokens(), p.head_dim, bthd) {
    q.fill(seed, InputTensor::Q, l.segments);
    k.fill(seed, InputTensor::K, l.segments);
    v.fill(seed, InputTensor::V, l.segments);
    poison();
  }
  void poison() {
    out.poison();
    lse.assign(size_t(out.view.batch * out.view.heads * out.view.len), std::numeric_limits<float>::quiet_NaN());
  }
  LocalTensors tensors() { return LocalTensors{q.view, k.view, v.view, out.view, lse.data()}; }
};

class RingAttention : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAttention, MatchesOracleAndWorldOfOneAndIsDeterministic) {
  const RingCase& c = GetParam();
  const int P = test::world_size(), r = test::world_rank();
  const uint64_t seed = test::shared_seed();
  GlobalProblem p;
  p.batch = c.batch;
  p.q_heads = c.q_heads;
  p.kv_heads = c.kv_heads;
  p.q_len = p.kv_len = c.len > 0 ? c.len : c.units * (c.sharding == Sharding::Zigzag ? 2 * P : P);
  p.head_dim = c.dim;
  p.dtype = c.dtype;
  p.causal = c.causal;
  p.sharding = c.sharding;
  p.doc_lens = c.docs;
  p.window = c.window;
  SCOPED_TRACE(fmt::format("seed {} rank {} of {} N {}", seed, r, P, p.q_len));

  // Doc-zigzag lays shards out by document; a custom case's layouts come from the shared seed.
  const std::vector<ShardLayout> layouts = case_layouts(c, p, P, seed);
  const ShardLayout& layout = layouts[size_t(r)];
  RingShard shard(p, layout, seed, c.bthd);
  auto backend = make_cpu_backend();
  auto transport = make_mpi_transport(MPI_COMM_WORLD, c.progress);
  RunOptions opt;
  opt.tile_q = opt.tile_k = 16;  // small tiles: several tiles per segment, so tile masks are exercised
  const uint64_t sent_before = transport->bytes_sent();
  // A sharding's run makes its own plan; a custom case's plan is made here, from its layouts.
  const RingPlan plan(p, layouts, r);
  const RankStats st = c.custom ? run_ring_attention(p, plan, shard.tensors(), *backend, *transport, opt)
                                : run_ring_attention(p, shard.tensors(), *backend, *transport, opt);

  // Bytes: hop s passes on the block of rank q = r - s when a later rank needs it (some query of
  // the rank holding it at a later hop sees one of its keys, by positions, documents and window),
  // with the rows of q's shard from the first to the last that any other rank sees; a ring that
  // silently did not exchange, padded uneven blocks or sent unneeded rows fails here.
  uint64_t want_bytes = 0;
  for (int s = 0; s + 1 < P; ++s) {
    const int q = (r - s + P) % P;
    const ShardLayout& kl = layouts[size_t(q)];
    bool needed = false;
    int64_t lo = kl.tokens(), hi = -1;  // rows of q's shard seen by any other rank
    for (int h = 1; h < P; ++h) {
      const ShardLayout& ql = layouts[size_t((q + h) % P)];
      for (int64_t i = 0; i < ql.tokens(); ++i)
        for (int64_t j = 0; j < kl.tokens(); ++j)
          if (test_visible(c, ql.global_position(i), kl.global_position(j))) {
            needed = needed || h > s;
            lo = std::min(lo, j);
            hi = std::max(hi, j);
          }
    }
    if (needed)
      want_bytes += uint64_t(hi - lo + 1) * 2 * uint64_t(p.batch * p.kv_heads * p.head_dim * dtype_size(p.dtype));
  }
  EXPECT_EQ(st.bytes_sent, want_bytes);
  EXPECT_EQ(plan.ring_bytes(r), want_bytes);
  EXPECT_EQ(transport->bytes_sent() - sent_before, plan.ring_bytes(r));
  // Hops: the ring stops after the last hop whose block some later rank needs (rank x holds the
  // block of x - s at hop s; the ranks x + 1 .. at hops s + 1 .. see it or not, by positions).
  int want_hops = 1;
  for (int x = 0; x < P; ++x)
    for (int s = 0; s + 1 < P; ++s) {
      const ShardLayout& kl = layouts[size_t(((x - s) % P + P) % P)];
      for (int h = 1; s + h < P && want_hops < s + 2; ++h) {
        const ShardLayout& ql = layouts[size_t((x + h) % P)];
        for (int64_t i = 0; i < ql.tokens() && want_hops < s + 2; ++i)
          for (int64_t j = 0; j < kl.tokens() && want_hops < s + 2; ++j)
            if (test_visible(c, ql.global_position(i), kl.global_position(j))) want_hops = s + 2;
      }
    }
  ASSERT_EQ(int(st.hops.size()), want_hops);
  uint64_t hop_bytes = 0;
  for (const HopStats& h : st.hops) hop_bytes += h.bytes_sent;
  EXPECT_EQ(hop_bytes, st.bytes_sent);
  // Full attention over one document needs every block everywhere: each rank sends P - 1 of them.
  if (P > 1 && p.q_len >= P && !c.causal && c.docs.empty()) EXPECT_GT(st.bytes_sent, 0u);

  // The oracle on the gathered inputs, row by row at this rank's global positions.
  const GlobalInputs g(p, seed);
  const FlashParams gf = g.params(p);
  const int64_t T = layout.tokens(), D = p.head_dim;
  ErrorSums eo, el;
  std::vector<double> ro(static_cast<size_t>(D));
  double rl = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t pos = layout.global_position(i);
        FlashParams f = gf;
        if (!c.docs.empty()) {  // the row's document [a, e), found by scanning: only its keys exist
          int64_t a = 0;
          for (int64_t n : c.docs) {
            if (pos < a + n) {
              f.k = gf.k.rows(a, n);
              f.v = gf.v.rows(a, n);
              f.mask = band_mask(c.causal, c.window, -a, 1);  // key j sits at position a + j
              break;
            }
            a += n;
          }
        }
        cpu::naive_row(f, b, h, pos, ro.data(), &rl);
        for (int64_t d = 0; d < D; ++d) eo.add(shard.out.at(b, h, i, d), ro[size_t(d)]);
        el.add(shard.lse[size_t((b * p.q_heads + h) * T + i)], rl);
      }
  // fp32 outputs to fp32 tolerance; fp16 outputs are one rounding of the fp32 state away.
  const double out_tol = c.dtype == DType::F32 ? 1e-5 : 1e-3;
  EXPECT_LT(eo.reduced_rel(), out_tol);
  EXPECT_LT(el.reduced_rel(), 1e-5);

  // A world of one over the whole sequence: same inputs, one block, one process.
  GlobalProblem p1 = p;
  auto local = make_local_transport();
  ShardTensor out1(p.dtype, p.batch, p.q_heads, p.q_len, D);
  out1.poison();
  std::vector<float> lse1(size_t(p.batch * p.q_heads * p.q_len), NAN);
  const RankStats st1 =
      run_ring_attention(p1, LocalTensors{g.q.view, g.k.view, g.v.view, out1.view, lse1.data()}, *backend, *local, opt);
  EXPECT_EQ(st1.bytes_sent, 0u);
  ErrorSums e1;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t d = 0; d < D; ++d) e1.add(shard.out.at(b, h, i, d), out1.at(b, h, layout.global_position(i), d));
  EXPECT_LT(e1.reduced_rel(), out_tol);

  // The same run again gives the same bytes.
  const std::vector<uint8_t> first_out = shard.out.bytes;
  const std::vector<float> first_lse = shard.lse;
  shard.poison();
  if (c.custom)
    run_ring_attention(p, plan, shard.tensors(), *backend, *transport, opt);
  else
    run_ring_attention(p, shard.tensors(), *backend, *transport, opt);
  EXPECT_TRUE(test::all_ranks(first_out == shard.out.bytes && first_lse.size() == shard.lse.size() &&
                              (first_lse.empty() ||
                               std::memcmp(first_lse.data(), shard.lse.data(), first_lse.size() * 4) == 0)));
}

std::vector<RingCase> ring_cases() {
  std::vector<RingCase> v;
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped})
    for (bool causal : {true, false}) v.push_back({sh, causal, 2, 3, 1, 10, 16});  // GQA 3:1, odd heads
  // Odd heads without grouping, [B,T,H,D] layout, the nonblocking MPI mode, fp16 inputs.
  v.push_back({Sharding::Zigzag, true, 1, 5, 5, 9, 24, DType::F32, true, MpiProgress::Nonblocking});
  v.push_back({Sharding::Striped, true, 1, 4, 2, 11, 8, DType::F32, false, MpiProgress::Nonblocking});
  v.push_back({Sharding::Contiguous, false, 1, 6, 3, 7, 32, DType::F32, true, MpiProgress::HelperThread});
  v.push_back({Sharding::Zigzag, true, 1, 2, 1, 8, 16, DType::F16});
  // Any length at every P: lengths below P (ranks with no tokens), odd, and one off a power of two.
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped})
    for (bool causal : {true, false})
      for (int64_t n : {1, 2, 3, 77, 1023, 1025}) {
        const bool bthd = n == 77;  // the [B,T,H,D] layout with uneven shards (one-token shards too)
        v.push_back({sh, causal, 1, 4, 2, 0, 8, DType::F32, bthd, MpiProgress::Auto, n});
      }
  v.push_back({Sharding::Zigzag, true, 1, 2, 1, 0, 16, DType::F16, true, MpiProgress::Nonblocking, 5});
  // Packed documents: of length 1, shorter than a shard, and spanning several ranks.
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped, Sharding::DocZigzag})
    for (bool causal : {true, false}) {
      v.push_back({sh, causal, 1, 4, 2, 0, 8, DType::F32, false, MpiProgress::Auto, 19, {1, 5, 1, 9, 3}});
      v.push_back({sh, causal, 2, 2, 1, 0, 16, DType::F32, sh == Sharding::Zigzag, MpiProgress::Auto, 78, {37, 1, 40}});
    }
  // Sliding windows: narrower than a shard (one hop for contiguous), wider than one, a right edge
  // without causal, over odd lengths and packed documents.
  for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag, Sharding::Striped, Sharding::DocZigzag})
    for (bool causal : {true, false}) {
      v.push_back({sh, causal, 1, 4, 2, 0, 8, DType::F32, false, MpiProgress::Auto, 77, {}, {5, causal ? 0 : 3}});
      v.push_back({sh, causal, 1, 2, 1, 0, 16, DType::F32, sh == Sharding::Striped, MpiProgress::Auto, 101, {}, {40, -1}});
      v.push_back({sh, causal, 1, 2, 2, 0, 8, DType::F32, false, MpiProgress::Auto, 19, {1, 5, 1, 9, 3}, {2, causal ? -1 : 1}});
    }
  // Layouts no sharding names: a permuted union of contiguous shards and striped groups, causal
  // and full, with documents and with a window.
  for (int custom : {1, 2})
    for (bool causal : {true, false}) {
      RingCase c{Sharding::Contiguous, causal, 1, 4, 2, 0, 8, DType::F32, custom == 2, MpiProgress::Auto, 77};
      c.custom = custom;
      v.push_back(c);
      c.len = 78, c.docs = {37, 1, 40}, c.bthd = false;
      v.push_back(c);
      c.len = 101, c.docs = {}, c.window = {9, causal ? 0 : 4};
      v.push_back(c);
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, RingAttention, ::testing::ValuesIn(ring_cases()), case_name);

// Ranks whose plans come from different layouts stop before the first hop, every rank with the
// same message naming the ring layouts (RingPlan::layouts_hash in the agreement).
TEST(RingAttentionLayouts, RanksWithOtherLayoutsDisagreeBeforeTheFirstHop) {
  const int P = test::world_size(), r = test::world_rank();
  if (P < 2) GTEST_SKIP() << "needs two ranks";
  GlobalProblem p;
  p.batch = 1, p.q_heads = 2, p.kv_heads = 1, p.head_dim = 8, p.q_len = p.kv_len = 40, p.causal = true;
  const uint64_t seed = test::shared_seed();
  std::mt19937_64 rng(seed);
  std::vector<ShardLayout> layouts = test::permuted_chunks(p.q_len, P, 2, rng);
  if (r == P - 1) std::rotate(layouts.begin(), layouts.begin() + 1, layouts.end());  // its own view of the ring
  RingShard shard(p, layouts[size_t(r)], seed, false);
  auto backend = make_cpu_backend();
  auto transport = make_mpi_transport(MPI_COMM_WORLD);
  const RingPlan plan(p, layouts, r);
  std::string m;
  try {
    run_ring_attention(p, plan, shard.tensors(), *backend, *transport);
  } catch (const InvalidArgument& e) {
    m = e.what();
  }
  EXPECT_NE(m.find(fmt::format("differ from rank 0): rank {}: ring layouts (hash) = ", P - 1)), std::string::npos) << m;
  EXPECT_EQ(transport->bytes_sent(), 0u);  // no exchange was posted
}

// Load balance of causal attention at P = 4. The assertion uses the schedule's count of visible
// query-key pairs each rank computes, a deterministic cost proxy: on a 2-core machine running 4
// oversubscribed ranks the measured compute times are noisy (they are reported beside it).
TEST(RingLoadBalance, ZigzagBalancesCausalWorkAtFourRanks) {
  const int P = test::world_size();
  if (P != 4) GTEST_SKIP() << "load balance is asserted at P = 4";
  const uint64_t seed = test::shared_seed();
  auto backend = make_cpu_backend();
  auto transport = make_mpi_transport(MPI_COMM_WORLD);
  double ratio_pairs[2] = {0, 0}, ratio_time[2] = {0, 0};
  const Sharding schemes[2] = {Sharding::Zigzag, Sharding::Contiguous};
  for (int s = 0; s < 2; ++s) {
    GlobalProblem p;
    p.batch = 1, p.q_heads = 2, p.kv_heads = 2, p.head_dim = 32, p.q_len = p.kv_len = 512, p.causal = true;
    p.sharding = schemes[s];
    const ShardLayout layout = shard_layout(p.sharding, p.q_len, test::world_rank(), P);
    RingShard shard(p, layout, seed, false);
    const RankStats st = run_ring_attention(p, shard.tensors(), *backend, *transport);
    double mine[2] = {double(st.visible_pairs), st.compute_s}, all[8];
    MPI_Allgather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, MPI_COMM_WORLD);
    double pmin = 1e300, pmax = 0, tmin = 1e300, tmax = 0;
    for (int q = 0; q < P; ++q) {
      pmin = std::min(pmin, all[2 * q]), pmax = std::max(pmax, all[2 * q]);
      tmin = std::min(tmin, all[2 * q + 1]), tmax = std::max(tmax, all[2 * q + 1]);
    }
    ratio_pairs[s] = pmax / pmin;
    ratio_time[s] = tmax / tmin;
  }
  if (test::world_rank() == 0)
    std::printf("causal N=512 P=4 slowest/fastest rank: zigzag pairs %.3f time %.3f | contiguous pairs %.3f time %.3f\n",
                ratio_pairs[0], ratio_time[0], ratio_pairs[1], ratio_time[1]);
  ::testing::Test::RecordProperty("zigzag_time_ratio", fmt::format("{:.3f}", ratio_time[0]));
  ::testing::Test::RecordProperty("contiguous_time_ratio", fmt::format("{:.3f}", ratio_time[1]));
  EXPECT_LE(ratio_pairs[0], 1.15);
  EXPECT_GT(ratio_pairs[1], 1.15);  // the proxy does tell an unbalanced scheme apart (7 at P = 4)
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
