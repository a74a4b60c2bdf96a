// Non-finite inputs reach only the gradients that depend on them, on every CUDA backward: a NaN
// or an Inf planted in one row of q, k, v or dout, at a position that other rows or keys of the
// same tiles cannot see (the causal edge, a window's edges, a chunked prefill's offset), must make
// exactly the gradient elements non-finite that the CPU engine's backward makes non-finite (it
// visits visible pairs only, so a masked pair contributes nothing); every other element must be
// finite and match the fp64 oracle of the clean inputs. The tensor-core kernels would leak the
// plant as 0 x NaN through dS K, dS^T Q and P^T dout; the dispatch hands such a call to the exact
// SIMT kernels on the device (launch_nonfinite_scan), which these cases pin for the Hopper
// backward (fused and separate dq, deterministic), the mma.sync one (atomic and deterministic)
// and the SIMT one, in Write and Accumulate. The clean half of each case (no plant, the same
// backend) checks that the gate lets the tensor-core kernels take clean calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/backward_util.hpp"
#include "gpu/gpu_test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cuda/flash_dispatch.hpp"

namespace ringattn {
namespace {

using test::DeviceTensor;
using test::Problem;
using test::Shape;

enum class Plant { None, NanQ, NanK, NanV, NanDout, InfV, InfDout };
const char* plant_name(Plant p) {
  switch (p) {
    case Plant::None: return "none";
    case Plant::NanQ: return "nan_q";
    case Plant::NanK: return "nan_k";
    case Plant::NanV: return "nan_v";
    case Plant::NanDout: return "nan_dout";
    case Plant::InfV: return "inf_v";
    case Plant::InfDout: return "inf_dout";
  }
  return "?";
}
constexpr int kInfDim = 3;  // InfV, InfDout: the column of v or dout that holds +inf

// Each shape's planted row (of q/dout) and key (of k/v) sit inside tiles that other rows or keys
// of the same tiles cannot see.
struct Case {
  const char* name;
  Shape sh;
  int64_t row, key;
};
const Case kCases[] = {
    {"causal", {1, 4, 2, 200, 200, 64, true, 0}, 100, 100},
    {"causal_window", {1, 2, 1, 300, 300, 128, true, 0, 20}, 150, 150},
    {"lower_edge", {2, 4, 2, 260, 260, 64, false, 0, 40}, 130, 100},
    {"chunked_prefill", {1, 8, 2, 77, 300, 128, true, 223}, 30, 260},
};

// Writes the plant into row `at` (batch 0, head 0) of t.
void plant_row(test::HostTensor& t, int64_t at, Plant what) {
  const bool inf = what == Plant::InfV || what == Plant::InfDout;
  const float bad = inf ? std::numeric_limits<float>::infinity() : std::nanf("");
  const int64_t off = t.view.offset(0, 0, at);
  for (int64_t c = 0; c < t.view.dim; ++c)
    if (!inf || c == kInfDim) store_from_float(t.bytes.data(), t.view.dtype, off + c, bad);
}

// The problem with the plant in its inputs and o, lse recomputed by the CPU forward from them.
void plant(Problem& pr, const Case& c, Plant what) {
  if (what == Plant::None) return;
  test::HostTensor& t = what == Plant::NanQ ? pr.q : what == Plant::NanK ? pr.k
                                           : what == Plant::NanDout || what == Plant::InfDout ? pr.dout : pr.v;
  plant_row(t, what == Plant::NanQ || what == Plant::NanDout || what == Plant::InfDout ? c.row : c.key, what);
  FlashParams f;
  f.q = pr.q.view;
  f.k = pr.k.view;
  f.v = pr.v.view;
  f.state = contiguous_state(pr.o_state.data(), pr.lse.data(), c.sh.b, c.sh.hq, c.sh.t, c.sh.d);
  f.scale = pr.p.scale;
  f.mask = pr.p.mask;
  f.out = pr.o.view;
  cpu::flash_forward(f);
  cpu::finalize(FinalizeParams{f.state, f.out});
}

// Element by element: finite exactly where the CPU engine's gradient is finite; over those, within
// the dtype's norm-wise tolerance of the clean fp64 oracle (test::grad_tolerance, doubled: a
// subset of the elements), and no element off by more than a tenth of the largest |oracle|.
// Adds the count of non-finite elements to *bad.
void check_gradient(const char* name, const std::vector<float>& got, const std::vector<float>& engine,
                    const std::vector<double>& oracle, double init, DType dt, int64_t* bad) {
  double scale = 0, err2 = 0, ref2 = 0;
  for (double x : oracle) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < got.size(); ++i) {
    const bool finite = std::isfinite(got[i]);
    *bad += finite ? 0 : 1;
    ASSERT_EQ(finite, std::isfinite(engine[i])) << name << "[" << i << "] = " << got[i] << ", engine " << engine[i];
    if (!finite) continue;
    const double want = init + oracle[i], e = got[i] - want;
    ASSERT_LE(std::abs(e), 0.1 * std::max(scale, 1e-3)) << name << "[" << i << "] = " << got[i] << ", oracle " << want;
    err2 += e * e;
    ref2 += oracle[i] * oracle[i];
  }
  EXPECT_LE(std::sqrt(err2 / std::max(ref2, 1e-30)), 2 * test::grad_tolerance(dt)) << name;
}

struct Config {
  const char* name;
  DType dtype;
  cuda::BackwardKernel kernel;
  cuda::BackwardDq dq;
  bool deterministic;
};

class BackwardNonFinite : public test::GpuTestP<Config> {};

// One plant in one case: the GPU backward (Write, or Accumulate onto `init`), the CPU engine's on
// the same inputs, the oracle on the clean ones.
void run_case(Backend& be, const Config& cfg, const Case& c, Plant what, GradMode mode, std::mt19937_64& rng) {
  SCOPED_TRACE(::testing::Message() << "case " << c.name << " plant " << plant_name(what) << " mode "
                                    << (mode == GradMode::Write ? "write" : "accumulate"));
  Problem pr(c.sh, cfg.dtype, rng);
  pr.p.deterministic = cfg.deterministic;
  const cpu::GradReference oracle = cpu::naive_backward(pr.p);  // clean inputs
  plant(pr, c, what);
  const double init = mode == GradMode::Accumulate ? 0.5 : 0.0;
  // The CPU engine on the planted inputs: which elements must be non-finite.
  Problem engine = pr;
  std::fill(engine.dq.begin(), engine.dq.end(), float(init));
  std::fill(engine.dk.begin(), engine.dk.end(), float(init));
  std::fill(engine.dv.begin(), engine.dv.end(), float(init));
  engine.p.dq.data = engine.dq.data();
  engine.p.dk.data = engine.dk.data();
  engine.p.dv.data = engine.dv.data();
  engine.p.mode = mode;
  cpu::flash_backward(engine.p);

  DeviceTensor q(be, pr.q), k(be, pr.k), v(be, pr.v), o(be, pr.o), dout(be, pr.dout);
  std::vector<float> dq(pr.dq.size(), mode == GradMode::Write ? test::kNaN : float(init));
  std::vector<float> dk(pr.dk.size(), mode == GradMode::Write ? test::kNaN : float(init)), dv = dk;
  DeviceBuffer lse_d(be, pr.lse.size() * 4), dq_d(be, dq.size() * 4), dk_d(be, dk.size() * 4), dv_d(be, dv.size() * 4);
  be.copy_from_host(lse_d.get(), pr.lse.data(), pr.lse.size() * 4);
  be.copy_from_host(dq_d.get(), dq.data(), dq.size() * 4);
  be.copy_from_host(dk_d.get(), dk.data(), dk.size() * 4);
  be.copy_from_host(dv_d.get(), dv.data(), dv.size() * 4);
  BackwardParams p = pr.p;
  p.q = q.view;
  p.k = k.view;
  p.v = v.view;
  p.o = o.view;
  p.dout = dout.view;
  p.lse.data = lse_d.as<float>();
  p.dq.data = dq_d.get();
  p.dk.data = dk_d.get();
  p.dv.data = dv_d.get();
  p.mode = mode;
  be.flash_backward(p);
  be.synchronize();
  be.copy_to_host(dq.data(), dq_d.get(), dq.size() * 4);
  be.copy_to_host(dk.data(), dk_d.get(), dk.size() * 4);
  be.copy_to_host(dv.data(), dv_d.get(), dv.size() * 4);

  int64_t bad = 0;
  check_gradient("dq", dq, engine.dq, oracle.dq, init, cfg.dtype, &bad);
  check_gradient("dk", dk, engine.dk, oracle.dk, init, cfg.dtype, &bad);
  check_gradient("dv", dv, engine.dv, oracle.dv, init, cfg.dtype, &bad);
  if (::testing::Test::HasFatalFailure()) return;
  if (what == Plant::None) EXPECT_EQ(bad, 0);
  else EXPECT_GT(bad, 0) << "the plant reached no gradient";
}

TEST_P(BackwardNonFinite, ReachesOnlyTheGradientsThatDependOnIt) {
  const Config& cfg = GetParam();
  if (cfg.kernel == cuda::BackwardKernel::Hopper && !cuda::query_device(0).hopper_image)
    GTEST_SKIP() << "the Hopper backward needs an sm_90 GPU with the sm_90a image";
  cuda::FlashKernelOptions options = cuda::flash_options(settings().kernels());
  options.backward_kernel = cfg.kernel;
  options.backward_dq = cfg.dq;
  be = make_cuda_backend(0, options);
  const cuda::DeviceCaps caps = cuda::query_device(0);
  std::mt19937_64 rng(test::fresh_seed());
  for (const Case& c : kCases) {
    {  // the kernel under test takes the case (no silent fallback in the test itself)
      Problem probe(c.sh, cfg.dtype, rng);
      probe.p.deterministic = cfg.deterministic;
      const cuda::BackwardChoice choice = cuda::choose_backward_kernel(caps, probe.p, options);
      const cuda::BackwardPath want = cfg.kernel == cuda::BackwardKernel::Hopper ? cuda::BackwardPath::Hopper
                                      : cfg.kernel == cuda::BackwardKernel::Mma  ? cuda::BackwardPath::Mma
                                                                                 : cuda::BackwardPath::Simt;
      ASSERT_EQ(int(choice.path), int(want)) << c.name << ": " << choice.reason;
    }
    for (Plant what :
         {Plant::None, Plant::NanQ, Plant::NanK, Plant::NanV, Plant::NanDout, Plant::InfV, Plant::InfDout})
      for (GradMode mode : {GradMode::Write, GradMode::Accumulate}) {
        run_case(*be, cfg, c, what, mode, rng);
        if (HasFailure()) return;
      }
  }
}

using cuda::BackwardDq;
using cuda::BackwardKernel;
INSTANTIATE_TEST_SUITE_P(
    Kernels, BackwardNonFinite,
    ::testing::Values(Config{"hopper_fused_bf16", DType::BF16, BackwardKernel::Hopper, BackwardDq::Atomic, false},
                      Config{"hopper_separate_f16", DType::F16, BackwardKernel::Hopper, BackwardDq::Separate, false},
                      Config{"hopper_deterministic_bf16", DType::BF16, BackwardKernel::Hopper, BackwardDq::Auto, true},
                      Config{"mma_atomic_bf16", DType::BF16, BackwardKernel::Mma, BackwardDq::Atomic, false},
                      Config{"mma_deterministic_f16", DType::F16, BackwardKernel::Mma, BackwardDq::Auto, true},
                      Config{"simt_bf16", DType::BF16, BackwardKernel::Simt, BackwardDq::Auto, false},
                      Config{"simt_f32", DType::F32, BackwardKernel::Simt, BackwardDq::Auto, true}),
    [](const ::testing::TestParamInfo<Config>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ringattn
