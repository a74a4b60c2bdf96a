// The backward pass on the CPU: the fp64 gradient oracle against finite differences of the fp64
// forward, and the tiled fp32 engine against the oracle, on fresh random inputs.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "common/backward_util.hpp"
#include "common/test_util.hpp"
#include "core/error.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

namespace ringattn {
namespace {

using test::HostTensor;
using test::Shape;
using test::Problem;
using test::describe;
using test::errors_of;
using test::Errors;
using test::grad_tolerance;

constexpr float kNaN = test::kNaN;

// ---- the oracle against finite differences ----

// L = sum(dout * o) with o from the fp64 forward oracle, row by row (serial: hundreds of calls
// per test stay cheap on a loaded machine).
double loss(const FlashParams& f, const HostTensor& dout) {
  const int64_t B = f.q.batch, H = f.q.heads, T = f.q.len, D = f.q.dim;
  std::vector<double> o(static_cast<size_t>(D));
  double l = 0, lse = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        cpu::naive_row(f, b, h, i, o.data(), &lse);
        const int64_t off = dout.view.offset(b, h, i);
        for (int64_t d = 0; d < D; ++d) l += o[size_t(d)] * double(load_as_float(dout.view.data, DType::F32, off + d));
      }
  return l;
}

// Central differences of the loss in every element of `x` (fp32 storage: the step actually taken
// is measured, so the rounding of x +- h costs nothing) against `grad`; returns the worst
// |fd - grad|, and in *largest the largest |grad| seen.
double worst_fd_error(const FlashParams& f, const HostTensor& dout, HostTensor& x, const std::vector<double>& grad,
                      double* largest) {
  float* data = static_cast<float*>(x.view.data);
  double worst = 0;
  for (size_t i = 0; i < grad.size(); ++i) {
    const float x0 = data[i];
    const float hi = x0 + 1e-3f, lo = x0 - 1e-3f;
    data[i] = hi;
    const double l_hi = loss(f, dout);
    data[i] = lo;
    const double l_lo = loss(f, dout);
    data[i] = x0;
    const double fd = (l_hi - l_lo) / (double(hi) - double(lo));
    worst = std::max(worst, std::abs(fd - grad[i]));
    *largest = std::max(*largest, std::abs(grad[i]));
  }
  return worst;
}

TEST(CpuBackward, ReferenceMatchesFiniteDifferences) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  // GQA (2 query heads per kv head), a causal offset that leaves row 0 without keys, q_len != kv_len.
  const Shape shapes[] = {{1, 2, 1, 3, 5, 4, true, -1},
                          {1, 4, 2, 4, 3, 3, false, 0},
                          {2, 2, 2, 5, 5, 2, true, 0},
                          {1, 2, 1, 5, 6, 3, true, 1, 1},    // a window of two keys per row
                          {1, 2, 2, 4, 6, 3, false, 2, 0}};  // a lower edge only
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << describe(sh));
    HostTensor q(DType::F32, sh.b, sh.hq, sh.t, sh.d, rng), k(DType::F32, sh.b, sh.hkv, sh.s, sh.d, rng),
        v(DType::F32, sh.b, sh.hkv, sh.s, sh.d, rng), dout(DType::F32, sh.b, sh.hq, sh.t, sh.d, rng);
    FlashParams f;
    f.q = q.view;
    f.k = k.view;
    f.v = v.view;
    f.scale = 0.7f;
    f.mask = MaskSpec{sh.causal, sh.q_offset, sh.window};
    BackwardParams b;
    b.q = q.view;
    b.k = k.view;
    b.v = v.view;
    b.dout = dout.view;
    b.scale = f.scale;
    b.mask = f.mask;
    const cpu::GradReference g = cpu::naive_backward(b);
    double largest = 0;
    // Central differences with h = 1e-3 err by about h^2 / 6 times the third derivative, which
    // random inputs push to ~1e-5 now and then (2e-6 failed about once in 40 seeds); a wrong
    // gradient errs by far more than 1e-4 against gradients of at least 0.05.
    constexpr double kTol = 1e-4;
    EXPECT_LT(worst_fd_error(f, dout, q, g.dq, &largest), kTol) << "dq";
    EXPECT_LT(worst_fd_error(f, dout, k, g.dk, &largest), kTol) << "dk";
    EXPECT_LT(worst_fd_error(f, dout, v, g.dv, &largest), kTol) << "dv";
    EXPECT_GT(largest, 0.05) << "the gradients compared are not all (near) zero";
  }
}

// ---- the tiled engine against the oracle ----

