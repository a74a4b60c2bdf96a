// The CUDA flash backward against the fp64 gradient oracle (cpu::naive_backward), through both
// backward kernels (the tensor-core one, bf16/fp16 at head dims 64 and 128, and the SIMT one, every
// dtype), forced by FlashKernelOptions::backward_kernel: bf16, fp16 and fp32 inputs, causal (with
// positive and negative offsets, including rows that see no key) and full, sliding windows
// (causal and the lower edge alone), GQA 1/4/8, lengths around the 64-row/64-key tiles (1, 63, 64,
// 65, 77, 200, 333), head dims 64 and 128 (and small ones), Write and Accumulate, the fast (atomic
// dq) and the deterministic mode, bitwise reproducibility of the deterministic mode, [B, T, H, D]
// strided inputs. The forward's output and lse come from the CPU engine (the fp64 oracle for
// windowed masks), so that only the backward is under test. The dispatch's choice of kernel is
// checked without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/backward_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cuda/flash_dispatch.hpp"
#include "core/error.hpp"
#include "core/settings.hpp"
#include "gpu/gpu_test_util.hpp"

namespace ringattn {
namespace {

using test::DeviceTensor;
using test::Problem;
using test::Shape;

// A device copy of an fp32 host vector (gradients, lse).
struct DeviceFloats {
  DeviceBuffer buf;
  DeviceFloats(Backend& be, const std::vector<float>& h) : buf(be, h.size() * 4) {
    be.copy_from_host(buf.get(), h.data(), h.size() * 4);
  }
  void read(Backend& be, std::vector<float>& h) const {
    be.synchronize();
    be.copy_to_host(h.data(), buf.get(), h.size() * 4);
  }
};

// The problem's tensors on the device and the BackwardParams over them.
struct DeviceProblem {
  DeviceTensor q, k, v, o, dout;
  DeviceFloats lse, dq, dk, dv;
  BackwardParams p;
  DeviceProblem(Backend& be, const Problem& h)
      : q(be, h.q), k(be, h.k), v(be, h.v), o(be, h.o), dout(be, h.dout), lse(be, h.lse), dq(be, h.dq), dk(be, h.dk),
        dv(be, h.dv) {
    p = h.p;
    p.q = q.view;
    p.k = k.view;
    p.v = v.view;
    p.o = o.view;
    p.dout = dout.view;
    p.lse.data = lse.buf.as<float>();
    p.dq.data = dq.buf.get();
    p.dk.data = dk.buf.get();
    p.dv.data = dv.buf.get();
  }
  // Runs the backward and reads the gradients into the host problem's vectors.
  void run(Backend& be, Problem& h) {
    be.flash_backward(p);
    dq.read(be, h.dq);
    dk.read(be, h.dk);
    dv.read(be, h.dv);
  }
};

const Shape kShapes[] = {
    {1, 2, 2, 200, 200, 0, true, 0},     // prefill, GQA 1
    {2, 8, 2, 130, 333, 0, false, 0},    // full, GQA 4, q_len != kv_len
    {1, 8, 1, 77, 300, 0, true, 223},    // chunked prefill, GQA 8
    {2, 8, 1, 1, 1000, 0, true, 999},    // decode
    {1, 8, 2, 70, 90, 0, true, -10},     // rows that see no key
    {1, 4, 4, 63, 63, 0, true, 0},       // one partial tile each way
    {2, 8, 1, 65, 65, 0, true, 0},       // 64 + 1: a tile of one row and one key, GQA 8
    {1, 8, 2, 64, 128, 0, true, 64},     // tile-aligned: full tiles beside the diagonal ones
    {1, 4, 1, 333, 200, 0, true, -133},  // negative offset: rows 0..132 see no key (two whole tiles)
    {1, 4, 2, 1, 63, 0, false, 0},       // one query row
    {1, 2, 1, 129, 1, 0, false, 0},      // one key
};

// Sliding windows: a shape and the window (MaskSpec::window) on its mask. Windows of 0, 1 and odd
// sizes, below and above the SIMT key kernel's 16 keys and the 64-row query tiles, with causal
// offsets (rows that see no key included), and the lower edge alone.
struct WindowShape {
  Shape sh;
  int64_t window;
};
const WindowShape kWindowShapes[] = {
    {{1, 2, 2, 200, 200, 0, true, 0}, 0},      // the diagonal alone
    {{1, 4, 1, 131, 131, 0, true, 0}, 1},      // GQA 4
    {{2, 8, 2, 257, 257, 0, true, 0}, 37},     // GQA 4, odd lengths
    {{1, 8, 1, 77, 300, 0, true, 223}, 100},   // chunked prefill, GQA 8
    {{1, 2, 2, 300, 333, 0, true, 33}, 150},   // window over several query tiles
    {{1, 8, 2, 70, 90, 0, true, -10}, 5},      // rows 0..9 see no key
    {{2, 4, 2, 130, 333, 0, false, 100}, 50},  // the lower edge alone
    {{1, 4, 4, 150, 200, 0, false, 100}, 20},  // the lower edge alone, rows 120.. see no key
    {{1, 4, 1, 200, 200, 0, true, 0}, 64},     // a window of one tile
};

// The forward of h under the window: o (in h's dtype) and lse from the fp64 oracle instead of the
// CPU engine, and the window on the backward's mask.
void window_forward(Problem& h, int64_t window) {
  h.p.mask.window = window;
  FlashParams f;
  f.q = h.q.view;
  f.k = h.k.view;
  f.v = h.v.view;
  f.scale = h.p.scale;
  f.mask = h.p.mask;
  const cpu::Reference ref = cpu::naive_attention(f);
  const TensorView& o = h.o.view;  // ref.o is contiguous [B, Hq, T, D]
  for (int64_t b = 0, r = 0; b < o.batch; ++b)
    for (int64_t hq = 0; hq < o.heads; ++hq)
      for (int64_t t = 0; t < o.len; ++t, ++r) {
        for (int64_t d = 0; d < o.dim; ++d)
          store_from_float(h.o.bytes.data(), o.dtype, o.offset(b, hq, t) + d, float(ref.o[size_t(r * o.dim + d)]));
        h.lse[size_t(r)] = float(ref.lse[size_t(r)]);
      }
}

using cuda::BackwardKernel;

// A backend whose backward runs `kernel`, the other options from the environment. atomic_dq: the
// tensor-core backwards' fast mode with dq by reductions from the key kernel
// (RINGATTN_BACKWARD_DQ=atomic: the Hopper kernels' bulk reduce-adds, the mma.sync
// kernel's atomics); else the query kernel, which the deterministic cases run too.
std::unique_ptr<Backend> backend_with(BackwardKernel kernel, bool atomic_dq = false) {
  cuda::FlashKernelOptions options = cuda::flash_options(settings().kernels());
  options.backward_kernel = kernel;
  options.backward_dq = atomic_dq ? cuda::BackwardDq::Atomic : cuda::BackwardDq::Separate;
  return make_cuda_backend(0, options);
}

// The path the dispatch takes for p under `kernel` on GPU 0: the tests must exercise the kernel
// they name, not fall back silently.
cuda::BackwardChoice choice_on_device0(const BackwardParams& p, BackwardKernel kernel, bool atomic_dq = false) {
  static const cuda::DeviceCaps caps = cuda::query_device(0);
  cuda::FlashKernelOptions options;
  options.backward_kernel = kernel;
  options.backward_dq = atomic_dq ? cuda::BackwardDq::Atomic : cuda::BackwardDq::Auto;
  return cuda::choose_backward_kernel(caps, p, options);
}
cuda::BackwardPath path_on_device0(const BackwardParams& p, BackwardKernel kernel) {
  return choice_on_device0(p, kernel).path;
}
cuda::BackwardPath expected_path(BackwardKernel kernel) {
  switch (kernel) {
    case BackwardKernel::Hopper: return cuda::BackwardPath::Hopper;
    case BackwardKernel::Mma: return cuda::BackwardPath::Mma;
    default: return cuda::BackwardPath::Simt;
  }
}
// The Hopper kernels exist only where the sm_90a image runs.
bool hopper_on_device0() {
  static const bool has = cuda::query_device(0).hopper_image;
  return has;
}

// (dtype, head dim, deterministic, backward kernel)
using Params = std::tuple<DType, int, bool, BackwardKernel>;
class BackwardVsOracle : public test::GpuTestP<Params> {
 protected:
  void SetUp() override {
    test::GpuTestP<Params>::SetUp();
    if (be && std::get<3>(GetParam()) == BackwardKernel::Hopper && !hopper_on_device0())
      GTEST_SKIP() << "the Hopper backward needs an sm_90 GPU with the sm_90a image";
    // The fast cases keep the atomic dq of the tensor-core backward under test; the deterministic
    // ones run the separate dq kernel, the default fast path too.
    if (be) be = backend_with(std::get<3>(GetParam()), !std::get<2>(GetParam()));
  }
};

// Runs the backward of sh (with `window` on its mask when >= 0) in both gradient modes on fresh
// random inputs (Write into NaN-poisoned gradients) and checks the gradients against the fp64
// oracle.
void check_backward(Backend& be, const Shape& sh, int64_t window, DType dtype, bool deterministic,
                    BackwardKernel kernel, std::mt19937_64& rng, uint64_t seed, bool bthd = false) {
  for (GradMode mode : {GradMode::Write, GradMode::Accumulate}) {
    Problem h(sh, dtype, rng, bthd);
    if (window >= 0) window_forward(h, window);
    h.p.deterministic = deterministic;
    h.p.mode = mode;
    std::vector<float> dq0, dk0, dv0;
    if (mode == GradMode::Accumulate) {  // start from random gradients, not from the poison
      std::normal_distribution<float> n(0.f, 1.f);
      for (auto* g : {&h.dq, &h.dk, &h.dv})
        for (float& x : *g) x = n(rng);
      dq0 = h.dq, dk0 = h.dk, dv0 = h.dv;
    }
    DeviceProblem d(be, h);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << dtype_name(dtype) << " " << test::describe(sh)
                                      << " window " << window << (deterministic ? " deterministic" : " fast")
                                      << (mode == GradMode::Write ? " write" : " accumulate") << " kernel "
                                      << cuda::backward_kernel_name(kernel) << (bthd ? " bthd" : ""));
    ASSERT_EQ(path_on_device0(d.p, kernel), expected_path(kernel));
    // The fast cases run the atomic dq: on the Hopper kernels that is the key kernel's
    // reduce-adds at both head dims (the consumers take turns at 64), also their default (auto).
    if (kernel == BackwardKernel::Hopper) {
      EXPECT_EQ(choice_on_device0(d.p, kernel, !deterministic).atomic_dq, !deterministic);
      EXPECT_EQ(choice_on_device0(d.p, kernel).atomic_dq, !deterministic);
    }
    d.run(be, h);
    cpu::GradReference ref = cpu::naive_backward(h.p);
    for (size_t i = 0; i < dq0.size(); ++i) ref.dq[i] += dq0[i];
    for (size_t i = 0; i < dk0.size(); ++i) ref.dk[i] += dk0[i], ref.dv[i] += dv0[i];
    const test::Errors e = test::errors_of(h, ref);
    EXPECT_LT(e.dq, test::grad_tolerance(dtype));
    EXPECT_LT(e.dk, test::grad_tolerance(dtype));
    EXPECT_LT(e.dv, test::grad_tolerance(dtype));
  }
}

TEST_P(BackwardVsOracle, MatchesFp64Reference) {
  const auto [dtype, dim, deterministic, kernel] = GetParam();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (Shape sh : kShapes) {
    sh.d = dim;
    check_backward(*be, sh, -1, dtype, deterministic, kernel, rng, seed);
  }
}

TEST_P(BackwardVsOracle, SlidingWindowMatchesFp64Reference) {
  const auto [dtype, dim, deterministic, kernel] = GetParam();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (WindowShape ws : kWindowShapes) {
    ws.sh.d = dim;
    check_backward(*be, ws.sh, ws.window, dtype, deterministic, kernel, rng, seed);
  }
}

// q, k, v, dout and o as [B, T, H, D] memory (strided views), batch > 1, causal and windowed.
TEST_P(BackwardVsOracle, StridedInputsMatchFp64Reference) {
  const auto [dtype, dim, deterministic, kernel] = GetParam();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  check_backward(*be, {2, 8, 2, 150, 150, dim, true, 0}, -1, dtype, deterministic, kernel, rng, seed, true);
  check_backward(*be, {3, 4, 1, 97, 200, dim, false, 0}, -1, dtype, deterministic, kernel, rng, seed, true);
  check_backward(*be, {2, 4, 4, 130, 130, dim, true, 0}, 40, dtype, deterministic, kernel, rng, seed, true);
}

// Every (dtype, head dim, mode) through the SIMT kernels, and the bf16/fp16 ones through the
// tensor-core kernels too, mma.sync and Hopper (fp32 has none).
std::vector<Params> backward_params() {
  std::vector<Params> v;
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (int dim : {64, 128})
      for (bool det : {false, true})
        for (BackwardKernel k : {BackwardKernel::Hopper, BackwardKernel::Mma, BackwardKernel::Simt})
          if (dt != DType::F32 || k == BackwardKernel::Simt) v.emplace_back(dt, dim, det, k);
  return v;
}

std::string params_name(const ::testing::TestParamInfo<Params>& info) {
  const auto [dt, dim, det, k] = info.param;
  return std::string(dtype_name(dt)) + "_d" + std::to_string(dim) + (det ? "_det_" : "_fast_") +
         cuda::backward_kernel_name(k);
}

INSTANTIATE_TEST_SUITE_P(Kernels, BackwardVsOracle, ::testing::ValuesIn(backward_params()), params_name);

class CudaBackward : public test::GpuTest {};

TEST_F(CudaBackward, SmallAndOddHeadDims) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int64_t dim : {8, 24, 80}) {
    Problem h({1, 4, 1, 77, 77, dim, true, 0}, DType::F32, rng);
    DeviceProblem d(*be, h);
    d.run(*be, h);
    const test::Errors e = test::errors_of(h, cpu::naive_backward(h.p));
    EXPECT_LT(e.dq, test::grad_tolerance(DType::F32)) << "seed " << seed << " dim " << dim;
    EXPECT_LT(e.dk, test::grad_tolerance(DType::F32)) << "seed " << seed << " dim " << dim;
    EXPECT_LT(e.dv, test::grad_tolerance(DType::F32)) << "seed " << seed << " dim " << dim;
  }
}

