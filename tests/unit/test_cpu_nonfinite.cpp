// Non-finite inputs on the CPU engine go exactly where the mask sends them: a NaN or Inf at a key
// (k or v) or a query row (q or dout) reaches the outputs that depend on it and nothing else, in
// the forward (o, lse) and the backward (dq, dk, dv), under causal masks, windows, decode offsets
// (q_len < kv_len) and packed documents (one kernel call per document). Which rows and keys a
// planted value reaches is derived here from the mask (visible_range) alone, checked against the
// fp64 oracle's own non-finite elements, and every other element must match the oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/backward_util.hpp"
#include "common/test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/tile_io.hpp"

namespace ringattn {
namespace {

using test::HostTensor;

enum class Where { K, V, Q, DOut };
const char* name_of(Where w) {
  switch (w) {
    case Where::K: return "k";
    case Where::V: return "v";
    case Where::Q: return "q";
    case Where::DOut: return "dout";
  }
  return "?";
}

struct Case {
  const char* what;
  int64_t t, s;  // q_len, kv_len
  MaskSpec mask;
  int tile_q = 0, tile_k = 0;
  int64_t d = 16;
};

struct Inputs {
  TensorView q, k, v, dout;
};

// One planted problem: B = 1, 2 query heads on 1 kv head (MQA, so both heads reach dk and dv).
struct Planted {
  HostTensor q, k, v, dout;
  std::vector<float> o, lse, dq, dk, dv;
  Planted(const Case& c, std::mt19937_64& rng)
      : q(DType::F32, 1, 2, c.t, c.d, rng), k(DType::F32, 1, 1, c.s, c.d, rng), v(DType::F32, 1, 1, c.s, c.d, rng),
        dout(DType::F32, 1, 2, c.t, c.d, rng) {}
  Inputs inputs() const { return {q.view, k.view, v.view, dout.view}; }
  // Sets every element of token `tok` (every head) of `w` to x.
  void plant(Where w, int64_t tok, float x) {
    HostTensor& h = w == Where::K ? k : w == Where::V ? v : w == Where::Q ? q : dout;
    for (int64_t hd = 0; hd < h.view.heads; ++hd)
      for (int64_t d = 0; d < h.view.dim; ++d) store_from_float(h.view.data, DType::F32, h.view.offset(0, hd, tok) + d, x);
  }
};

// The rows of [0, t) that see key j, and the keys that any of `rows` sees (from the mask alone).
std::set<int64_t> rows_seeing(const MaskSpec& m, int64_t t, int64_t s, int64_t j) {
  std::set<int64_t> out;
  for (int64_t i = 0; i < t; ++i) {
    const KeyRange r = visible_range(clamp_offset(m, t, s), i, s);
    if (j >= r.begin && j < r.end) out.insert(i);
  }
  return out;
}
std::set<int64_t> keys_seen_by(const MaskSpec& m, int64_t t, int64_t s, const std::set<int64_t>& rows) {
  std::set<int64_t> out;
  for (int64_t i : rows) {
    const KeyRange r = visible_range(clamp_offset(m, t, s), i, s);
    for (int64_t j = r.begin; j < r.end; ++j) out.insert(j);
  }
  return out;
}

// Tokens (axis 2 of [1, H, len, D], any head) holding a non-finite element.
template <typename T>
std::set<int64_t> nonfinite_tokens(const std::vector<T>& x, int64_t len, int64_t D) {
  std::set<int64_t> out;
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(double(x[i]))) out.insert(int64_t(i) / D % len);
  return out;
}

std::string str(const std::set<int64_t>& s) {
  std::string o;
  for (int64_t x : s) o += (o.empty() ? "" : ",") + std::to_string(x);
  return "{" + o + "}";
}

// Elements of tokens outside `skip` are finite and within tol * (1 + max |ref|) of the oracle.
template <typename T>
void expect_matches_outside(const char* what, const std::vector<T>& got, const std::vector<double>& ref, int64_t len,
                            int64_t D, const std::set<int64_t>& skip) {
  double largest = 0, worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (skip.count(int64_t(i) / D % len)) continue;
    ASSERT_TRUE(std::isfinite(double(got[i])) && std::isfinite(ref[i]))
        << what << " element " << i << " (token " << int64_t(i) / D % len << "): " << got[i] << " vs " << ref[i];
    largest = std::max(largest, std::abs(ref[i]));
    worst = std::max(worst, std::abs(double(got[i]) - ref[i]));
  }
  EXPECT_LE(worst, 2e-5 * (1 + largest)) << what;
}

