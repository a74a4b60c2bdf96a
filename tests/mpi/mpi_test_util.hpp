// Helpers of the MPI tests: the gtest main under MPI, a seed shared by all ranks, inputs for a
// rank's shard, and error norms reduced over all ranks (so every rank asserts the same verdict).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "runner/problem/inputs.hpp"
#include "comm/mpi_transport.hpp"
#include "runner/ring/ring.hpp"

namespace ringattn::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A fresh seed drawn on rank 0 and broadcast, so all ranks build the same global problem.
inline uint64_t shared_seed() {
  uint64_t s = fresh_seed();
  MPI_Bcast(&s, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return s;
}

// A host [B, H, T, D] tensor whose local row i holds global token `positions[i]`.
struct ShardTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
  ShardTensor(DType dt, int64_t b, int64_t h, int64_t t, int64_t d, bool bthd = false)
      : bytes(size_t(std::max<int64_t>(1, b * h * t * d)) * size_t(dtype_size(dt))) {
    view = bthd ? bthd_view(bytes.data(), dt, b, h, t, d) : bhtd_view(bytes.data(), dt, b, h, t, d);
  }
  // Fills rows segment by segment from the deterministic global inputs.
  void fill(uint64_t seed, InputTensor which, const std::vector<Segment>& segs) {
    int64_t row = 0;
    for (const Segment& s : segs) {
      if (s.len > 0) fill_input(view.rows(row, s.len), seed, which, s.start, s.stride);
      row += s.len;
    }
  }
  void poison() {  // NaN in every element: unwritten output is caught
    for (int64_t i = 0; i < view.numel(); ++i) store_from_float(bytes.data(), view.dtype, i, NAN);
  }
  float at(int64_t b, int64_t h, int64_t t, int64_t d) const { return load_as_float(bytes.data(), view.dtype, view.offset(b, h, t) + d); }
};

// One rank's tensors: inputs and dO from the deterministic global inputs, outputs poisoned (NaN).
struct BwdShard {
  ShardTensor q, k, v, out, dout, dq, dk, dv;
  std::vector<float> lse;
  BwdShard(const GlobalProblem& p, const std::vector<Segment>& segs, int64_t T, uint64_t seed)
      : q(p.dtype, p.batch, p.q_heads, T, p.head_dim), k(p.dtype, p.batch, p.kv_heads, T, p.head_dim),
        v(p.dtype, p.batch, p.kv_heads, T, p.head_dim), out(p.dtype, p.batch, p.q_heads, T, p.head_dim),
        dout(p.dtype, p.batch, p.q_heads, T, p.head_dim), dq(DType::F32, p.batch, p.q_heads, T, p.head_dim),
        dk(DType::F32, p.batch, p.kv_heads, T, p.head_dim), dv(DType::F32, p.batch, p.kv_heads, T, p.head_dim),
        lse(std::max<size_t>(1, size_t(p.batch * p.q_heads * T)), NAN) {
    q.fill(seed, InputTensor::Q, segs);
    k.fill(seed, InputTensor::K, segs);
    v.fill(seed, InputTensor::V, segs);
    dout.fill(seed, InputTensor::DO, segs);
    for (ShardTensor* t : {&out, &dq, &dk, &dv}) t->poison();
  }
  LocalTensors tensors() { return LocalTensors{q.view, k.view, v.view, out.view, lse.data()}; }
  BackwardTensors grads() { return BackwardTensors{dout.view, dq.view, dk.view, dv.view}; }
};

// The whole problem on one host: Q [B,Hq,q_len,D], K and V [B,Hkv,kv_len,D], for the oracle.
struct GlobalInputs {
  ShardTensor q, k, v;
  GlobalInputs(const GlobalProblem& p, uint64_t seed)
      : q(p.dtype, p.batch, p.q_heads, p.q_len, p.head_dim),
        k(p.dtype, p.batch, p.kv_heads, p.kv_len, p.head_dim),
        v(p.dtype, p.batch, p.kv_heads, p.kv_len, p.head_dim) {
    // Decode queries sit at positions q_offset + i relative to key 0.
    const int64_t q0 = p.is_ring() ? 0 : p.resolved_q_offset();
    q.fill(seed, InputTensor::Q, {{q0, p.q_len, 1}});
    k.fill(seed, InputTensor::K, {{0, p.kv_len, 1}});
    v.fill(seed, InputTensor::V, {{0, p.kv_len, 1}});
  }
  FlashParams params(const GlobalProblem& p) const {
    FlashParams f;
    f.q = q.view;
    f.k = k.view;
    f.v = v.view;
    f.scale = p.resolved_scale();
    f.mask = p.mask();  // band_mask: the causal rule, the q_offset and the window
    return f;
  }
};