// bf16 at a head dim without a tensor-core kernel: the dispatch (Auto) runs the SIMT kernels.
TEST_F(CudaBackward, HalfInputsAtOtherHeadDimsRunOnSimt) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  Problem h({1, 4, 2, 77, 90, 80, true, 13}, DType::BF16, rng);
  DeviceProblem d(*be, h);
  EXPECT_EQ(path_on_device0(d.p, BackwardKernel::Auto), cuda::BackwardPath::Simt);
  d.run(*be, h);
  const test::Errors e = test::errors_of(h, cpu::naive_backward(h.p));
  EXPECT_LT(e.dq, test::grad_tolerance(DType::BF16)) << "seed " << seed;
  EXPECT_LT(e.dk, test::grad_tolerance(DType::BF16)) << "seed " << seed;
  EXPECT_LT(e.dv, test::grad_tolerance(DType::BF16)) << "seed " << seed;
}

// Deterministic mode: the same bits on every run, through either kernel, with GQA, odd lengths, a
// causal edge and a window (the causal problem's tiles are handed out in a different order from
// run to run, and the fast mode's atomics would differ).
TEST_F(CudaBackward, DeterministicModeIsBitwiseReproducible) {
  std::mt19937_64 rng(test::fresh_seed());
  struct Case {
    DType dt;
    BackwardKernel kernel;
    int64_t d, window;
  };
  const Case cases[] = {{DType::BF16, BackwardKernel::Hopper, 128, -1}, {DType::F16, BackwardKernel::Hopper, 64, 50},
                        {DType::BF16, BackwardKernel::Mma, 128, -1}, {DType::F16, BackwardKernel::Mma, 64, 50},
                        {DType::BF16, BackwardKernel::Simt, 128, -1}, {DType::F32, BackwardKernel::Simt, 128, -1}};
  for (const Case& c : cases) {
    if (c.kernel == BackwardKernel::Hopper && !hopper_on_device0()) continue;
    const std::unique_ptr<Backend> kb = backend_with(c.kernel);
    Problem h({2, 8, 2, 333, 333, c.d, true, 0}, c.dt, rng);
    if (c.window >= 0) window_forward(h, c.window);
    h.p.deterministic = true;
    DeviceProblem d(*kb, h);
    ASSERT_EQ(path_on_device0(d.p, c.kernel), expected_path(c.kernel));
    d.run(*kb, h);
    const std::vector<float> dq = h.dq, dk = h.dk, dv = h.dv;
    const std::string what = std::string(dtype_name(c.dt)) + " " + cuda::backward_kernel_name(c.kernel);
    for (int rep = 0; rep < 3; ++rep) {
      d.run(*kb, h);
      EXPECT_EQ(std::memcmp(dq.data(), h.dq.data(), dq.size() * 4), 0) << what << " rep " << rep;
      EXPECT_EQ(std::memcmp(dk.data(), h.dk.data(), dk.size() * 4), 0) << what << " rep " << rep;
      EXPECT_EQ(std::memcmp(dv.data(), h.dv.data(), dv.size() * 4), 0) << what << " rep " << rep;
    }
  }
}

