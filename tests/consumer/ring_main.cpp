// The ring API of an installed ringattn, as the README shows it: a causal GQA self-attention
// sharded with zigzag and run by run_attention over the world of one (make_local_transport; under
// mpirun the same code takes make_mpi_transport(MPI_COMM_WORLD)), checked against the fp64
// oracle. Exits non-zero on a wrong answer.
#include <cmath>
#include <cstdio>
#include <vector>

#include <ringattn/kernels/cpu/cpu_kernels.hpp>
#include <ringattn/runner/problem/inputs.hpp>
#include <comm/mpi_transport.hpp>
#include <ringattn/runner/ring/ring.hpp>

int main() {
  using namespace ringattn;
  GlobalProblem p;
  p.batch = 1;
  p.q_heads = 8;
  p.kv_heads = 2;
  p.q_len = p.kv_len = 512;
  p.head_dim = 64;
  p.dtype = DType::F32;
  p.causal = true;
  p.sharding = Sharding::Zigzag;

  std::unique_ptr<Transport> t = make_local_transport();
  std::unique_ptr<Backend> cpu = make_cpu_backend();  // host memory: plain vectors will do
  validate_problem(p, t->size());

  // This rank's tokens, and its Q, K, V rows filled segment by segment from global positions.
  const ShardLayout layout = shard_layout(p.sharding, p.q_len, t->rank(), t->size());
  const int64_t n = layout.tokens(), B = p.batch, H = p.q_heads, HKV = p.kv_heads, D = p.head_dim;
  std::vector<float> q(B * H * n * D), k(B * HKV * n * D), v(B * HKV * n * D), o(B * H * n * D), lse(B * H * n);
  LocalTensors x;
  x.q = bhtd_view(q.data(), p.dtype, B, H, n, D);
  x.k = bhtd_view(k.data(), p.dtype, B, HKV, n, D);
  x.v = bhtd_view(v.data(), p.dtype, B, HKV, n, D);
  x.out = bhtd_view(o.data(), p.dtype, B, H, n, D);
  x.lse = lse.data();
  for (size_t s = 0; s < layout.segments.size(); ++s) {
    const Segment& seg = layout.segments[s];
    const int64_t row = layout.first_row(s);
    fill_input(x.q.rows(row, seg.len), 1, InputTensor::Q, seg.start, seg.stride);
    fill_input(x.k.rows(row, seg.len), 1, InputTensor::K, seg.start, seg.stride);
    fill_input(x.v.rows(row, seg.len), 1, InputTensor::V, seg.start, seg.stride);
  }
  const RankStats stats = run_attention(p, x, *cpu, *t);

  // One rank holds the whole sequence, in global order: compare with the oracle on all of it.
  FlashParams whole;
  whole.q = x.q;
  whole.k = x.k;
  whole.v = x.v;
  whole.scale = p.resolved_scale();
  whole.mask.causal = true;
  const cpu::Reference ref = cpu::naive_attention(whole);
  double worst = 0;
  for (size_t i = 0; i < o.size(); ++i) worst = std::fmax(worst, std::fabs(o[i] - ref.o[i]));
  for (size_t i = 0; i < lse.size(); ++i) worst = std::fmax(worst, std::fabs(lse[i] - ref.lse[i]));
  std::printf("ring consumer: %d hop(s), %.3f ms, max abs error %.3g against the fp64 oracle\n",
              int(stats.hops.size()), stats.total_s * 1e3, worst);
  return worst < 1e-4 ? 0 : 1;
}