// ||g - ref|| over all elements (NaN anywhere: +inf).
double abs_error(const std::vector<float>& g, const std::vector<double>& ref) {
  double sum = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(g[i])) return std::numeric_limits<double>::infinity();
    sum += (double(g[i]) - ref[i]) * (double(g[i]) - ref[i]);
  }
  return std::sqrt(sum);
}

// ||x||.
double norm_of(const std::vector<double>& x) {
  double s2 = 0;
  for (double e : x) s2 += e * e;
  return std::sqrt(s2);
}

// Bounds on ||dq||, ||dk|| and ||dv|| of the fp32 rounding error of any correct engine, for fp32
// inputs in [B, H, T, D] order. A relative tolerance has no scale where the gradient cancels: with
// one key dq = dk = 0 exactly (a softmax over one key has no slope, and dP - D = dout . (v - o)
// vanishes), and with a few keys dP_ij - D_i can be far below its terms. The rounding scales with
// the terms instead: dP_ij and D_i are dot products of D terms, each off by at most gamma(n) times
// sum_d |dout_id| (|v_jd| + |o_id|) (the bound for a recursive sum, gamma(n) = n u / (1 - n u)),
// which goes through dS_ij = P_ij (dP_ij - D_i) to dq_i = scale sum_j dS_ij k_j and
// dk_j = scale sum_i dS_ij q_i; dv_j = sum_i P_ij dout_i is off by gamma(n) sum_i P_ij |dout_i|.
// n = D + max(T, S) + 4 covers the sums over keys or rows and P's rounding, to first order in u;
// the element-wise bounds' norm bounds the error's norm. Measured: errors reach 3% of it (200
// seeds); it is ~1e-4 of the gradient's norm at the median, and a wrong dP, D or a missing block
// errs by about the terms themselves, 1 / gamma(n) (~1e5) times the bound (a mutant engine
// whose D is off by 3e-5 relative fails every run, by 3e-6 about one run in three).
struct RoundingBounds {
  double dq, dk, dv;
};
RoundingBounds rounding_bounds(const Problem& pr, const Shape& sh) {
  auto at = [](const HostTensor& x, int64_t i) { return double(reinterpret_cast<const float*>(x.bytes.data())[i]); };
  const double u = std::numeric_limits<float>::epsilon() / 2, n = double(sh.d + std::max(sh.t, sh.s) + 4);
  const double gamma = n * u / (1 - n * u), scale = pr.p.scale;
  const int64_t group = sh.hq / sh.hkv, D = sh.d;
  std::vector<double> bq(pr.dq.size(), 0.0), bk(pr.dk.size(), 0.0), bv(pr.dv.size(), 0.0);
  for (int64_t b = 0; b < sh.b; ++b)
    for (int64_t h = 0; h < sh.hq; ++h)
      for (int64_t i = 0; i < sh.t; ++i) {
        const int64_t row = (b * sh.hq + h) * sh.t + i;
        const KeyRange keys = visible_range(pr.p.mask, i, sh.s);
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          const int64_t key = (b * sh.hkv + h / group) * sh.s + j;
          double qk = 0, a = 0;
          for (int64_t d = 0; d < D; ++d) {
            qk += at(pr.q, row * D + d) * at(pr.k, key * D + d);
            a += std::abs(at(pr.dout, row * D + d)) * (std::abs(at(pr.v, key * D + d)) + std::abs(at(pr.o, row * D + d)));
          }
          const double P = std::exp(scale * qk - double(pr.lse[size_t(row)]));
          for (int64_t d = 0; d < D; ++d) {
            bq[size_t(row * D + d)] += scale * P * a * std::abs(at(pr.k, key * D + d));
            bk[size_t(key * D + d)] += scale * P * a * std::abs(at(pr.q, row * D + d));
            bv[size_t(key * D + d)] += P * std::abs(at(pr.dout, row * D + d));
          }
        }
      }
  return {gamma * norm_of(bq), gamma * norm_of(bk), gamma * norm_of(bv)};
}