TEST_F(CudaBackward, RefusesHeadDimsWithoutAKernel) {
  std::mt19937_64 rng(test::fresh_seed());
  Problem h({1, 1, 1, 4, 4, 264, false, 0}, DType::F32, rng);
  DeviceProblem d(*be, h);
  try {
    be->flash_backward(d.p);
    ADD_FAILURE() << "head_dim 264 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim=264 is not supported by the CUDA backward: allowed are 1..256"),
              std::string::npos)
        << e.what();
  }
}

// ---- the dispatch alone (no GPU needed: a made-up device and unread pointers) ----

BackwardParams fake_backward(DType dt, int64_t d, int64_t t = 100, int64_t s = 100) {
  alignas(16) static char mem[64];
  BackwardParams p;
  for (TensorView* x : {&p.q, &p.o, &p.dout}) *x = bhtd_view(mem, dt, 1, 8, t, d);
  for (TensorView* x : {&p.k, &p.v}) *x = bhtd_view(mem, dt, 1, 2, s, d);
  p.dq = bhtd_view(mem, DType::F32, 1, 8, t, d);
  p.dk = bhtd_view(mem + 16, DType::F32, 1, 2, s, d);
  p.dv = bhtd_view(mem + 32, DType::F32, 1, 2, s, d);
  p.lse = contiguous_lse(reinterpret_cast<float*>(mem), 1, 8, t);
  p.scale = 0.1f;
  return p;
}

