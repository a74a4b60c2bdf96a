// ringattn_ring_overhead: what the ring costs on GPUs. Under `mpirun -np P`, times the whole
// ring-attention call (run_ring_attention: agreement, packing, hops, fold, cast) with the chosen
// transport, and at P = 1 also the plain single-GPU kernel on the same problem (one flash call
// and the cast), side by side in one process; prints medians, their ratio and the per-hop
// compute / exposed-exchange times of the last run.
//   mpirun -np 1 ringattn_ring_overhead --transport nccl --seq 8192 --causal
//   mpirun -np 2 ringattn_ring_overhead --transport mpi --seq 8192 --causal --shard zigzag
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kernels/backend.hpp"
#include "runner/problem/inputs.hpp"
#include "comm/mpi_transport.hpp"
#include "runner/ring/ring.hpp"
#ifdef RINGATTN_HAVE_NCCL
#include "comm/nccl_mpi.hpp"
#endif

using namespace ringattn;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A device tensor filled from the deterministic inputs for this rank's shard.
DeviceBuffer device_shard(Backend& b, DType dt, int64_t B, int64_t H, const ShardLayout& l, int64_t D, uint64_t seed,
                          InputTensor which, TensorView& view) {
  const int64_t T = l.tokens();
  std::vector<uint8_t> host(size_t(B * H * T * D * dtype_size(dt)));
  TensorView hv = bhtd_view(host.data(), dt, B, H, T, D);
  int64_t row = 0;
  for (const Segment& s : l.segments) {
    fill_input(hv.rows(row, s.len), seed, which, s.start, s.stride);
    row += s.len;
  }
  DeviceBuffer buf(b, host.size());
  b.copy_from_host(buf.get(), host.data(), host.size());
  view = hv;
  view.data = buf.get();
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  CLI::App app("ring overhead on GPUs");
  std::string transport = "nccl", shard = "zigzag", dtype = "bf16";
  int64_t seq = 8192, heads = 32, kv_heads = 8, dim = 128;
  int reps = 20, warmup = 3;
  bool causal = false;
  app.add_option("--transport", transport)->check(CLI::IsMember({"nccl", "mpi"}));
  app.add_option("--shard", shard);
  app.add_option("--dtype", dtype);
  app.add_option("--seq", seq);
  app.add_option("--heads", heads);
  app.add_option("--kv-heads", kv_heads);
  app.add_option("--dim", dim);
  app.add_option("--reps", reps);
  app.add_option("--warmup", warmup);
  app.add_flag("--causal", causal);
  CLI11_PARSE(app, argc, argv);
  int rc = 0;
  try {
    GlobalProblem p;
    p.batch = 1, p.q_heads = heads, p.kv_heads = kv_heads, p.head_dim = dim, p.q_len = p.kv_len = seq;
    p.dtype = parse_dtype(dtype), p.causal = causal, p.sharding = parse_sharding(shard);
    int gpu = 0;
    std::unique_ptr<Transport> t;
#ifdef RINGATTN_HAVE_NCCL
    if (transport == "nccl") gpu = select_local_gpu(MPI_COMM_WORLD);
#endif
    auto b = make_cuda_backend(gpu);
    if (transport == "nccl") {
#ifdef RINGATTN_HAVE_NCCL
      t = make_nccl_transport(MPI_COMM_WORLD);
#else
      throw InvalidArgument("built without NCCL");
#endif
    } else {
      t = make_mpi_transport(MPI_COMM_WORLD);
    }
    const ShardLayout l = shard_layout(p.sharding, seq, rank, world);
    const int64_t T = l.tokens();
    TensorView q, k, v;
    DeviceBuffer bq = device_shard(*b, p.dtype, 1, heads, l, dim, 42, InputTensor::Q, q);
    DeviceBuffer bk = device_shard(*b, p.dtype, 1, kv_heads, l, dim, 42, InputTensor::K, k);
    DeviceBuffer bv = device_shard(*b, p.dtype, 1, kv_heads, l, dim, 42, InputTensor::V, v);
    DeviceBuffer bo(*b, size_t(heads * T * dim * dtype_size(p.dtype)));
    DeviceBuffer blse(*b, size_t(heads * T) * sizeof(float));
    TensorView out = bhtd_view(bo.get(), p.dtype, 1, heads, T, dim);
    const LocalTensors x{q, k, v, out, blse.as<float>()};

    std::vector<double> ring_s, ring_noagree_s, plain_s;
    RankStats last;
    for (int i = 0; i < warmup + reps; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now_s();
      last = run_ring_attention(p, x, *b, *t);
      if (i >= warmup) ring_s.push_back(now_s() - t0);
      MPI_Barrier(MPI_COMM_WORLD);
      RunOptions no_agree;
      no_agree.check_agreement = false;
      t0 = now_s();
      run_ring_attention(p, x, *b, *t, no_agree);
      if (i >= warmup) ring_noagree_s.push_back(now_s() - t0);
    }
    if (world == 1) {
      // The plain kernel: one flash call (Write) that also writes the final output, no ring.
      DeviceBuffer so(*b, size_t(heads * T * dim) * sizeof(float));
      FlashParams f;
      f.q = q, f.k = k, f.v = v, f.scale = p.resolved_scale(), f.mask = MaskSpec{causal, 0};
      f.state = contiguous_state(so.as<float>(), blse.as<float>(), 1, heads, T, dim);
      f.mode = StateMode::Write;
      f.out = out;
      for (int i = 0; i < warmup + reps; ++i) {
        const double t0 = now_s();
        b->flash(f);
        b->synchronize();
        if (i >= warmup) plain_s.push_back(now_s() - t0);
      }
    }
    const double flops = 4.0 * heads * double(seq) * double(seq) * dim / (causal ? 2 : 1);
    if (rank == 0) {
      std::printf("# ring overhead: %s transport, %d rank(s), %s, seq %ld, heads %ld/%ld, dim %ld, %s, %s\n",
                  t->name().c_str(), world, dtype.c_str(), long(seq), long(heads), long(kv_heads), long(dim),
                  causal ? "causal" : "full", shard.c_str());
      std::printf("ring (with agreement)   median %8.3f ms  %7.1f TFLOP/s\n", median(ring_s) * 1e3,
                  flops / median(ring_s) / 1e12);
      std::printf("ring (agreement off)    median %8.3f ms  %7.1f TFLOP/s\n", median(ring_noagree_s) * 1e3,
                  flops / median(ring_noagree_s) / 1e12);
      if (world == 1)
        std::printf("plain kernel (one call) median %8.3f ms  %7.1f TFLOP/s   ring/plain %.3f (agreement off %.3f)\n",
                    median(plain_s) * 1e3, flops / median(plain_s) / 1e12, median(ring_s) / median(plain_s),
                    median(ring_noagree_s) / median(plain_s));
    }
    // Per-hop times of the last run, every rank in turn.
    for (int r = 0; r < world; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      if (r != rank) continue;
      for (const HopStats& h : last.hops)
        std::printf("rank %d hop %d from rank %d: compute %.3f ms, exposed exchange %.3f ms, transfer %.3f ms, %llu "
                    "bytes\n", rank, h.hop, h.source_rank, h.compute_s * 1e3, h.exposed_comm_s * 1e3,
                    h.transfer_s * 1e3, static_cast<unsigned long long>(h.bytes_sent));
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: ringattn_ring_overhead: %s\n", rank, e.what());
    rc = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