struct Expected {
  std::set<int64_t> out, dq, dk, dv;  // the tokens a NaN planted there reaches
};

// Where a NaN at token `tok` of `w` goes, by the math: a key reaches the rows that see it (their
// o, lse and dq: D_i = dout_i . o_i and lse are NaN), and through their dS (and P, for k) the
// keys those rows see; a q row reaches itself and its keys; a dout row its dq and its keys' dk
// and dv (dv = P^T dout; for v, dv needs no v and stays finite).
Expected expected_of(const Case& c, Where w, int64_t tok) {
  Expected e;
  if (w == Where::K || w == Where::V) {
    const std::set<int64_t> rows = rows_seeing(c.mask, c.t, c.s, tok);
    e.out = e.dq = rows;
    e.dk = keys_seen_by(c.mask, c.t, c.s, rows);
    if (w == Where::K) e.dv = e.dk;
  } else {
    const KeyRange r = visible_range(clamp_offset(c.mask, c.t, c.s), tok, c.s);
    if (r.empty()) return e;  // a row that sees no key reaches nothing
    if (w == Where::Q) e.out.insert(tok);
    e.dq.insert(tok);
    e.dk = e.dv = keys_seen_by(c.mask, c.t, c.s, {tok});
  }
  return e;
}

// Forward and backward of `c` on the engine (inputs q, k, v, dout), and the oracle.
struct Results {
  std::vector<float> o, lse, dq, dk, dv;
  cpu::Reference ref;
  cpu::GradReference gref;
};
Results run(const Case& c, const Inputs& pl) {
  Results r;
  const int64_t D = c.d;
  r.o.assign(size_t(2 * c.t * D), test::kNaN);
  r.lse.assign(size_t(2 * c.t), test::kNaN);
  FlashParams f;
  f.q = pl.q;
  f.k = pl.k;
  f.v = pl.v;
  f.state = contiguous_state(r.o.data(), r.lse.data(), 1, 2, c.t, D);
  f.scale = 1.f / std::sqrt(float(D));
  f.mask = c.mask;
  f.tile_q = c.tile_q;
  f.tile_k = c.tile_k;
  cpu::flash_forward(f);
  std::vector<float> o_in = r.o;  // the forward's fp32 output as the backward's o
  BackwardParams b;
  b.q = pl.q;
  b.k = pl.k;
  b.v = pl.v;
  b.o = bhtd_view(o_in.data(), DType::F32, 1, 2, c.t, D);
  b.dout = pl.dout;
  b.lse = contiguous_lse(r.lse.data(), 1, 2, c.t);
  r.dq.assign(size_t(2 * c.t * D), test::kNaN);
  r.dk.assign(size_t(c.s * D), test::kNaN);
  r.dv.assign(size_t(c.s * D), test::kNaN);
  b.dq = bhtd_view(r.dq.data(), DType::F32, 1, 2, c.t, D);
  b.dk = bhtd_view(r.dk.data(), DType::F32, 1, 1, c.s, D);
  b.dv = bhtd_view(r.dv.data(), DType::F32, 1, 1, c.s, D);
  b.scale = f.scale;
  b.mask = c.mask;
  b.tile_q = c.tile_q;
  b.tile_k = c.tile_k;
  cpu::flash_backward(b);
  r.ref = cpu::naive_attention(f);
  r.gref = cpu::naive_backward(b);
  return r;
}