cuda::BackwardChoice choose(const BackwardParams& p, BackwardKernel kernel, int cc_major = 9,
                            int smem_optin = 232448 /* an H100/H200's 227 KiB */, bool atomic_dq = false) {
  cuda::DeviceCaps dev;
  dev.device = 0, dev.cc_major = cc_major, dev.cc_minor = 0, dev.sms = 132;
  dev.smem_optin = smem_optin;
  cuda::FlashKernelOptions o;
  o.backward_kernel = kernel;
  o.backward_dq = atomic_dq ? cuda::BackwardDq::Atomic : cuda::BackwardDq::Auto;
  return cuda::choose_backward_kernel(dev, p, o);
}

TEST(BackwardDispatch, PicksTheTensorCoreKernelWhereItApplies) {
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t d : {64, 128}) {
      BackwardParams p = fake_backward(dt, d);
      EXPECT_EQ(choose(p, BackwardKernel::Auto).path, cuda::BackwardPath::Mma);
      EXPECT_FALSE(choose(p, BackwardKernel::Auto).atomic_dq);  // the separate dq kernel: faster
      EXPECT_TRUE(choose(p, BackwardKernel::Auto, 9, 232448, true).atomic_dq);
      EXPECT_TRUE(choose(p, BackwardKernel::Simt).atomic_dq);  // the SIMT kernels keep their atomics
      EXPECT_EQ(choose(p, BackwardKernel::Auto, 8, 166912).path, cuda::BackwardPath::Mma);  // an A100: sm_80 only
      EXPECT_EQ(choose(p, BackwardKernel::Simt).path, cuda::BackwardPath::Simt);
      p.deterministic = true;
      EXPECT_EQ(choose(p, BackwardKernel::Mma).path, cuda::BackwardPath::Mma);
      EXPECT_FALSE(choose(p, BackwardKernel::Mma).atomic_dq);
    }
}

