// The CUDA flash backward against the fp64 gradient oracle (cpu::naive_backward): bf16, fp16 and
// fp32 inputs, causal (with offsets, including rows that see no key) and full, GQA 1/4/8, odd
// lengths, head dims 64 and 128 (and a small one), Write and Accumulate, the fast (atomic dq)
// and the deterministic mode, and bitwise reproducibility of the deterministic mode. The forward's
// output and lse come from the CPU engine, so that only the backward is under test.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <tuple>

#include "common/backward_util.hpp"
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

// (dtype, head dim, deterministic)
class BackwardVsOracle : public test::GpuTestP<std::tuple<DType, int, bool>> {};

TEST_P(BackwardVsOracle, MatchesFp64Reference) {
  const auto [dtype, dim, deterministic] = GetParam();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (Shape sh : kShapes) {
    sh.d = dim;
    for (GradMode mode : {GradMode::Write, GradMode::Accumulate}) {
      Problem h(sh, dtype, rng);
      h.p.deterministic = deterministic;
      h.p.mode = mode;
      std::vector<float> dq0, dk0, dv0;
      if (mode == GradMode::Accumulate) {  // start from random gradients, not from the poison
        std::normal_distribution<float> n(0.f, 1.f);
        for (auto* g : {&h.dq, &h.dk, &h.dv})
          for (float& x : *g) x = n(rng);
        dq0 = h.dq, dk0 = h.dk, dv0 = h.dv;
      }
      DeviceProblem d(*be, h);
      d.run(*be, h);
      cpu::GradReference ref = cpu::naive_backward(h.p);
      for (size_t i = 0; i < dq0.size(); ++i) ref.dq[i] += dq0[i];
      for (size_t i = 0; i < dk0.size(); ++i) ref.dk[i] += dk0[i], ref.dv[i] += dv0[i];
      const test::Errors e = test::errors_of(h, ref);
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << dtype_name(dtype) << " " << test::describe(sh)
                                        << (deterministic ? " deterministic" : " fast")
                                        << (mode == GradMode::Write ? " write" : " accumulate"));
      EXPECT_LT(e.dq, test::grad_tolerance(dtype));
      EXPECT_LT(e.dk, test::grad_tolerance(dtype));
      EXPECT_LT(e.dv, test::grad_tolerance(dtype));
    }
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
