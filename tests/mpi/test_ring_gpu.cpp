// ranks: 1 2 4
// The GPU ring (issue 5): the CUDA backend with the NCCL transport where every rank has a GPU of
// its own (P = 1 on a one-GPU host) and the MPI transport always (it takes no device pointers: K/V
// staged through host memory, also for ranks sharing one GPU). The gathered output matches the
// fp64 oracle within the dtype's tolerance, and its error does not grow with P beyond 2x the error
// of the same problem in a world of one (the state stays fp32 across hops). Skipped where there
// is no GPU (CI).
#include <cstring>
#include <memory>

#include "mpi_test_util.hpp"
#include "core/error.hpp"
#ifdef RINGATTN_HAVE_NCCL
#include <cuda_runtime.h>

#include "comm/nccl_mpi.hpp"
#endif

namespace ringattn {
namespace {

using test::DeviceCopy;
using test::ErrorSums;
using test::GlobalInputs;
using test::ShardTensor;

bool all_ranks_have_cuda() { return test::all_ranks(cuda_available()); }

// The transports this world can run: MPI always; NCCL when every rank has its own GPU; in a world
// of one also NCCL made over a local host transport (no MPI under it: the C ABI's way).
std::vector<std::string> transports() {
  std::vector<std::string> t = {"mpi"};
#ifdef RINGATTN_HAVE_NCCL
  if (every_rank_has_own_gpu(MPI_COMM_WORLD)) t.push_back("nccl");
  int P = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  if (P == 1 && cuda_available()) t.push_back("nccl-over-local");
#endif
  return t;
}

// A backend and a transport that agree on the GPU: NCCL picks this rank's GPU from its local rank
// (select_local_gpu) and the backend is made on that GPU; ranks sharing the MPI transport use GPU 0.
struct BackendAndTransport {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transport> transport;
};
BackendAndTransport make_pair_for(const std::string& name, MPI_Comm comm) {
  BackendAndTransport bt;
#ifdef RINGATTN_HAVE_NCCL
  if (name == "nccl") {
    bt.backend = make_cuda_backend(select_local_gpu(comm));
    bt.transport = make_nccl_transport(comm);
    return bt;
  }
  if (name == "nccl-over-local") {
    bt.backend = make_cuda_backend(0);
    bt.transport = make_nccl_transport(make_local_transport());
    return bt;
  }
#endif
  bt.backend = make_cuda_backend(0);
  bt.transport = make_mpi_transport(comm);
  return bt;
}

// Runs the ring for `p` over `comm` on GPU 0 and returns the relative error of the output (and
// of the LSE) against the oracle, reduced over the ranks of MPI_COMM_WORLD.
struct RingErrors : test::RingErrors {
  RankStats stats;
};
RingErrors ring_errors(const GlobalProblem& p, const GlobalInputs& g, uint64_t seed, const std::string& transport,
                       MPI_Comm comm) {
  int r = 0, P = 1;
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(comm, &P);
  const ShardLayout l = shard_layout(p.sharding, p.q_len, r, P);
  const int64_t T = l.tokens(), H = p.q_heads, HK = p.kv_heads, D = p.head_dim;
  ShardTensor q(p.dtype, p.batch, H, T, D), k(p.dtype, p.batch, HK, T, D), v(p.dtype, p.batch, HK, T, D),
      out(p.dtype, p.batch, H, T, D);
  q.fill(seed, InputTensor::Q, l.segments);
  k.fill(seed, InputTensor::K, l.segments);
  v.fill(seed, InputTensor::V, l.segments);
  out.poison();
  BackendAndTransport bt = make_pair_for(transport, comm);
  Backend* backend = bt.backend.get();
  Transport* t = bt.transport.get();
  DeviceCopy dq(*backend, q), dk(*backend, k), dv(*backend, v), dout(*backend, out);
  DeviceBuffer dlse(*backend, size_t(p.batch * H * T) * sizeof(float));
  std::vector<float> lse(size_t(p.batch * H * T), NAN);
  backend->copy_from_host(dlse.get(), lse.data(), lse.size() * 4);
  RingErrors e{};
  e.stats = run_ring_attention(p, LocalTensors{dq.view, dk.view, dv.view, dout.view, dlse.as<float>()}, *backend, *t);
  backend->copy_to_host(out.bytes.data(), dout.buf.get(), out.bytes.size());
  backend->copy_to_host(lse.data(), dlse.get(), lse.size() * 4);
  static_cast<test::RingErrors&>(e) = test::ring_errors_vs_oracle(p, g, l, out, lse);
  return e;
}

struct GpuCase {
  Sharding sharding;
  bool causal;
  DType dtype;
  int64_t dim;
};

class GpuRing : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GpuRing, MatchesOracleAndErrorDoesNotGrowWithRanks) {
  if (!all_ranks_have_cuda()) GTEST_SKIP() << "no CUDA device: GPU ring test skipped";
  const GpuCase& c = GetParam();
  const int P = test::world_size(), r = test::world_rank();
  const uint64_t seed = test::shared_seed();
  GlobalProblem p;
  p.batch = 1, p.q_heads = 8, p.kv_heads = 2, p.head_dim = c.dim, p.dtype = c.dtype, p.causal = c.causal;
  p.sharding = c.sharding;
  p.q_len = p.kv_len = 96 * 8 + 5;  // the same problem at P = 1, 2, 4: uneven shards
  const GlobalInputs g(p, seed);
  // The reference error: the same problem in a world of one (every rank alone, then reduced).
  MPI_Comm self;
  MPI_Comm_split(MPI_COMM_WORLD, r, 0, &self);
  double err1 = 0;
  {
    // Rank-local run through the MPI transport over a communicator of one.
    const RingErrors e1 = ring_errors(p, g, seed, "mpi", self);
    err1 = e1.out;
  }
  MPI_Comm_free(&self);
  for (const std::string& tr : transports()) {
    SCOPED_TRACE(fmt::format("seed {} rank {} of {} transport {}", seed, r, P, tr));
    const RingErrors e = ring_errors(p, g, seed, tr, MPI_COMM_WORLD);
    const double tol = c.dtype == DType::F32 ? 1e-5 : 1e-2;
    EXPECT_LT(e.out, tol);
    EXPECT_LT(e.lse, c.dtype == DType::F32 ? 1e-5 : 1e-3);
    // fp32 state across hops: more ranks may not make the answer worse than 2x (plus fp32 noise).
    EXPECT_LE(e.out, 2 * err1 + 1e-6) << "P=" << P << " error " << e.out << " vs world of one " << err1;
    EXPECT_EQ(e.stats.bytes_sent, ring_plan(p, P).ring_bytes(r));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuRing,
                         ::testing::Values(GpuCase{Sharding::Zigzag, true, DType::BF16, 128},
                                           GpuCase{Sharding::Contiguous, true, DType::BF16, 128},
                                           GpuCase{Sharding::Striped, true, DType::F16, 64},
                                           GpuCase{Sharding::Zigzag, false, DType::BF16, 64},
                                           GpuCase{Sharding::Contiguous, false, DType::F32, 64},
                                           GpuCase{Sharding::Contiguous, false, DType::F16, 64},
                                           GpuCase{Sharding::Zigzag, true, DType::F32, 32}));

// Distributed decode on the GPU over every transport this world can run: one query (decode) and
// three (chunked prefill: the last three positions).
class GpuDecode : public ::testing::TestWithParam<int64_t> {};

TEST_P(GpuDecode, MatchesOracleOverEveryTransport) {
  if (!all_ranks_have_cuda()) GTEST_SKIP() << "no CUDA device: GPU decode test skipped";
  const int P = test::world_size(), r = test::world_rank();
  const uint64_t seed = test::shared_seed();
  GlobalProblem p;
  p.batch = 2, p.q_heads = 16, p.kv_heads = 4, p.head_dim = 128, p.dtype = DType::BF16, p.q_len = GetParam();
  p.kv_len = 1537;
  p.causal = true;
  const int64_t Tq = p.q_len;
  const Segment kv = kv_shard(p.kv_len, r, P);
  const GlobalInputs g(p, seed);
  for (const std::string& tr : transports()) {
    SCOPED_TRACE(fmt::format("seed {} rank {} of {} transport {} q_len {}", seed, r, P, tr, Tq));
    ShardTensor k(p.dtype, 2, 4, kv.len, 128), v(p.dtype, 2, 4, kv.len, 128), out(p.dtype, 2, 16, Tq, 128);
    k.fill(seed, InputTensor::K, {kv});
    v.fill(seed, InputTensor::V, {kv});
    out.poison();
    BackendAndTransport bt = make_pair_for(tr, MPI_COMM_WORLD);
    Backend* backend = bt.backend.get();
    Transport* t = bt.transport.get();
    DeviceCopy dq(*backend, g.q), dk(*backend, k), dv(*backend, v), dout(*backend, out);
    run_distributed_decode(p, LocalTensors{dq.view, dk.view, dv.view, dout.view, nullptr}, *backend, *t);
    backend->copy_to_host(out.bytes.data(), dout.buf.get(), out.bytes.size());
    const FlashParams gf = g.params(p);
    ErrorSums eo;
    std::vector<double> ro(128);
    double rl = 0;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 16; ++h)
        for (int64_t i = 0; i < Tq; ++i) {
          cpu::naive_row(gf, b, h, i, ro.data(), &rl);
          for (int64_t d = 0; d < 128; ++d) eo.add(out.at(b, h, i, d), ro[size_t(d)]);
        }
    EXPECT_LT(eo.reduced_rel(), 1e-2);
    EXPECT_TRUE(test::same_on_all_ranks(std::string(reinterpret_cast<const char*>(out.bytes.data()), out.bytes.size())));
  }
}

INSTANTIATE_TEST_SUITE_P(QueryRows, GpuDecode, ::testing::Values(int64_t(1), int64_t(3)));

#ifdef RINGATTN_HAVE_NCCL
int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// A self-attention problem of 64 tokens for one rank, its tensors on `b`, and the ring's error.
std::string ring_error_with(Backend& b, Transport& t) {
  GlobalProblem p;
  p.batch = 1, p.q_heads = 2, p.kv_heads = 1, p.head_dim = 64, p.dtype = DType::BF16, p.q_len = p.kv_len = 64;
  ShardTensor q(p.dtype, 1, 2, 64, 64), k(p.dtype, 1, 1, 64, 64), v(p.dtype, 1, 1, 64, 64), out(p.dtype, 1, 2, 64, 64);
  q.fill(1, InputTensor::Q, {{0, 64, 1}});
  k.fill(1, InputTensor::K, {{0, 64, 1}});
  v.fill(1, InputTensor::V, {{0, 64, 1}});
  DeviceCopy dq(b, q), dk(b, k), dv(b, v), dout(b, out);
  try {
    run_ring_attention(p, LocalTensors{dq.view, dk.view, dv.view, dout.view, nullptr}, b, t);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// A backend and an NCCL transport on different GPUs are refused before any exchange, with both
// GPUs named (a world of one per rank, so every rank runs it alone). Needs two GPUs.
TEST(GpuPairing, BackendAndNcclTransportOnDifferentGpusAreRefused) {
  if (!test::all_ranks(visible_gpus() >= 2)) GTEST_SKIP() << "needs two GPUs";
  auto on_gpu1 = make_cuda_backend(1);            // makes GPU 1 the current device...
  auto t = make_nccl_transport(MPI_COMM_SELF);    // ...so the transport is made on GPU 1
  auto on_gpu0 = make_cuda_backend(0);
  const std::string e = ring_error_with(*on_gpu0, *t);
  EXPECT_NE(e.find("the CUDA backend is on GPU 0 but the NCCL transport was made on GPU 1"), std::string::npos) << e;
  // The same pair on GPU 1 runs.
  EXPECT_EQ(ring_error_with(*on_gpu1, *t), "");
}

// Made over a host transport, NCCL takes its rank and size from it and forwards the host
// collectives; a missing host is refused by text.
TEST(GpuPairing, NcclOverAHostTransport) {
  if (!all_ranks_have_cuda()) GTEST_SKIP() << "no CUDA device";
  auto b = make_cuda_backend(0);
  auto t = make_nccl_transport(make_local_transport());
  EXPECT_EQ(t->name(), "nccl");
  EXPECT_EQ(t->rank(), 0);
  EXPECT_EQ(t->size(), 1);
  EXPECT_TRUE(t->accepts_device_memory());
  int mine = 7, all = -1;
  t->allgather(&mine, &all, sizeof(int));
  EXPECT_EQ(all, 7);
  EXPECT_EQ(ring_error_with(*b, *t), "");
  try {
    make_nccl_transport(std::unique_ptr<Transport>{});
    ADD_FAILURE() << "a null host transport was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "make_nccl_transport: the host transport is missing (a null pointer)");
  }
}

// The NCCL transport moves device memory: a host backend beside it is refused, naming its GPU.
TEST(GpuPairing, HostBackendWithNcclTransportIsRefused) {
  if (!all_ranks_have_cuda()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  auto t = make_nccl_transport(MPI_COMM_SELF);
  auto cpu = make_cpu_backend();
  const std::string e = ring_error_with(*cpu, *t);
  EXPECT_NE(e.find("the NCCL transport moves GPU memory (GPU 0) but the backend is a host backend"),
            std::string::npos) << e;
}
#endif

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) { return ringattn::test::run_all_tests_under_mpi(argc, argv); }