// A made-up sm_90 device has no sm_90a image loaded: Auto goes on to the mma.sync kernel, and
// forcing the Hopper kernels says why they cannot run.
TEST(BackwardDispatch, HopperNeedsTheSm90aImage) {
  const BackwardParams p = fake_backward(DType::BF16, 128);
  EXPECT_EQ(choose(p, BackwardKernel::Auto).path, cuda::BackwardPath::Mma);
  const cuda::BackwardChoice forced = choose(p, BackwardKernel::Hopper);
  EXPECT_EQ(forced.path, cuda::BackwardPath::None);
  EXPECT_NE(forced.reason.find("RINGATTN_BACKWARD_KERNEL=hopper, but the Hopper backward does not take this call on "
                               "GPU 0 (dtype bf16, head_dim 128): the Hopper backward runs only on compute capability "
                               "9.0 with the sm_90a image loaded; GPU 0 is 9.0"),
            std::string::npos)
      << forced.reason;
}

TEST(BackwardDispatch, FallsBackToSimtOrExplainsWhenForced) {
  struct Case {
    BackwardParams p;
    int cc_major;
    const char* why;
    int smem_optin = 232448;
    bool atomic_dq = false;
  };
  BackwardParams misaligned = fake_backward(DType::BF16, 128);
  misaligned.dout.stride_t = 129;  // a row stride cp.async cannot follow
  BackwardParams long_keys = fake_backward(DType::BF16, 64, 100, 64 * 65536);
  const Case cases[] = {
      {fake_backward(DType::F32, 128), 9, "takes bf16 and fp16 inputs, not fp32"},
      {fake_backward(DType::BF16, 80), 9, "head_dim=80 is not supported by the CUDA bf16 kernels"},
      {fake_backward(DType::F16, 64), 7, "needs compute capability 8.0 or later"},
      {misaligned, 9, "dout strides"},
      {long_keys, 9, "key blocks ceil(kv_len / 64) = 65536 exceeds the CUDA grid limit"},
      // An sm_86/sm_89 GPU's 99 KiB per block: too little for head dim 128 with the atomic dq's
      // dS tile (the default separate dq kernel fits: below).
      {fake_backward(DType::BF16, 128), 8, "needs 107520 bytes of shared memory per block; GPU 0 allows 101376",
       101376, true},
  };
  EXPECT_EQ(choose(fake_backward(DType::BF16, 128), BackwardKernel::Auto, 8, 101376).path, cuda::BackwardPath::Mma);
  for (const Case& c : cases) {
    EXPECT_EQ(choose(c.p, BackwardKernel::Auto, c.cc_major, c.smem_optin, c.atomic_dq).path, cuda::BackwardPath::Simt)
        << c.why;
    const cuda::BackwardChoice forced = choose(c.p, BackwardKernel::Mma, c.cc_major, c.smem_optin, c.atomic_dq);
    EXPECT_EQ(forced.path, cuda::BackwardPath::None) << c.why;
    EXPECT_NE(forced.reason.find("RINGATTN_BACKWARD_KERNEL=mma"), std::string::npos) << forced.reason;
    EXPECT_NE(forced.reason.find(c.why), std::string::npos) << forced.reason;
  }
  // The reasons for no kernel at all stay the SIMT path's, whatever the option.
  for (BackwardKernel k : {BackwardKernel::Auto, BackwardKernel::Mma, BackwardKernel::Simt}) {
    const cuda::BackwardChoice c = choose(fake_backward(DType::F32, 264), k);
    EXPECT_EQ(c.path, cuda::BackwardPath::None);
    EXPECT_NE(c.reason.find("head_dim=264 is not supported by the CUDA backward: allowed are 1..256"),
              std::string::npos)
        << c.reason;
  }
}