TEST(CpuBackward, MatchesReferenceOnRandomShapes) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t lens[] = {1, 7, 77};
  const int64_t groups[] = {1, 4, 8};
  const int64_t dims[] = {64, 8, 24};
  for (int trial = 0; trial < 18; ++trial) {
    Shape sh;
    sh.b = 1 + int64_t(rng() % 2);
    sh.hkv = 1 + int64_t(rng() % 2);
    sh.hq = sh.hkv * groups[trial % 3];
    sh.d = dims[(trial / 3) % 3];
    sh.t = trial < 9 ? lens[trial % 3] : 1 + int64_t(rng() % 90);
    // q_len != kv_len on odd trials; 2 keys at least: with one, dq = dk = 0 exactly and the error
    // measures only rounding (lens[] covers the one-key case at s = t = 1).
    sh.s = trial % 2 == 0 ? sh.t : 2 + int64_t(rng() % 89);
    sh.causal = trial % 4 != 3;
    // The default offset (queries last), or any offset from "row 0 sees nothing" to "all see all".
    sh.q_offset = !sh.causal ? 0 : trial % 4 == 0 ? sh.s - sh.t : int64_t(rng() % uint64_t(sh.t + sh.s + 4)) - sh.t - 2;
    // A window (lower edge) on every third trial, narrower or wider than a tile; without the
    // causal edge it sits at the offset. Not 0: a row that sees one key has dq = dk = 0 exactly,
    // and a relative error against a zero gradient measures only rounding.
    if (trial % 3 == 1) {
      sh.window = 1 + int64_t(rng() % 50);
      if (!sh.causal) sh.q_offset = int64_t(rng() % uint64_t(sh.s + 2)) - sh.t / 2;
    }
    Problem pr(sh, DType::F32, rng);
    pr.p.tile_q = 1 + int(rng() % 40);
    pr.p.tile_k = 1 + int(rng() % 40);
    cpu::flash_backward(pr.p);
    const cpu::GradReference ref = cpu::naive_backward(pr.p);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " trial " << trial << " " << describe(sh) << " tiles "
                                      << pr.p.tile_q << "x" << pr.p.tile_k);
    // Relative to the gradient (1e-5), or within the rounding of its terms where it cancels (<=:
    // where no row sees a key, the gradients and both bounds are exactly 0).
    const RoundingBounds rb = rounding_bounds(pr, sh);
    const double tol = grad_tolerance(DType::F32);
    EXPECT_LE(abs_error(pr.dq, ref.dq), tol * norm_of(ref.dq) + rb.dq) << "dq";
    EXPECT_LE(abs_error(pr.dk, ref.dk), tol * norm_of(ref.dk) + rb.dk) << "dk";
    EXPECT_LE(abs_error(pr.dv, ref.dv), tol * norm_of(ref.dv) + rb.dv) << "dv";
  }
}

TEST(CpuBackward, HalfInputs) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (DType dt : {DType::F16, DType::BF16})
    for (bool causal : {true, false}) {
      const Shape sh{1, 8, 2, 77, 61, 64, causal, 3};
      Problem pr(sh, dt, rng);
      cpu::flash_backward(pr.p);
      const Errors e = errors_of(pr, cpu::naive_backward(pr.p));
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << dtype_name(dt) << " " << describe(sh));
      EXPECT_LT(e.dq, grad_tolerance(dt));
      EXPECT_LT(e.dk, grad_tolerance(dt));
      EXPECT_LT(e.dv, grad_tolerance(dt));
    }
}

// A 16-bit output moves D = rowsum(dO * o) by a rounding of o, which the gradients carry in
// proportion to |dO| |o| |k|: with N(0, 16^2) inputs and head dim 1 or 2 it is ~10% of dq against
// the exact oracle. The oracle whose D reads the stored output (OracleDelta::FromOutput) leaves
// only the arithmetic's error, inside the dtype's bound.
TEST(CpuBackward, HalfOutputsOfLargeInputsAgainstTheOracleOfTheStoredOutput) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (DType dt : {DType::F16, DType::BF16})
    for (int64_t d : {1, 2})
      for (bool causal : {true, false}) {
        const Shape sh{1, 4, 2, 300, 300, d, causal, 0};
        Problem pr(sh, dt, rng, false, 16.f);
        cpu::flash_backward(pr.p);
        const Errors e = errors_of(pr, cpu::naive_backward(pr.p, cpu::OracleDelta::FromOutput));
        SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << dtype_name(dt) << " " << describe(sh));
        EXPECT_LT(e.dq, grad_tolerance(dt));
        EXPECT_LT(e.dk, grad_tolerance(dt));
        EXPECT_LT(e.dv, grad_tolerance(dt));
      }
}

