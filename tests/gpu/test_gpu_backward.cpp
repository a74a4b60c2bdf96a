// The CUDA flash backward against the fp64 gradient oracle (cpu::naive_backward): bf16, fp16 and
// fp32 inputs, causal (with offsets, including rows that see no key) and full, sliding windows
// (causal and the lower edge alone), GQA 1/4/8, odd lengths, head dims 64 and 128 (and a small
// one), Write and Accumulate, the fast (atomic dq) and the deterministic mode, and bitwise
// reproducibility of the deterministic mode. The forward's output and lse come from the CPU
// engine (the fp64 oracle for windowed masks), so that only the backward is under test.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <tuple>

#include "common/backward_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "core/error.hpp"
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
};

// Sliding windows: a shape and the window (MaskSpec::window) on its mask. Windows of 0, 1 and odd
// sizes, below and above the key kernel's 16 keys and its 64-row query tiles, with causal
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

// (dtype, head dim, deterministic)
class BackwardVsOracle : public test::GpuTestP<std::tuple<DType, int, bool>> {};

// Runs the backward of sh (with `window` on its mask when >= 0) in both gradient modes on fresh
// random inputs (Write into NaN-poisoned gradients) and checks the gradients against the fp64
// oracle.
void check_backward(Backend& be, const Shape& sh, int64_t window, DType dtype, bool deterministic,
                    std::mt19937_64& rng, uint64_t seed) {
  for (GradMode mode : {GradMode::Write, GradMode::Accumulate}) {
    Problem h(sh, dtype, rng);
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
    d.run(be, h);
    cpu::GradReference ref = cpu::naive_backward(h.p);
    for (size_t i = 0; i < dq0.size(); ++i) ref.dq[i] += dq0[i];
    for (size_t i = 0; i < dk0.size(); ++i) ref.dk[i] += dk0[i], ref.dv[i] += dv0[i];
    const test::Errors e = test::errors_of(h, ref);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << dtype_name(dtype) << " " << test::describe(sh)
                                      << " window " << window << (deterministic ? " deterministic" : " fast")
                                      << (mode == GradMode::Write ? " write" : " accumulate"));
    EXPECT_LT(e.dq, test::grad_tolerance(dtype));
    EXPECT_LT(e.dk, test::grad_tolerance(dtype));
    EXPECT_LT(e.dv, test::grad_tolerance(dtype));
  }
}

TEST_P(BackwardVsOracle, MatchesFp64Reference) {
  const auto [dtype, dim, deterministic] = GetParam();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (Shape sh : kShapes) {
    sh.d = dim;
    check_backward(*be, sh, -1, dtype, deterministic, rng, seed);
  }
}

TEST_P(BackwardVsOracle, SlidingWindowMatchesFp64Reference) {
  const auto [dtype, dim, deterministic] = GetParam();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (WindowShape ws : kWindowShapes) {
    ws.sh.d = dim;
    check_backward(*be, ws.sh, ws.window, dtype, deterministic, rng, seed);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BackwardVsOracle,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F16, DType::F32),
                                            ::testing::Values(64, 128), ::testing::Bool()));

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

TEST_F(CudaBackward, DeterministicModeIsBitwiseReproducible) {
  std::mt19937_64 rng(test::fresh_seed());
  for (DType dt : {DType::BF16, DType::F32}) {
    Problem h({2, 8, 2, 333, 333, 128, true, 0}, dt, rng);
    h.p.deterministic = true;
    DeviceProblem d(*be, h);
    d.run(*be, h);
    const std::vector<float> dq = h.dq, dk = h.dk, dv = h.dv;
    for (int rep = 0; rep < 3; ++rep) {
      d.run(*be, h);
      EXPECT_EQ(std::memcmp(dq.data(), h.dq.data(), dq.size() * 4), 0) << dtype_name(dt) << " rep " << rep;
      EXPECT_EQ(std::memcmp(dk.data(), h.dk.data(), dk.size() * 4), 0) << dtype_name(dt) << " rep " << rep;
      EXPECT_EQ(std::memcmp(dv.data(), h.dv.data(), dv.size() * 4), 0) << dtype_name(dt) << " rep " << rep;
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

}  // namespace
}  // namespace ringattn