// The variables' parsing has its unit tests (tests/unit/test_settings.cpp, on CPU); here: every
// Hopper tile the plan knows (hopper_tile_name) is a name RINGATTN_HOPPER_TILE takes, and
// flash_options carries every kernel choice over.
TEST(BackwardDispatch, EveryHopperTileIsANameOfTheTileVariable) {
  const cuda::HopperTile tiles[] = {cuda::HopperTile::M128N128,   cuda::HopperTile::M128N176,
                                    cuda::HopperTile::M192N128,   cuda::HopperTile::M128N128Q2,
                                    cuda::HopperTile::M128N80,    cuda::HopperTile::M128N176C2,
                                    cuda::HopperTile::M128N128C2};
  ASSERT_EQ(std::size(tiles), std::size(kHopperTileNames));
  for (const cuda::HopperTile t : tiles) {
    const std::string name = cuda::hopper_tile_name(t);
    const Settings s = parse_settings([&](const char* var) {
      return std::string(var) == "RINGATTN_HOPPER_TILE" ? name.c_str() : nullptr;
    });
    EXPECT_EQ(cuda::flash_options(s.kernels()).hopper_tile, name);
  }
}

TEST(BackwardDispatch, FlashOptionsTakeEveryKernelChoice) {
  KernelChoices k;
  k.flash = FlashKernel::Portable;
  k.backward = BackwardKernel::Mma;
  k.backward_dq = BackwardDq::Atomic;
  k.hopper_tile = "128x176";
  k.hopper_lazy = false;
  const cuda::FlashKernelOptions o = cuda::flash_options(k);
  EXPECT_EQ(o.kernel, FlashKernel::Portable);
  EXPECT_EQ(o.backward_kernel, BackwardKernel::Mma);
  EXPECT_EQ(o.backward_dq, BackwardDq::Atomic);
  EXPECT_EQ(o.hopper_tile, "128x176");
  EXPECT_FALSE(o.hopper_lazy);
  EXPECT_EQ(o.mma_variant, 0);
}

}  // namespace
}  // namespace ringattn
