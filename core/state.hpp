// The softmax state and its arithmetic, defined once for the CPU engine and every CUDA kernel.
//
// A partial result over some set of keys is (o, lse) in fp32: o = sum_j p_j v_j / sum_j p_j and
// lse = ln(sum_j exp(s_j)), where s_j = scale * q.k_j: natural log, scale included. The empty state
// (no visible key yet) is o = 0, lse = -inf. merge_weights gives the merge
//     lse = max + ln(exp(a.lse - max) + exp(b.lse - max)),  o = a.o * wa + b.o * wb,
// which is associative and commutative up to rounding, has the empty state as identity, and never
// forms (-inf) - (-inf).
//
// While a row's keys stream through a kernel, the same state is kept as (m, l, acc): the running
// max m of the exponents, l = sum_j exp(x_j - m) and acc = sum_j exp(x_j - m) v_j, normalized once
// at the end. The exponent units are the kernel's choice: the CPU engine and the fp32 path use
// natural units (x = s, exp), the tensor-core kernels log2 units with the scale folded in
// (x = s * log2(e), so each exponential is one exp2; lse_from_stats_log2 converts back). The
// helpers below take the exponential as a function object so that both forms share them.
#pragma once

#include <cmath>

#include "core/hd.hpp"

namespace ringattn {

constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

// The lse of the empty state.
RA_HD float empty_lse() { return -INFINITY; }

// Weights of state := merge(a, b) with a's lse lse_a and b's lse_b: returns false when b is
// empty (a unchanged). Otherwise o := a.o * wa + b.o * wb and lse := merged; an empty a gives
// wa = 0, wb = 1 (a's o is then not read by the callers: 0 * NaN would be NaN).
RA_HD bool merge_weights(float lse_a, float lse_b, float& wa, float& wb, float& merged) {
  if (lse_b == empty_lse()) return false;
  if (lse_a == empty_lse()) {
    wa = 0.f;
    wb = 1.f;
    merged = lse_b;
    return true;
  }
  const float mx = fmaxf(lse_a, lse_b);
  const float ea = expf(lse_a - mx), eb = expf(lse_b - mx);  // one of them is exactly 1
  const float sum = ea + eb;
  wa = ea / sum;
  wb = eb / sum;
  merged = mx + logf(sum);
  return true;
}

// The base a row's exponentials are taken against: its running max m times `scale` (the units
// conversion, 1 when m is already in exponent units), or 0 while the row has seen no key
// (m = -inf), so that no (-inf) - (-inf) is formed and every term of such a row is exp(-inf) = 0.
RA_HD float exp_base(float m, float scale = 1.f) { return m == -INFINITY ? 0.f : m * scale; }

// The factor that moves sums kept against max m onto the larger max m_to: 0 for a partial that
// saw no key (m = -inf).
template <typename Exp>
RA_HD float rescale_factor(float m, float m_to, Exp exp_fn) {
  return m == -INFINITY ? 0.f : exp_fn(m - m_to);
}

// One online-softmax step of a row whose new scores have the max tile_max (exponent units):
// moves m to the new running max and returns the base for this step's exponentials and the
// factor alpha by which l and acc (kept against the old max) must be scaled: l = l * alpha + sum.
struct OnlineStep {
  float base, alpha;
};
template <typename Exp>
RA_HD OnlineStep online_step(float& m, float tile_max, Exp exp_fn) {
  const float m_new = fmaxf(m, tile_max);
  const float base = exp_base(m_new);
  const OnlineStep st{base, exp_fn(m - base)};  // m = -inf (first keys): alpha = 0
  m = m_new;
  return st;
}

// A finished row's (m, l): l = 0 when it saw no key (the empty state), l > 0 when it saw some,
// and NaN when a non-finite score or value reached it. A NaN l must stay visible: it is not the
// empty state (which the merges would then drop, hiding the NaN from every later hop).
// The lse of a finished row from its (m, l), natural log: m in natural units.
RA_HD float lse_from_stats(float m, float l) { return l == 0.f ? empty_lse() : m + logf(l); }
// The same with m in log2 units (the tensor-core kernels).
RA_HD float lse_from_stats_log2(float m, float l) { return l == 0.f ? empty_lse() : (m + log2f(l)) * kLn2; }
// The factor that normalizes a finished row's accumulator: 1 / l, and 0 for a row that saw no key
// (its accumulator is 0); NaN stays NaN.
RA_HD float inv_sum(float l) { return l == 0.f ? 0.f : 1.f / l; }

}  // namespace ringattn
