// ranks: 1 2 3 4
// Distributed decode over a KV-sharded cache: queries replicated, K/V split contiguously, partial
// states merged in rank order. Checked against the fp64 oracle and single-device decode, and
// bitwise identical on every rank and across runs.
#include <cstring>

#include "mpi_test_util.hpp"

namespace ringattn {
namespace {

using test::ErrorSums;
using test::GlobalInputs;
using test::ShardTensor;

struct DecodeCase {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, dim;
  bool causal;
  std::optional<int64_t> q_offset;
  Window window = {};
};

void PrintTo(const DecodeCase& c, std::ostream* os) {
  *os << "B=" << c.batch << " Hq=" << c.q_heads << " Hkv=" << c.kv_heads << " q_len=" << c.q_len
      << " kv_len=" << c.kv_len << " D=" << c.dim << (c.causal ? " causal" : " full");
}

class DistributedDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DistributedDecode, EqualsSingleDeviceDecode) {
  const DecodeCase& c = GetParam();
  const int P = test::world_size(), r = test::world_rank();
  const uint64_t seed = test::shared_seed();
  GlobalProblem p;
  p.batch = c.batch, p.q_heads = c.q_heads, p.kv_heads = c.kv_heads, p.q_len = c.q_len, p.kv_len = c.kv_len;
  p.head_dim = c.dim, p.causal = c.causal, p.q_offset = c.q_offset, p.window = c.window;
  SCOPED_TRACE(fmt::format("seed {} rank {} of {}", seed, r, P));

  const GlobalInputs g(p, seed);  // queries are replicated: every rank holds all of them
  const Segment kv = kv_shard(p.kv_len, r, P);
  ShardTensor k(p.dtype, p.batch, p.kv_heads, kv.len, p.head_dim), v(p.dtype, p.batch, p.kv_heads, kv.len, p.head_dim);
  k.fill(seed, InputTensor::K, {kv});
  v.fill(seed, InputTensor::V, {kv});
  ShardTensor out(p.dtype, p.batch, p.q_heads, p.q_len, p.head_dim);
  const size_t rows = size_t(p.batch * p.q_heads * p.q_len);
  std::vector<float> lse(rows, NAN);
  out.poison();

  auto backend = make_cpu_backend();
  auto transport = make_mpi_transport(MPI_COMM_WORLD);
  RunOptions opt;
  opt.decode_splits = 3;
  opt.tile_k = 16;
  TensorView kview = k.view, vview = v.view;
  if (kv.len == 0) kview.data = vview.data = nullptr;  // a rank without keys may pass no K/V
  // Called directly (not run_attention): decode splits KV of any length, self-attention included.
  const RankStats st = run_distributed_decode(p, LocalTensors{g.q.view, kview, vview, out.view, lse.data()}, *backend,
                                              *transport, opt);
  EXPECT_TRUE(st.hops.empty());
  // A rank computes only when some query sees one of its keys (positions: query i at
  // q_offset + i, key j at j; causal and the window decide); otherwise it contributes the empty
  // state without a kernel call.
  bool any_visible = false;
  const int64_t off = p.resolved_q_offset();
  for (int64_t i = 0; i < p.q_len; ++i)
    for (int64_t j = kv.start; j < kv.start + kv.len; ++j) {
      const int64_t pq = off + i, right = c.causal ? 0 : c.window.right;
      any_visible = any_visible || ((right < 0 || j <= pq + right) && (c.window.left < 0 || j >= pq - c.window.left));
    }
  EXPECT_EQ(st.kernel_calls, any_visible ? 1 : 0);

  // The oracle.
  const FlashParams gf = g.params(p);
  ErrorSums eo, el;
  std::vector<double> ro(static_cast<size_t>(p.head_dim));
  double rl = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i) {
        cpu::naive_row(gf, b, h, i, ro.data(), &rl);
        for (int64_t d = 0; d < p.head_dim; ++d) eo.add(out.at(b, h, i, d), ro[size_t(d)]);
        el.add(lse[size_t((b * p.q_heads + h) * p.q_len + i)], rl);
      }
  EXPECT_LT(eo.reduced_rel(), 1e-5);
  EXPECT_LT(el.reduced_rel(), 1e-5);

  // Single-device split-KV decode over the whole cache.
  std::vector<float> o1(rows * size_t(p.head_dim), NAN), l1(rows, NAN);
  DecodeParams d;
  d.flash = gf;
  d.flash.state = contiguous_state(o1.data(), l1.data(), p.batch, p.q_heads, p.q_len, p.head_dim);
  d.flash.tile_k = 16;
  d.splits = 3;
  backend->decode(d);
  ErrorSums e1;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i)
        for (int64_t dd = 0; dd < p.head_dim; ++dd)
          e1.add(out.at(b, h, i, dd), o1[size_t(((b * p.q_heads + h) * p.q_len + i) * p.head_dim + dd)]);
  EXPECT_LT(e1.reduced_rel(), 1e-5);

  // Bitwise the same result on every rank, and on a second run.
  std::string bytes(reinterpret_cast<const char*>(out.bytes.data()), out.bytes.size());
  bytes.append(reinterpret_cast<const char*>(lse.data()), lse.size() * 4);
  EXPECT_TRUE(test::same_on_all_ranks(bytes));
  out.poison();
  std::fill(lse.begin(), lse.end(), NAN);
  run_distributed_decode(p, LocalTensors{g.q.view, kview, vview, out.view, lse.data()}, *backend, *transport, opt);
  std::string again(reinterpret_cast<const char*>(out.bytes.data()), out.bytes.size());
  again.append(reinterpret_cast<const char*>(lse.data()), lse.size() * 4);
  EXPECT_TRUE(test::all_ranks(again == bytes));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DistributedDecode,
    ::testing::Values(DecodeCase{2, 4, 2, 1, 37, 16, true},    // decode, GQA, uneven shards
                      DecodeCase{1, 3, 1, 1, 64, 32, false},   // decode, MQA, odd heads
                      DecodeCase{1, 4, 4, 5, 61, 16, true},    // chunked prefill against a cache
                      DecodeCase{1, 2, 1, 3, 3, 8, false},     // fewer keys than ranks at P = 4
                      DecodeCase{1, 2, 2, 1, 64, 16, true, 20}, // query at 20: later shards see nothing
                      // Windows: the last query's window covers only the last shard(s); a window
                      // with a right edge past some queries (not causal).
                      DecodeCase{1, 4, 2, 1, 64, 16, true, std::nullopt, {10, 0}},
                      DecodeCase{2, 4, 2, 5, 61, 16, true, std::nullopt, {3, -1}},
                      DecodeCase{1, 2, 2, 3, 61, 16, false, 20, {5, 7}},
                      DecodeCase{1, 2, 1, 2, 50, 8, false, 30, {-1, 2}}));

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