TEST(CpuBackward, RowsWithoutKeysContributeNothing) {
  std::mt19937_64 rng(test::fresh_seed());
  const Shape sh{1, 2, 1, 9, 6, 8, true, -4};  // rows 0..3 see no key
  Problem pr(sh, DType::F32, rng);
  cpu::flash_backward(pr.p);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 9; ++i) {
      EXPECT_EQ(pr.lse[size_t(h * 9 + i)] == -std::numeric_limits<float>::infinity(), i < 4) << "row " << i;
      for (int64_t d = 0; d < 8; ++d)
        if (i < 4) EXPECT_EQ(pr.dq[size_t((h * 9 + i) * 8 + d)], 0.f) << "head " << h << " row " << i;
    }
  const Errors e = errors_of(pr, cpu::naive_backward(pr.p));
  EXPECT_LT(e.dq, grad_tolerance(DType::F32));
  EXPECT_LT(e.dk, grad_tolerance(DType::F32));
}

TEST(CpuBackward, AccumulateAddsToTheBuffers) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const Shape sh{2, 4, 1, 33, 47, 16, true, 14};
  Problem pr(sh, DType::F32, rng);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> dq0(pr.dq.size()), dk0(pr.dk.size()), dv0(pr.dv.size());
  for (auto* v : {&dq0, &dk0, &dv0})
    for (float& x : *v) x = n(rng);
  pr.dq = dq0;
  pr.dk = dk0;
  pr.dv = dv0;
  pr.p.mode = GradMode::Accumulate;
  cpu::flash_backward(pr.p);
  cpu::GradReference ref = cpu::naive_backward(pr.p);
  for (size_t i = 0; i < ref.dq.size(); ++i) ref.dq[i] += dq0[i];
  for (size_t i = 0; i < ref.dk.size(); ++i) ref.dk[i] += dk0[i];
  for (size_t i = 0; i < ref.dv.size(); ++i) ref.dv[i] += dv0[i];
  const Errors e = errors_of(pr, ref);
  EXPECT_LT(e.dq, grad_tolerance(DType::F32)) << "seed " << seed;
  EXPECT_LT(e.dk, grad_tolerance(DType::F32)) << "seed " << seed;
  EXPECT_LT(e.dv, grad_tolerance(DType::F32)) << "seed " << seed;
}

TEST(CpuBackward, StridedViews) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const Shape sh{2, 4, 2, 21, 21, 16, true, 0};
  Problem pr(sh, DType::F32, rng);
  // The same inputs in [B, T, H, D] memory, seen through strided views.
  auto to_bthd = [](const TensorView& x, std::vector<float>& store) {
    store.resize(size_t(x.numel()));
    TensorView y = bthd_view(store.data(), DType::F32, x.batch, x.heads, x.len, x.dim);
    for (int64_t b = 0; b < x.batch; ++b)
      for (int64_t h = 0; h < x.heads; ++h)
        for (int64_t t = 0; t < x.len; ++t)
          for (int64_t d = 0; d < x.dim; ++d)
            store[size_t(y.offset(b, h, t) + d)] = load_as_float(x.data, x.dtype, x.offset(b, h, t) + d);
    return y;
  };
  std::vector<float> q, k, v, o, dout, dq(pr.dq.size(), kNaN), dk(pr.dk.size(), kNaN), dv(pr.dv.size(), kNaN);
  BackwardParams s = pr.p;
  s.q = to_bthd(pr.p.q, q);
  s.k = to_bthd(pr.p.k, k);
  s.v = to_bthd(pr.p.v, v);
  s.o = to_bthd(pr.p.o, o);
  s.dout = to_bthd(pr.p.dout, dout);
  s.dq = bthd_view(dq.data(), DType::F32, sh.b, sh.hq, sh.t, sh.d);
  s.dk = bthd_view(dk.data(), DType::F32, sh.b, sh.hkv, sh.s, sh.d);
  s.dv = bthd_view(dv.data(), DType::F32, sh.b, sh.hkv, sh.s, sh.d);
  cpu::flash_backward(s);
  cpu::flash_backward(pr.p);
  // Element (b, h, t, d) of the strided result against the contiguous one.
  double worst = 0;
  auto compare = [&](const std::vector<float>& a, const TensorView& av, const std::vector<float>& c) {
    for (int64_t b = 0; b < av.batch; ++b)
      for (int64_t h = 0; h < av.heads; ++h)
        for (int64_t t = 0; t < av.len; ++t)
          for (int64_t d = 0; d < av.dim; ++d) {
            const float x = a[size_t(av.offset(b, h, t) + d)];
            const float y = c[size_t(((b * av.heads + h) * av.len + t) * av.dim + d)];
            worst = std::isnan(x) ? INFINITY : std::max(worst, double(std::abs(x - y)));
          }
  };
  compare(dq, s.dq, pr.dq);
  compare(dk, s.dk, pr.dk);
  compare(dv, s.dv, pr.dv);
  EXPECT_LT(worst, 1e-6) << "seed " << seed;
  EXPECT_LT(errors_of(pr, cpu::naive_backward(pr.p)).dk, grad_tolerance(DType::F32)) << "seed " << seed;
}