// Sums of squared error and squared reference, reduced over ranks: the relative error of the
// gathered output, identical on every rank.
struct ErrorSums {
  double num = 0, den = 0;
  bool nan = false;
  void add(double x, double ref) {
    if (std::isnan(x) || std::isinf(x)) {
      nan = true;
      return;
    }
    num += (x - ref) * (x - ref);
    den += ref * ref;
  }
  double reduced_rel() const {
    double s[3] = {num, den, nan ? 1.0 : 0.0}, g[3];
    MPI_Allreduce(s, g, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (g[2] > 0) return std::numeric_limits<double>::infinity();
    return g[1] > 0 ? std::sqrt(g[0] / g[1]) : std::sqrt(g[0]);
  }
};

// True on every rank when the condition holds on every rank.
inline bool all_ranks(bool ok) {
  int v = ok ? 1 : 0, g = 0;
  MPI_Allreduce(&v, &g, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return g == 1;
}

// The same string on every rank?
inline bool same_on_all_ranks(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  uint64_t lo = h, hi = h;
  uint64_t gmin = 0, gmax = 0;
  MPI_Allreduce(&lo, &gmin, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&hi, &gmax, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return gmin == gmax;
}

// A host tensor mirrored in backend memory (device memory for the CUDA backend).
struct DeviceCopy {
  DeviceBuffer buf;
  TensorView view;
  DeviceCopy(Backend& b, const ShardTensor& h) : buf(b, h.bytes.size()) {
    b.copy_from_host(buf.get(), h.bytes.data(), h.bytes.size());
    view = h.view;
    view.data = buf.get();
  }
};

// Relative errors of a rank's ring output (and fp32 LSE, [B, H, T] contiguous) against the fp64
// oracle of the global problem (packed documents: each row against its document's keys alone),
// reduced over all ranks: the same verdict on every rank.
struct RingErrors {
  double out = 0, lse = 0;
};
inline RingErrors ring_errors_vs_oracle(const GlobalProblem& p, const GlobalInputs& g, const ShardLayout& l,
                                        const ShardTensor& out, const std::vector<float>& lse) {
  const FlashParams gf = g.params(p);
  const int64_t T = l.tokens(), H = p.q_heads, D = p.head_dim;
  const std::vector<int64_t> bounds = p.doc_bounds();
  ErrorSums eo, el;
  std::vector<double> ro(static_cast<size_t>(D));
  double rl = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t pos = l.global_position(i);
        FlashParams f = gf;
        for (size_t d = 0; d + 1 < bounds.size(); ++d)
          if (pos >= bounds[d] && pos < bounds[d + 1]) {  // its document [a, e): key j sits at a + j
            f.k = gf.k.rows(bounds[d], bounds[d + 1] - bounds[d]);
            f.v = gf.v.rows(bounds[d], bounds[d + 1] - bounds[d]);
            f.mask = band_mask(p.causal, p.window, -bounds[d], 1);
          }
        cpu::naive_row(f, b, h, pos, ro.data(), &rl);
        for (int64_t d = 0; d < D; ++d) eo.add(out.at(b, h, i, d), ro[size_t(d)]);
        el.add(lse[size_t((b * H + h) * T + i)], rl);
      }
  return {eo.reduced_rel(), el.reduced_rel()};
}

// A failing rank ends every rank (as the CLI does), so a failure never leaves the other ranks
// waiting in a collective: a fatal failure (ASSERT_*, an exception escaping the test body) ends
// the job at once, since this rank has left the test while the others may be inside a
// collective of it; a non-fatal one (EXPECT_*) at the end of its test, after its remaining
// checks. Either way the failure text is printed first, then MPI_Abort ends all ranks non-zero.
class AbortOnFailure : public ::testing::EmptyTestEventListener {
 public:
  // The test's name is kept here: gtest holds its lock while it reports a part result, so
  // asking it for the current test from OnTestPartResult would deadlock.
  void OnTestStart(const ::testing::TestInfo& t) override {
    test_ = std::string(t.test_suite_name()) + "." + t.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", world_rank(), r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.summary());
    std::fflush(stderr);
    if (r.fatally_failed()) end_job("a fatal failure");
    failed_ = true;
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    if (failed_) end_job("a failed check");
  }

 private:
  void end_job(const char* what) const {
    std::fprintf(stderr, "[rank %d] %s in %s: ending every rank (MPI_Abort)\n", world_rank(), what, test_.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::string test_;
  bool failed_ = false;
};

// The name of a test parameterized by the MPI progress mode: helper_thread or nonblocking.
inline std::string progress_param_name(const ::testing::TestParamInfo<MpiProgress>& i) {
  return i.param == MpiProgress::HelperThread ? "helper_thread" : "nonblocking";
}

// main() of every MPI test binary: MPI with the thread level that two helper-thread transports at
// once need (the ring backward), or `level` for a test of the transports' own rules.
inline int run_all_tests_under_mpi(int argc, char** argv, int level = MPI_THREAD_MULTIPLE) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, level, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  // Only rank 0 prints progress; every rank prints its own failures (AbortOnFailure).
  if (world_rank() != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new AbortOnFailure);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}

}  // namespace ringattn::test