const Case kCases[] = {
    {"causal", 61, 61, {true, 0, -1}},
    {"causal, 8-row tiles", 61, 61, {true, 0, -1}, 8, 8},
    {"causal, odd tiles", 45, 45, {true, 0, -1}, 7, 13, 20},
    {"causal window 4", 96, 96, {true, 0, 4}},
    {"causal window 4, 16-row tiles", 96, 96, {true, 0, 4}, 16, 16},
    {"window 0 (one key per row)", 40, 40, {true, 0, 0}, 8, 8},
    {"lower edge only", 50, 50, {false, 0, 6}, 16, 16},
    {"full", 37, 37, {false, 0, -1}},
    {"decode, q_len < kv_len", 9, 70, {true, 61, -1}, 4, 16},
    {"decode with a window", 12, 80, {true, 68, 10}, 0, 16, 24},
    {"causal, negative offset (rows without keys)", 30, 30, {true, -5, -1}, 8, 8},
};

// A NaN at every key (in turn) and in every query row: the reach is exactly the mask's, and every
// element it does not reach matches the oracle.
TEST(CpuNonFinite, ANaNReachesExactlyWhatSeesIt) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (const Case& c : kCases)
    for (Where w : {Where::K, Where::V, Where::Q, Where::DOut}) {
      const int64_t len = (w == Where::K || w == Where::V) ? c.s : c.t;
      // Both ends, and a few tokens in between.
      std::vector<int64_t> toks = {0, len - 1, len / 2};
      for (int i = 0; i < 3; ++i) toks.push_back(int64_t(rng() % uint64_t(len)));
      for (int64_t tok : toks) {
        SCOPED_TRACE(::testing::Message() << "seed " << seed << ", " << c.what << ", NaN in " << name_of(w)
                                          << " token " << tok);
        Planted pl(c, rng);
        pl.plant(w, tok, test::kNaN);
        const Results r = run(c, pl.inputs());
        const Expected e = expected_of(c, w, tok);
        // The engine, and the oracle (the derivation checked), reach exactly the expected tokens.
        EXPECT_EQ(str(nonfinite_tokens(r.o, c.t, c.d)), str(e.out)) << "o";
        // The lse: NaN where o is for k and q (a row without keys keeps -inf).
        std::vector<float> lse_nan = r.lse;
        for (float& x : lse_nan) x = std::isnan(x) ? x : 0.f;
        EXPECT_EQ(str(nonfinite_tokens(lse_nan, c.t, 1)), str(w == Where::DOut || w == Where::V ? std::set<int64_t>{} : e.out))
            << "lse";
        EXPECT_EQ(str(nonfinite_tokens(r.dq, c.t, c.d)), str(e.dq)) << "dq";
        EXPECT_EQ(str(nonfinite_tokens(r.dk, c.s, c.d)), str(e.dk)) << "dk";
        EXPECT_EQ(str(nonfinite_tokens(r.dv, c.s, c.d)), str(e.dv)) << "dv";
        EXPECT_EQ(str(nonfinite_tokens(r.ref.o, c.t, c.d)), str(e.out)) << "oracle o";
        EXPECT_EQ(str(nonfinite_tokens(r.gref.dq, c.t, c.d)), str(e.dq)) << "oracle dq";
        EXPECT_EQ(str(nonfinite_tokens(r.gref.dk, c.s, c.d)), str(e.dk)) << "oracle dk";
        EXPECT_EQ(str(nonfinite_tokens(r.gref.dv, c.s, c.d)), str(e.dv)) << "oracle dv";
        expect_matches_outside("o", r.o, r.ref.o, c.t, c.d, e.out);
        expect_matches_outside("dq", r.dq, r.gref.dq, c.t, c.d, e.dq);
        expect_matches_outside("dk", r.dk, r.gref.dk, c.s, c.d, e.dk);
        expect_matches_outside("dv", r.dv, r.gref.dv, c.s, c.d, e.dv);
        if (::testing::Test::HasFailure()) return;
      }
    }
}