TEST(CpuBackward, BitwiseIdenticalAcrossThreadCounts) {
  std::mt19937_64 rng(test::fresh_seed());
  Problem pr({1, 8, 2, 70, 70, 32, true, 0}, DType::F32, rng);
  pr.p.tile_q = pr.p.tile_k = 16;
  pr.p.deterministic = true;
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  cpu::flash_backward(pr.p);
  const std::vector<float> dq = pr.dq, dk = pr.dk, dv = pr.dv;
  omp_set_num_threads(3);
  std::fill(pr.dq.begin(), pr.dq.end(), kNaN);
  cpu::flash_backward(pr.p);
  omp_set_num_threads(before);
  EXPECT_EQ(std::memcmp(dq.data(), pr.dq.data(), dq.size() * 4), 0);
  EXPECT_EQ(std::memcmp(dk.data(), pr.dk.data(), dk.size() * 4), 0);
  EXPECT_EQ(std::memcmp(dv.data(), pr.dv.data(), dv.size() * 4), 0);
}

TEST(CpuBackward, WorkspaceLinearInQLenOnly) {
  std::mt19937_64 rng(test::fresh_seed());
  size_t first = 0;
  for (int64_t s : {64, 512, 2048}) {
    Problem pr({1, 2, 1, 64, s, 32, false, 0}, DType::F32, rng);
    cpu::flash_backward(pr.p);
    const size_t used = cpu::last_backward_workspace_bytes();
    EXPECT_EQ(used, cpu::backward_workspace_bytes(pr.p, omp_get_max_threads()));
    if (first == 0) first = used;
    EXPECT_EQ(used, first) << "workspace grew with kv_len=" << s;
    if (s == 2048) EXPECT_LT(used, size_t(64 * 2048 * 4));  // below one score matrix
  }
}

// ---- validation ----

std::string message_of(const BackwardParams& p) {
  try {
    cpu::flash_backward(p);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CpuBackward, RefusesBadParamsWithClearMessages) {
  std::mt19937_64 rng(test::fresh_seed());
  const Shape sh{1, 4, 2, 8, 8, 16, true, 0};
  Problem pr(sh, DType::F32, rng);
  std::vector<uint16_t> half(pr.dq.size());
  struct Case {
    std::function<void(BackwardParams&)> edit;
    std::string expect;
  };
  const Case cases[] = {
      {[&](BackwardParams& p) { p.dq = bhtd_view(half.data(), DType::BF16, 1, 4, 8, 16); },
       "dq is bf16; gradients are fp32"},
      {[](BackwardParams& p) { p.dk.len = 7; }, "dk has shape [1, 2, 7, 16] but k has [1, 2, 8, 16]; they must be equal"},
      {[](BackwardParams& p) { p.dv.data = nullptr; }, "dv must point to memory"},
      {[](BackwardParams& p) { p.dv = p.dk; }, "dk and dv point to the same memory"},
      {[](BackwardParams& p) { p.lse.data = nullptr; }, "lse (the forward's log-sum-exp) must point to data"},
      {[](BackwardParams& p) { p.lse.len = 9; }, "lse has shape [1, 4, 9] but q has [1, 4, 8, ...]"},
      {[](BackwardParams& p) { p.dout.len = 3; }, "dout has shape [1, 4, 3, 16] but q has [1, 4, 8, 16]"},
      {[](BackwardParams& p) { p.o.dtype = DType::F16; }, "o is fp16 but q is fp32"},
      {[](BackwardParams& p) { p.k.heads = p.v.heads = p.dk.heads = p.dv.heads = 3; },
       "q_heads=4 is not a multiple of kv_heads=3"},
      {[](BackwardParams& p) { p.scale = NAN; }, "softmax scale must be finite"},
      {[](BackwardParams& p) { p.mode = GradMode(7); }, "gradient mode 7 is unknown"},
      {[&](BackwardParams& p) { p.descale.k = pr.dq.data(); },
       "scale factors are not supported by any kernel yet: the descale of k is set; leave the descale of q, k and v "
       "unset (null)"},
  };
  for (const Case& c : cases) {
    BackwardParams p = pr.p;
    c.edit(p);
    const std::string m = message_of(p);
    EXPECT_NE(m.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << m;
  }
  EXPECT_EQ(message_of(pr.p), "(no error)");
}

}  // namespace
}  // namespace ringattn
