// The backward tests' problem (CPU and GPU): fresh random inputs, the forward's output and lse
// from the CPU engine, NaN-poisoned fp32 gradients, and the per-dtype tolerance against the fp64
// oracle.
#pragma once

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

namespace ringattn::test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Shape {
  int64_t b, hq, hkv, t, s, d;
  bool causal;
  int64_t q_offset;
  int64_t window = -1;  // MaskSpec::window: the lower edge (-1: none)
};

inline std::string describe(const Shape& sh) {
  return "b=" + std::to_string(sh.b) + " hq=" + std::to_string(sh.hq) + " hkv=" + std::to_string(sh.hkv) +
         " t=" + std::to_string(sh.t) + " s=" + std::to_string(sh.s) + " d=" + std::to_string(sh.d) +
         (sh.causal ? " causal q_offset=" + std::to_string(sh.q_offset) : " full") +
         (sh.window >= 0 ? " window=" + std::to_string(sh.window) + " (offset " + std::to_string(sh.q_offset) + ")" : "");
}

// One backward problem on the host: inputs, the forward's output (in the input dtype) and lse
// from the CPU forward, and fp32 gradient buffers poisoned with NaN. bthd: q, k, v, dout and o are
// [B, T, H, D] memory seen as strided [B, H, T, D] views (the gradients stay contiguous).
struct Problem {
  HostTensor q, k, v, dout, o;
  std::vector<float> lse, o_state, dq, dk, dv;
  BackwardParams p;

  // q, k and v are N(0, input_scale^2) (a power of two keeps the draws exact in every dtype).
  Problem(const Shape& sh, DType dt, std::mt19937_64& rng, bool bthd = false, float input_scale = 1.f)
      : q(dt, sh.b, sh.hq, sh.t, sh.d, rng, bthd), k(dt, sh.b, sh.hkv, sh.s, sh.d, rng, bthd),
        v(dt, sh.b, sh.hkv, sh.s, sh.d, rng, bthd), dout(dt, sh.b, sh.hq, sh.t, sh.d, rng, bthd),
        o(dt, sh.b, sh.hq, sh.t, sh.d, rng, bthd),
        lse(size_t(sh.b * sh.hq * sh.t)), o_state(size_t(sh.b * sh.hq * sh.t * sh.d)),
        dq(o_state.size(), kNaN), dk(size_t(sh.b * sh.hkv * sh.s * sh.d), kNaN), dv(dk.size(), kNaN) {
    for (HostTensor* x : {&q, &k, &v})
      for (int64_t i = 0; i < x->view.numel(); ++i)
        store_from_float(x->bytes.data(), dt, i, load_as_float(x->bytes.data(), dt, i) * input_scale);
    FlashParams f;
    f.q = q.view;
    f.k = k.view;
    f.v = v.view;
    f.state = contiguous_state(o_state.data(), lse.data(), sh.b, sh.hq, sh.t, sh.d);
    f.scale = 1.f / std::sqrt(float(sh.d));
    f.mask = MaskSpec{sh.causal, sh.q_offset, sh.window};
    f.out = o.view;  // the output in the input dtype, as a training framework keeps it
    cpu::flash_forward(f);
    cpu::finalize(FinalizeParams{f.state, f.out});
    p.q = q.view;
    p.k = k.view;
    p.v = v.view;
    p.o = o.view;
    p.dout = dout.view;
    p.lse = contiguous_lse(lse.data(), sh.b, sh.hq, sh.t);
    p.dq = bhtd_view(dq.data(), DType::F32, sh.b, sh.hq, sh.t, sh.d);
    p.dk = bhtd_view(dk.data(), DType::F32, sh.b, sh.hkv, sh.s, sh.d);
    p.dv = bhtd_view(dv.data(), DType::F32, sh.b, sh.hkv, sh.s, sh.d);
    p.scale = f.scale;
    p.mask = f.mask;
  }
};

// ||g - ref|| / ||ref|| of each gradient (NaN anywhere: +inf).
struct Errors {
  double dq, dk, dv;
};
inline Errors errors_of(const Problem& pr, const cpu::GradReference& ref) {
  return {test::rel_error(pr.dq, ref.dq), test::rel_error(pr.dk, ref.dk), test::rel_error(pr.dv, ref.dv)};
}

// Norm-wise relative tolerance per input dtype: the dtype table's (core/dtype.hpp,
// grad_norm_tolerance, which says why).
inline double grad_tolerance(DType dt) { return dtype_info(dt).grad_norm_tolerance; }

}  // namespace ringattn::test