// +Inf and -Inf at a key or row: whatever they do to the tokens that depend on them (inf x 0 is
// NaN, an -inf score is a weight of 0), every token that does not depend on them is finite and
// matches the oracle.
TEST(CpuNonFinite, InfinitiesStayWhereTheyBelong) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (const Case& c : kCases)
    for (Where w : {Where::K, Where::V, Where::Q, Where::DOut})
      for (float x : {INFINITY, -INFINITY}) {
        const int64_t len = (w == Where::K || w == Where::V) ? c.s : c.t;
        for (int64_t tok : {int64_t(0), len - 1, int64_t(rng() % uint64_t(len))}) {
          SCOPED_TRACE(::testing::Message() << "seed " << seed << ", " << c.what << ", " << x << " in "
                                            << name_of(w) << " token " << tok);
          Planted pl(c, rng);
          pl.plant(w, tok, x);
          const Results r = run(c, pl.inputs());
          Expected e = expected_of(c, w, tok);
          expect_matches_outside("o", r.o, r.ref.o, c.t, c.d, e.out);
          expect_matches_outside("dq", r.dq, r.gref.dq, c.t, c.d, e.dq);
          expect_matches_outside("dk", r.dk, r.gref.dk, c.s, c.d, e.dk);
          expect_matches_outside("dv", r.dv, r.gref.dv, c.s, c.d, e.dv);
          if (::testing::Test::HasFailure()) return;
        }
      }
}

// Packed documents: the kernels see one call per document (the schedule splits at boundaries),
// so a NaN in one document reaches only what sees it in that document, and the other document's
// outputs match its oracle.
TEST(CpuNonFinite, ADocumentsNaNStaysInItsDocument) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  // Documents [0, 23) and [23, 40) of one packed sequence; the NaN at token 30 (7 in document b).
  const Case whole{"two documents", 40, 40, {true, 0, -1}, 8, 8};
  const Case doc_a{"document a", 23, 23, {true, 0, -1}, 8, 8}, doc_b{"document b", 17, 17, {true, 0, 2}, 8, 8};
  for (Where w : {Where::K, Where::V, Where::Q, Where::DOut}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << ", NaN in " << name_of(w) << " token 30");
    Planted pl(whole, rng);
    pl.plant(w, 30, test::kNaN);
    const Inputs all = pl.inputs();
    const Results a = run(doc_a, {all.q.rows(0, 23), all.k.rows(0, 23), all.v.rows(0, 23), all.dout.rows(0, 23)});
    for (const auto* x : {&a.o, &a.lse, &a.dq, &a.dk, &a.dv})
      EXPECT_EQ(str(nonfinite_tokens(*x, 23, 1)), "{}") << "document a";
    expect_matches_outside("o", a.o, a.ref.o, 23, 16, {});
    expect_matches_outside("dq", a.dq, a.gref.dq, 23, 16, {});
    expect_matches_outside("dk", a.dk, a.gref.dk, 23, 16, {});
    expect_matches_outside("dv", a.dv, a.gref.dv, 23, 16, {});
    const Results b = run(doc_b, {all.q.rows(23, 17), all.k.rows(23, 17), all.v.rows(23, 17), all.dout.rows(23, 17)});
    const Expected e = expected_of(doc_b, w, 7);
    EXPECT_EQ(str(nonfinite_tokens(b.o, 17, 16)), str(e.out)) << "document b o";
    EXPECT_EQ(str(nonfinite_tokens(b.dq, 17, 16)), str(e.dq)) << "document b dq";
    EXPECT_EQ(str(nonfinite_tokens(b.dk, 17, 16)), str(e.dk)) << "document b dk";
    EXPECT_EQ(str(nonfinite_tokens(b.dv, 17, 16)), str(e.dv)) << "document b dv";
    expect_matches_outside("o", b.o, b.ref.o, 17, 16, e.out);
  }
}

// The vectorized exp: NaN stays NaN, -inf gives 0, +inf gives +inf, arguments below -87 give 0,
// and other finite arguments match exp within an fp32 ulp or two.
TEST(CpuNonFinite, ExpNonpositiveKeepsSpecialValues) {
  std::vector<float> x = {test::kNaN, -INFINITY, INFINITY, 0.f, -1e-3f, -1.f, -20.f, -86.f, 1e-6f, -88.f};
  std::vector<float> y(x.size());
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) y[i] = cpu::exp_nonpositive(x[i]);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[2], INFINITY);
  EXPECT_EQ(y.back(), 0.f);  // below -87: 0
  for (size_t i = 3; i + 1 < x.size(); ++i) EXPECT_NEAR(y[i], std::exp(double(x[i])), 3e-7 * std::exp(double(x[i]))) << x[i];
}

}  // namespace
}  // namespace ringattn
