// ranks: 1 2
// The ring and distributed decode with device buffers: the CUDA backend on ranks that share one
// GPU, the MPI transport staging every K/V block through host memory (it does not accept device
// pointers). Skipped where the build has no CUDA or no GPU is visible (CI).
#include <cstring>

#include "mpi_test_util.hpp"

namespace ringattn {
namespace {

using test::DeviceCopy;
using test::ErrorSums;
using test::GlobalInputs;
using test::ShardTensor;

// Every rank sees a GPU (the decision must be the same on all ranks: the tests are collective).
bool all_ranks_have_cuda() { return test::all_ranks(cuda_available()); }

struct DeviceCase {
  Sharding sharding;
  bool causal;
  DType dtype;
  int64_t dim;
};

class DeviceRing : public ::testing::TestWithParam<DeviceCase> {};

TEST_P(DeviceRing, StagedThroughHostMatchesOracle) {
  if (!all_ranks_have_cuda()) GTEST_SKIP() << "no CUDA device";
  const DeviceCase& c = GetParam();
  const int P = test::world_size(), r = test::world_rank();
  const uint64_t seed = test::shared_seed();
  GlobalProblem p;
  p.batch = 1, p.q_heads = 4, p.kv_heads = 2, p.head_dim = c.dim, p.dtype = c.dtype, p.causal = c.causal;
  p.sharding = c.sharding;
  p.q_len = p.kv_len = 64 * 2 * P + (P > 1 ? 3 : 0);  // uneven shards at P > 1
  SCOPED_TRACE(fmt::format("seed {} rank {} of {}", seed, r, P));
  const ShardLayout l = shard_layout(p.sharding, p.q_len, r, P);
  const int64_t T = l.tokens();
  ShardTensor q(p.dtype, 1, 4, T, c.dim), k(p.dtype, 1, 2, T, c.dim), v(p.dtype, 1, 2, T, c.dim), out(p.dtype, 1, 4, T, c.dim);
  q.fill(seed, InputTensor::Q, l.segments);
  k.fill(seed, InputTensor::K, l.segments);
  v.fill(seed, InputTensor::V, l.segments);
  out.poison();
  auto backend = make_cuda_backend(0);
  ASSERT_TRUE(backend->device_memory());
  auto transport = make_mpi_transport(MPI_COMM_WORLD);
  DeviceCopy dq(*backend, q), dk(*backend, k), dv(*backend, v), dout(*backend, out);
  DeviceBuffer dlse(*backend, size_t(4 * T) * sizeof(float));
  const RankStats st = run_ring_attention(p, LocalTensors{dq.view, dk.view, dv.view, dout.view, dlse.as<float>()},
                                          *backend, *transport);
  EXPECT_EQ(st.bytes_sent, ring_plan(p, P).ring_bytes(r));
  backend->copy_to_host(out.bytes.data(), dout.buf.get(), out.bytes.size());
  std::vector<float> lse(size_t(4 * T));
  backend->copy_to_host(lse.data(), dlse.get(), lse.size() * 4);

  const test::RingErrors e = test::ring_errors_vs_oracle(p, GlobalInputs(p, seed), l, out, lse);
  // Half-precision tensor-core products and a half-precision output: 1e-2 relative; fp32: 1e-5.
  const double tol = c.dtype == DType::F32 ? 1e-5 : 1e-2;
  EXPECT_LT(e.out, tol);
  EXPECT_LT(e.lse, c.dtype == DType::F32 ? 1e-5 : 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Cases, DeviceRing,
                         ::testing::Values(DeviceCase{Sharding::Zigzag, true, DType::F16, 64},
                                           DeviceCase{Sharding::Striped, true, DType::BF16, 128},
                                           DeviceCase{Sharding::Contiguous, false, DType::F16, 64},
                                           DeviceCase{Sharding::Zigzag, true, DType::F32, 32}));

TEST(DeviceDecode, StagedAllgatherMatchesOracle) {
  if (!all_ranks_have_cuda()) GTEST_SKIP() << "no CUDA device";
  const int P = test::world_size(), r = test::world_rank();
  const uint64_t seed = test::shared_seed();
  GlobalProblem p;
  p.batch = 2, p.q_heads = 8, p.kv_heads = 2, p.head_dim = 128, p.dtype = DType::BF16, p.q_len = 1, p.kv_len = 1000;
  p.causal = true;
  const Segment kv = kv_shard(p.kv_len, r, P);
  const GlobalInputs g(p, seed);
  ShardTensor k(p.dtype, 2, 2, kv.len, 128), v(p.dtype, 2, 2, kv.len, 128), out(p.dtype, 2, 8, 1, 128);
  k.fill(seed, InputTensor::K, {kv});
  v.fill(seed, InputTensor::V, {kv});
  out.poison();
  auto backend = make_cuda_backend(0);
  auto transport = make_mpi_transport(MPI_COMM_WORLD);
  DeviceCopy dq(*backend, g.q), dk(*backend, k), dv(*backend, v), dout(*backend, out);
  run_distributed_decode(p, LocalTensors{dq.view, dk.view, dv.view, dout.view, nullptr}, *backend, *transport);
  backend->copy_to_host(out.bytes.data(), dout.buf.get(), out.bytes.size());
  const FlashParams gf = g.params(p);
  ErrorSums eo;
  std::vector<double> ro(128);
  double rl = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 8; ++h) {
      cpu::naive_row(gf, b, h, 0, ro.data(), &rl);
      for (int64_t d = 0; d < 128; ++d) eo.add(out.at(b, h, 0, d), ro[size_t(d)]);
    }
  EXPECT_LT(eo.reduced_rel(), 1e-2);
  std::string bytes(reinterpret_cast<const char*>(out.bytes.data()), out.bytes.size());
  EXPECT_TRUE(test::same_on_all_ranks(bytes));
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
