#include "cli/backward.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <unordered_set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/check.hpp"
#include "cli/context_parallel.hpp"
#include "cli/finite.hpp"
#include "cli/flags.hpp"
#include "cli/gather.hpp"
#include "cli/input_agreement.hpp"
#include "cli/outputs.hpp"
#include "cli/report.hpp"
#include "cli/run.hpp"
#include "core/timer.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

namespace ringattn::cli {
namespace {

// Up to this many fp64 FLOPs (a few seconds on two cores) the check compares every element of the
// gradients with naive_backward; above it (or with --check-rows) a seeded sample of rows.
constexpr double kFullGradCheckFlops = 8e9;
constexpr int64_t kMinSampleRows = 64;

struct GradError {
  double max_abs = 0, max_ref = 0;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
  void add(double g, double ref) {
    const double d = std::abs(g - ref);
    max_abs = std::isnan(d) ? INFINITY : std::max(max_abs, d);
    max_ref = std::max(max_ref, std::abs(ref));
  }
};

// The largest Euclidean norm of the rows [0, n) of D values at x (a bound on sum_d |q_d k_d| with
// another row's: Cauchy-Schwarz).
template <typename T>
double max_row_norm(const T* x, int64_t n, int64_t D) {
  double m = 0;
  for (int64_t r = 0; r < n; ++r) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(x[r * D + d]) * double(x[r * D + d]);
    m = std::max(m, std::sqrt(s));
  }
  return m;
}

struct GradCheck {
  GradError dq, dk, dv;
  double tolerance = 0;
  // The scores' magnitude M = scale * max |q| * max |k| over the rows the check read: fp32 scores
  // carry roundoff in proportion to it, and the softmax weights, so the gradients, move by as much
  // (the forward's score_rtol * M, core/dtype.hpp): q, k ~ N(0, 30^2) give M in the thousands.
  double score_rtol = 0, scale = 0, max_q = 0, max_k = 0;
  double allowed() const { return tolerance + score_rtol * scale * max_q * max_k; }
  int64_t nonfinite = 0;  // in all of the gradients, every rank's
  bool sampled = false;
  int64_t q_rows = 0, q_total = 0, k_rows = 0, k_total = 0;  // rows of dq and of dk/dv compared
  bool pass() const {
    return nonfinite == 0 && dq.rel() <= allowed() && dk.rel() <= allowed() && dv.rel() <= allowed();
  }
};

// The gathered gradients (and for a check the forward's output, for a sampled one its lse), global
// token order, on rank 0.
struct GlobalGrads {
  std::vector<float> dq, dk, dv;  // [B, Hq, T, D], [B, Hkv, S, D] x2
  std::vector<float> out, lse;    // [B, Hq, T, D] for a check, [B, Hq, T] only for a sampled check
};

// Whether the check samples rows (the same answer on every rank).
bool sampled_check(const GlobalProblem& p, int64_t check_rows) {
  return check_rows > 0 || (1 + kBackwardFlopFactor) * attention_flops(p) > kFullGradCheckFlops;
}

// The whole global tensor `which` [B, heads, len, D] in the problem's dtype.
std::vector<uint8_t> read_global(InputSource& src, InputTensor which, const GlobalProblem& p, int64_t heads,
                                 int64_t len) {
  const int64_t D = p.head_dim, es = dtype_size(p.dtype);
  std::vector<uint8_t> x(size_t(std::max<int64_t>(1, p.batch * heads * len * D * es)));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      src.rows(which, b, h, 0, len, heads, len, D, x.data() + size_t((b * heads + h) * len * D * es), p.dtype);
  return x;
}

// Every element against naive_backward of the whole problem (per document: each is a problem of
// its own).
void check_all(const GlobalProblem& p, InputSource& src, const DoutSource& ds, const GlobalGrads& g, GradCheck& c) {
  const int64_t B = p.batch, Hq = p.q_heads, Hk = p.kv_heads, T = p.q_len, S = p.kv_len, D = p.head_dim;
  std::vector<uint8_t> q = read_global(src, InputTensor::Q, p, Hq, T), k = read_global(src, InputTensor::K, p, Hk, S),
                       v = read_global(src, InputTensor::V, p, Hk, S),
                       dout = read_global(*ds.src, ds.which, p, Hq, T);
  BackwardParams bp;
  bp.q = bhtd_view(q.data(), p.dtype, B, Hq, T, D);
  bp.k = bhtd_view(k.data(), p.dtype, B, Hk, S, D);
  bp.v = bhtd_view(v.data(), p.dtype, B, Hk, S, D);
  bp.dout = bhtd_view(dout.data(), p.dtype, B, Hq, T, D);
  bp.o = bhtd_view(const_cast<float*>(g.out.data()), DType::F32, B, Hq, T, D);
  bp.scale = p.resolved_scale();
  std::vector<float> qf(size_t(B * Hq * T * D)), kf(size_t(B * Hk * S * D));
  for (size_t e = 0; e < qf.size(); ++e) qf[e] = load_as_float(q.data(), p.dtype, int64_t(e));
  for (size_t e = 0; e < kf.size(); ++e) kf[e] = load_as_float(k.data(), p.dtype, int64_t(e));
  c.max_q = max_row_norm(qf.data(), B * Hq * T, D);
  c.max_k = max_row_norm(kf.data(), B * Hk * S, D);
  const bool documents = p.doc_bounds().size() >= 2;
  for (const auto& [a, n, mask] : oracle_parts(p)) {
    BackwardParams dp = bp;
    if (documents) {
      dp.q = bp.q.rows(a, n);
      dp.k = bp.k.rows(a, n);
      dp.v = bp.v.rows(a, n);
      dp.dout = bp.dout.rows(a, n);
      dp.o = bp.o.rows(a, n);
    }
    dp.mask = mask;
    // D = rowsum(dO * out) from the forward's output, as the backward reads it (a 16-bit output's
    // rounding moves D, and the gradients with it, in proportion to |dO| |out| |k|).
    const cpu::GradReference r = cpu::naive_backward(dp, cpu::OracleDelta::FromOutput);
    const int64_t Td = dp.q.len, Sd = dp.k.len;
    auto cmp = [&](GradError& e, const std::vector<float>& got, const std::vector<double>& ref, int64_t H, int64_t len,
                   int64_t rows) {
      for (int64_t bh = 0; bh < B * H; ++bh)
        for (int64_t i = 0; i < rows * D; ++i)
          e.add(got[size_t((bh * len + a) * D + i)], ref[size_t(bh * rows * D + i)]);
    };
    cmp(c.dq, g.dq, r.dq, Hq, T, Td);
    cmp(c.dk, g.dk, r.dk, Hk, S, Sd);
    cmp(c.dv, g.dv, r.dv, Hk, S, Sd);
  }
  c.q_rows = c.q_total = B * Hq * T;
  c.k_rows = c.k_total = B * Hk * S;
}

// `want` distinct indices of [0, total) drawn from `seed` (all when want >= total).
std::vector<int64_t> pick(int64_t total, int64_t want, uint64_t seed) {
  std::vector<int64_t> out;
  if (want >= total) {
    for (int64_t i = 0; i < total; ++i) out.push_back(i);
    return out;
  }
  std::mt19937_64 rng(seed);
  std::unordered_set<int64_t> seen;
  while (int64_t(seen.size()) < want) seen.insert(int64_t(rng() % uint64_t(total)));
  out.assign(seen.begin(), seen.end());
  std::sort(out.begin(), out.end());
  return out;
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The fp64 dq row of query q with its upstream gradient dO, from its own softmax over the n keys
// k and values v it sees (rows of D): dq = scale * sum_j P_j (dO . v_j - dO . o) k_j, with o the
// forward's output row (as the backward reads it; cpu::OracleDelta::FromOutput).
std::vector<double> reference_dq_row(const double* q, const double* dO, const float* o, const double* k,
                                     const double* v, int64_t n, int64_t D, double scale) {
  std::vector<double> s(static_cast<size_t>(n)), dq(static_cast<size_t>(D), 0.0);
  double m = -INFINITY, l = 0;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[size_t(j)] = scale * dot(q, &k[size_t(j * D)], D));
  for (int64_t j = 0; j < n; ++j) l += std::exp(s[size_t(j)] - m);
  double Di = 0;
  for (int64_t d = 0; d < D; ++d) Di += dO[d] * double(o[d]);
  for (int64_t j = 0; j < n; ++j) {
    const double pj = std::exp(s[size_t(j)] - m) / l, ds_ = pj * (dot(dO, &v[size_t(j * D)], D) - Di);
    for (int64_t d = 0; d < D; ++d) dq[size_t(d)] += scale * ds_ * k[size_t(j * D + d)];
  }
  return dq;
}

// Adds query row qi's share to the fp64 dk and dv rows of key k (value v): P = exp(scale q.k -
// lse) with the forward's lse, D = dO . o with the forward's output row oi.
void add_query_to_key_row(const double* qi, const double* di, const float* oi, double lse, const double* k,
                          const double* v, int64_t D, double scale, double* dk, double* dv) {
  double Di = 0;
  for (int64_t d = 0; d < D; ++d) Di += di[d] * double(oi[d]);
  const double pij = std::exp(scale * dot(qi, k, D) - lse);
  const double dsij = pij * (dot(di, v, D) - Di);
  for (int64_t d = 0; d < D; ++d) {
    dv[d] += pij * di[d];
    dk[d] += scale * dsij * qi[d];
  }
}

// A seeded sample of rows. dq row (b, h, i): fp64 from the inputs (the row's own softmax) and
// D = dO . out with the forward's output row, as the backward reads it.
// dk/dv row (b, kv head, j): fp64 over every query that sees key j, each with its softmax
// statistics from the forward (the gathered lse, and D = dO . out with the forward's output);
// the exact statistics would cost a whole forward per row.
void check_sample(const GlobalProblem& p, InputSource& src, const DoutSource& ds, const GlobalGrads& g,
                  int64_t check_rows, uint64_t seed, GradCheck& c) {
  const int64_t B = p.batch, Hq = p.q_heads, Hk = p.kv_heads, T = p.q_len, S = p.kv_len, D = p.head_dim;
  const int64_t group = Hq / Hk;
  const double scale = p.resolved_scale();
  const MaskSpec mask = clamp_offset(p.mask(), T, S);
  const std::vector<int64_t> bounds = p.doc_bounds();
  const Documents docs = documents_of(bounds);
  auto keys_of = [&](int64_t i) {
    return docs.none() ? visible_range(mask, i, S) : document_keys(docs, p.causal, i, p.window);
  };
  const double per_query = std::max(1.0, visible_pairs(p) / double(T)), per_key = std::max(1.0, visible_pairs(p) / double(S));
  auto want = [&](double row_flops, int64_t total) {
    return std::min(total, check_rows > 0 ? check_rows
                                          : std::max<int64_t>(kMinSampleRows, int64_t(kFullGradCheckFlops / 2 / row_flops)));
  };
  std::vector<uint8_t> buf;
  // Reads global rows [t0, t0 + n) of head h of `which` as fp64.
  auto rows = [&](InputSource& s, InputTensor which, int64_t b, int64_t h, int64_t heads, int64_t len, int64_t t0,
                  int64_t n) {
    buf.resize(size_t(std::max<int64_t>(1, n * D * dtype_size(p.dtype))));
    if (n > 0) s.rows(which, b, h, t0, n, heads, len, D, buf.data(), p.dtype);
    std::vector<double> x(static_cast<size_t>(n * D));
    for (int64_t e = 0; e < n * D; ++e) x[size_t(e)] = load_as_float(buf.data(), p.dtype, e);
    return x;
  };
  c.sampled = true;
  c.q_total = B * Hq * T;
  c.k_total = B * Hk * S;
  // dq rows.
  const std::vector<int64_t> qs = pick(c.q_total, want(8.0 * D * per_query, c.q_total), seed * 0x9e3779b97f4a7c15ull + 1);
  c.q_rows = int64_t(qs.size());
  for (int64_t f : qs) {
    const int64_t b = f / (Hq * T), h = (f / T) % Hq, i = f % T, hk = h / group;
    const KeyRange kr = keys_of(i);
    const std::vector<double> q = rows(src, InputTensor::Q, b, h, Hq, T, i, 1), dO = rows(*ds.src, ds.which, b, h, Hq, T, i, 1),
                              k = rows(src, InputTensor::K, b, hk, Hk, S, kr.begin, kr.size()),
                              v = rows(src, InputTensor::V, b, hk, Hk, S, kr.begin, kr.size());
    c.max_q = std::max(c.max_q, max_row_norm(q.data(), 1, D));
    c.max_k = std::max(c.max_k, max_row_norm(k.data(), kr.size(), D));
    const std::vector<double> dq = reference_dq_row(q.data(), dO.data(), &g.out[size_t(((b * Hq + h) * T + i) * D)],
                                                     k.data(), v.data(), kr.size(), D, scale);
    for (int64_t d = 0; d < D; ++d) c.dq.add(g.dq[size_t(((b * Hq + h) * T + i) * D + d)], dq[size_t(d)]);
  }
  // dk/dv rows, grouped by (batch, kv head): the queries of its heads are read once.
  const std::vector<int64_t> ks =
      pick(c.k_total, want(8.0 * D * group * per_key, c.k_total), seed * 0x9e3779b97f4a7c15ull + 2);
  c.k_rows = int64_t(ks.size());
  std::vector<KeyRange> ranges(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) ranges[size_t(i)] = keys_of(i);
  for (size_t a = 0; a < ks.size();) {
    const int64_t b = ks[a] / (Hk * S), hk = (ks[a] / S) % Hk;
    size_t e = a;
    while (e < ks.size() && ks[e] / S == ks[a] / S) ++e;
    std::vector<std::vector<double>> q(static_cast<size_t>(group)), dO(static_cast<size_t>(group));
    for (int64_t gh = 0; gh < group; ++gh) {
      q[size_t(gh)] = rows(src, InputTensor::Q, b, hk * group + gh, Hq, T, 0, T);
      dO[size_t(gh)] = rows(*ds.src, ds.which, b, hk * group + gh, Hq, T, 0, T);
      c.max_q = std::max(c.max_q, max_row_norm(q[size_t(gh)].data(), T, D));
    }
    for (size_t r = a; r < e; ++r) {
      const int64_t j = ks[r] % S;
      const std::vector<double> k = rows(src, InputTensor::K, b, hk, Hk, S, j, 1), v = rows(src, InputTensor::V, b, hk, Hk, S, j, 1);
      c.max_k = std::max(c.max_k, max_row_norm(k.data(), 1, D));
      std::vector<double> dk(static_cast<size_t>(D), 0.0), dv(static_cast<size_t>(D), 0.0);
      for (int64_t gh = 0; gh < group; ++gh) {
        const int64_t bh = b * Hq + hk * group + gh;
        for (int64_t i = 0; i < T; ++i)
          if (j >= ranges[size_t(i)].begin && j < ranges[size_t(i)].end)
            add_query_to_key_row(&q[size_t(gh)][size_t(i * D)], &dO[size_t(gh)][size_t(i * D)],
                                 &g.out[size_t((bh * T + i) * D)], double(g.lse[size_t(bh * T + i)]), k.data(),
                                 v.data(), D, scale, dk.data(), dv.data());
      }
      for (int64_t d = 0; d < D; ++d) {
        c.dk.add(g.dk[size_t(((b * Hk + hk) * S + j) * D + d)], dk[size_t(d)]);
        c.dv.add(g.dv[size_t(((b * Hk + hk) * S + j) * D + d)], dv[size_t(d)]);
      }
    }
    a = e;
  }
}

struct Timings {
  double forward_s = 0, backward_s = 0;
  std::vector<uint64_t> forward_bytes, backward_bytes;  // what every rank sent in each (RankStats::bytes_sent)
};

std::string check_scope(const GradCheck& c) {
  if (!c.sampled) return "fp64 reference, every element";
  return fmt::format("fp64 reference, seeded sample: {} of {} dq rows, {} of {} dk/dv rows (these with the forward's "
                     "lse and output)", c.q_rows, c.q_total, c.k_rows, c.k_total);
}

void print_report(std::FILE* f, const CommandLine& cl, const GlobalProblem& p, const World& w, const Timings& t,
                  const GradCheck* c) {
  const bool deterministic = cl.run.deterministic;
  const double flops = attention_flops(p), bflops = kBackwardFlopFactor * flops;
  fmt::print(f, "# ringattn run --backward: {}\n", problem_line(p));
  fmt::print(f, "# flags: {}\n", given_flags_line(cl));
  fmt::print(f, "# world {}, transport {}{}, device {}, dq {}\n", w.size, w.transport_name,
             cp_suffix(cp_group_size(cl.run.problem.cp, w.size), w.size), w.device_label,
             deterministic ? "deterministic" : "fast");
  fmt::print(f, "forward  {:.3f} ms, {}\n", t.forward_s * 1e3, rate_string(flops, t.forward_s));
  fmt::print(f, "backward {:.3f} ms, {} ({:.3f} GFLOP = 2.5 x the forward's)\n", t.backward_s * 1e3,
             rate_string(bflops, t.backward_s), bflops / 1e9);
  fmt::print(f, "total    {:.3f} ms, {} (forward + backward, 3.5 x the forward's FLOPs; slowest rank each)\n",
             (t.forward_s + t.backward_s) * 1e3, rate_string(flops + bflops, t.forward_s + t.backward_s));
  if (c != nullptr) {
    fmt::print(f, "check    dq max abs {:.3e} max rel {:.3e} | dk max abs {:.3e} max rel {:.3e} | dv max abs {:.3e} max "
               "rel {:.3e} | non-finite {} -> {}\n", c->dq.max_abs, c->dq.rel(), c->dk.max_abs, c->dk.rel(),
               c->dv.max_abs, c->dv.rel(), c->nonfinite, c->pass() ? "OK" : "FAILED");
    fmt::print(f, "         tolerance {}: max |g - ref| <= ({:.0e} + {:.0e} x score magnitude {:.3g}) max |ref| = {:.2e} "
               "max |ref| per gradient ({})\n", dtype_name(p.dtype), c->tolerance, c->score_rtol,
               c->scale * c->max_q * c->max_k, c->allowed(), check_scope(*c));
  }
  std::fflush(f);
}

nlohmann::json grads_json(const GradCheck& c) {
  auto one = [](const GradError& e) { return nlohmann::json{{"max_abs_error", e.max_abs}, {"max_rel_error", e.rel()}}; };
  return {{"dq", one(c.dq)}, {"dk", one(c.dk)}, {"dv", one(c.dv)}, {"nonfinite", c.nonfinite},
          {"tolerance", c.allowed()}, {"sampled", c.sampled}, {"dq_rows_checked", c.q_rows},
          {"dq_rows_total", c.q_total}, {"dkv_rows_checked", c.k_rows}, {"dkv_rows_total", c.k_total},
          {"pass", c.pass()}};
}

nlohmann::json run_json(const CommandLine& cl, const GlobalProblem& p, const World& w, const Timings& t) {
  const RunOptions& o = cl.run;
  const double flops = attention_flops(p), bflops = kBackwardFlopFactor * flops, total = t.forward_s + t.backward_s;
  auto rate = [](double fl, double s) { return s > 0 ? fl / s / 1e9 : 0.0; };
  return {{"command", "run"},
          {"backward", true},
          {"problem", problem_json(p)},
          {"world", w.size},
          {"transport", w.transport_name},
          {"device", w.device_label},
          {"inputs", o.problem.from_files() ? "files" : fmt::format("seed {}", o.problem.seed)},
          {"dout", o.do_file.empty() ? fmt::format("seed {}", o.problem.seed) : "file"},
          {"deterministic", o.deterministic},
          {"forward_s", t.forward_s},
          {"backward_s", t.backward_s},
          {"total_s", total},
          {"flops", flops},
          {"backward_flops", bflops},
          {"gflops_per_s", rate(flops, t.forward_s)},
          {"backward_gflops_per_s", rate(bflops, t.backward_s)},
          {"total_gflops_per_s", rate(flops + bflops, total)},
          {"forward_bytes_sent", t.forward_bytes},
          {"backward_bytes_sent", t.backward_bytes},
          {"flags", flags_json(cl)}};
}

// The slowest rank's `dt` (collective).
double slowest(Transport& t, double dt) {
  std::vector<double> all(static_cast<size_t>(t.size()), 0.0);
  t.allgather(&dt, all.data(), sizeof(double));
  return *std::max_element(all.begin(), all.end());
}

// Every rank's `n`, in rank order (collective).
std::vector<uint64_t> every_rank(Transport& t, uint64_t n) {
  std::vector<uint64_t> all(static_cast<size_t>(t.size()), 0);
  t.allgather(&n, all.data(), sizeof(uint64_t));
  return all;
}

// The sum over ranks of `n` (collective).
int64_t sum_over_ranks(Transport& t, int64_t n) {
  std::vector<int64_t> all(static_cast<size_t>(t.size()), 0);
  t.allgather(&n, all.data(), sizeof(int64_t));
  int64_t s = 0;
  for (int64_t x : all) s += x;
  return s;
}

// The load phase of every rank: problem, shard, dO. Errors here may hit one rank only (a file
// missing on one host); they become an exit code every rank agrees on, before any ring.
int load_phase(const RunOptions& o, World& w, ProblemSetup& setup, LocalProblem& local, BackwardBuffers& g,
               BackwardSetup& bs) {
  return agreed_step(*w.transport, [&] {
    setup = prepare_run(o, w);
    bs.layout = setup.layout;  // --do is read in the inputs' layout
    const GlobalProblem& p = setup.problem;
    if (w.rank == 0)
      spdlog::info("problem: {}; forward and backward over {} rank(s), {}", problem_line(p), w.size, w.transport_name);
    local = load_local(p, ring_of(setup.ring), *setup.source, *w.backend, w.rank, w.size, setup.cp_group);
    if (o.check_finite)
      if (std::string error = check_inputs_finite(p, local, *w.backend, w.rank, *setup.source); !error.empty())
        return error;
    g = make_backward(p, local, *w.backend, bs);
    if (!o.check_finite) return std::string();
    const DoutSource ds = dout_source(p, bs);
    return check_dout_finite(p, local, g.dout, *w.backend, w.rank, *ds.src, ds.which);
  });
}

// This rank's output as fp32.
std::vector<float> out_as_float(const GlobalProblem& p, const HostResult& r) {
  std::vector<float> x(r.out.size() / size_t(dtype_size(p.dtype)));
  for (size_t i = 0; i < x.size(); ++i) x[i] = load_as_float(r.out.data(), p.dtype, int64_t(i));
  return x;
}

}  // namespace

void check_backward_setup(const RunOptions& o, const ProblemSetup& setup, int world) {
  const GlobalProblem& p = setup.problem;
  if (world > 1 && !p.is_ring())
    fail_arg("--backward over {} ranks runs the ring backward, which needs self-attention (q_len == kv_len, "
             "q_offset 0); got q_len={}, kv_len={}, q_offset={}: run a decode's backward on one process",
             world, p.q_len, p.kv_len, p.resolved_q_offset());
  // The --do file: a regular file in the shape of q (its header; the rows are read by the run).
  dout_source(p, BackwardSetup{o.problem.seed, o.do_file, o.deterministic, o.problem.tile_q, o.problem.tile_k,
                               setup.layout});
}

DoutSource dout_source(const GlobalProblem& p, const BackwardSetup& s) {
  DoutSource d;
  if (s.do_file.empty()) {
    d.src = std::make_unique<InputSource>(s.seed);
    d.which = InputTensor::DO;
    return d;
  }
  expect_regular_file("--do", s.do_file);
  {
    NpyReader r(s.do_file);
    const std::vector<int64_t> want = file_shape(s.layout, p.batch, p.q_heads, p.q_len, p.head_dim);
    if (r.header().shape != want)
      fail_arg("--do {} holds shape {} but q is {}: dO must have the shape of q ({}, {})", s.do_file,
               r.header().shape_string(), shape_text(want), file_axes(s.layout, "heads", "q_len"),
               layout_phrase(s.layout));
  }
  // One file read as the source's q (in the layout of the inputs, any of its dtypes).
  d.src = std::make_unique<InputSource>(s.do_file, s.do_file, s.do_file, s.layout);
  d.which = InputTensor::Q;
  return d;
}

std::string check_finite_before_run(const RunOptions& o, const ProblemSetup& setup, World& w) {
  const GlobalProblem& p = setup.problem;
  const LocalProblem local = load_local(p, ring_of(setup.ring), *setup.source, *w.backend, w.rank, w.size, setup.cp_group);
  if (std::string e = check_inputs_finite(p, local, *w.backend, w.rank, *setup.source); !e.empty()) return e;
  if (!o.backward) return "";
  const BackwardSetup bs{o.problem.seed, o.do_file, o.deterministic, o.problem.tile_q, o.problem.tile_k, setup.layout};
  const BackwardBuffers g = make_backward(p, local, *w.backend, bs);
  const DoutSource ds = dout_source(p, bs);
  return check_dout_finite(p, local, g.dout, *w.backend, w.rank, *ds.src, ds.which);
}

BackwardBuffers make_backward(const GlobalProblem& p, const LocalProblem& local, Backend& b, const BackwardSetup& s) {
  BackwardBuffers g;
  const TensorView& q = local.views.q;
  const size_t qn = size_t(q.numel()), kn = size_t(local.views.k.numel());
  DoutSource ds = dout_source(p, s);
  g.dout = DeviceBuffer(b, qn * dtype_size(p.dtype));
  std::vector<uint8_t> host(std::max<size_t>(1, qn * dtype_size(p.dtype)));
  const TensorView hd = bhtd_view(host.data(), p.dtype, q.batch, q.heads, q.len, q.dim);
  ds.src->fill(ds.which, hd, local.q_layout, p.q_len);  // this rank's rows of the global dO
  b.copy_from_host(g.dout.get(), host.data(), qn * dtype_size(p.dtype));
  g.dq = DeviceBuffer(b, qn * sizeof(float));
  g.dk = DeviceBuffer(b, kn * sizeof(float));
  g.dv = DeviceBuffer(b, kn * sizeof(float));
  // NaN poison (0xFF bytes are a NaN in fp32): the backward must write every element.
  std::vector<uint8_t> poison(std::max<size_t>(1, std::max(qn, kn) * sizeof(float)), 0xFF);
  b.copy_from_host(g.dq.get(), poison.data(), g.dq.bytes());
  b.copy_from_host(g.dk.get(), poison.data(), g.dk.bytes());
  b.copy_from_host(g.dv.get(), poison.data(), g.dv.bytes());

  BackwardParams& bp = g.params;
  bp.q = q;
  bp.k = local.views.k;
  bp.v = local.views.v;
  bp.o = local.views.out;
  bp.dout = bhtd_view(g.dout.get(), p.dtype, q.batch, q.heads, q.len, q.dim);
  bp.lse = contiguous_lse(local.views.lse, q.batch, q.heads, q.len);
  bp.dq = bhtd_view(g.dq.get(), DType::F32, q.batch, q.heads, q.len, q.dim);
  bp.dk = bhtd_view(g.dk.get(), DType::F32, p.batch, p.kv_heads, local.views.k.len, p.head_dim);
  bp.dv = bhtd_view(g.dv.get(), DType::F32, p.batch, p.kv_heads, local.views.k.len, p.head_dim);
  bp.scale = p.resolved_scale();
  bp.mask = p.mask();
  bp.mode = GradMode::Write;
  bp.deterministic = s.deterministic;
  bp.tile_q = s.tile_q;
  bp.tile_k = s.tile_k;
  return g;
}

RankStats run_backward(const GlobalProblem& p, const LocalProblem& local, const BackwardBuffers& g, World& w,
                       const ringattn::RunOptions& ro) {
  RankStats st;
  try {
    const BackwardTensors bt{g.params.dout, g.params.dq, g.params.dk, g.params.dv};
    if (local.cp_group > 1) {
      if (local.cp == nullptr) fail_arg("--cp groups of {} ranks: their transports are not split", local.cp_group);
      st = run_hybrid_attention_backward(p, local.views, bt, *w.backend, *local.cp->group, *local.cp->ring,
                                         *local.cp->grad_ring, ro);
    } else if (local.ring) {
      st = run_attention_backward(p, *local.ring, local.views, bt, *w.backend, *w.transport, grad_transport(w), ro);
    } else {
      w.backend->flash_backward(g.params);  // a decode problem: a world of one (load_phase)
    }
    w.backend->synchronize();
  } catch (const CollectiveError&) {
    throw;
  } catch (const InvalidArgument& e) {
    throw CollectiveError(e.what());  // the runtime validates identically on every rank
  }
  return st;
}

HostGrads copy_grads(const BackwardBuffers& g, Backend& b) {
  HostGrads h;
  h.dq.resize(g.dq.bytes() / sizeof(float));
  h.dk.resize(g.dk.bytes() / sizeof(float));
  h.dv.resize(g.dv.bytes() / sizeof(float));
  b.synchronize();
  b.copy_to_host(h.dq.data(), g.dq.get(), g.dq.bytes());
  b.copy_to_host(h.dk.data(), g.dk.get(), g.dk.bytes());
  b.copy_to_host(h.dv.data(), g.dv.get(), g.dv.bytes());
  return h;
}

int64_t count_nonfinite(const HostGrads& g) {
  int64_t bad = 0;
  for (const auto* v : {&g.dq, &g.dk, &g.dv})
    for (float x : *v) bad += !std::isfinite(x);
  return bad;
}

namespace {

// The forward ring, then the ring backward, each between a barrier and the slowest rank's clock.
Timings time_forward_backward(const GlobalProblem& p, LocalProblem& local, const BackwardBuffers& g, World& w,
                              const ringattn::RunOptions& ro) {
  Transport& t = *w.transport;
  Timings tm;
  t.barrier();
  auto t0 = std::chrono::steady_clock::now();
  RankStats fwd;
  try {
    fwd = run_forward(p, local, *w.backend, t, ro);
    w.backend->synchronize();
  } catch (const InvalidArgument& e) {
    throw CollectiveError(e.what());
  }
  tm.forward_s = slowest(t, seconds_since(t0));
  t.barrier();
  t0 = std::chrono::steady_clock::now();
  const RankStats bwd = run_backward(p, local, g, w, ro);
  tm.backward_s = slowest(t, seconds_since(t0));
  tm.forward_bytes = every_rank(t, fwd.bytes_sent);
  tm.backward_bytes = every_rank(t, bwd.bytes_sent);
  return tm;
}

// Rank 0 gathers what it writes or checks, in global token order (every rank takes part): the
// gradients asked for, for a check the forward's output (the oracle's D reads it, as the backward
// does) and for a sampled check its lse.
GlobalGrads gather_grads(const RunOptions& o, const GlobalProblem& p, const LocalProblem& local, const HostGrads& h,
                         const HostResult& fwd, bool sampled, World& w) {
  Transport& t = *w.transport;
  const std::vector<ShardLayout> ql = all_layouts(p, local.ring, w.size, false, local.cp_group),
                                 kl = all_layouts(p, local.ring, w.size, true, local.cp_group);
  const int64_t B = p.batch, D = p.head_dim;
  GlobalGrads gg;
  if (o.check || !o.dq_file.empty()) gg.dq = gather_rows(t, ql, B * p.q_heads, p.q_len, D, h.dq.data());
  if (o.check || !o.dk_file.empty()) gg.dk = gather_rows(t, kl, B * p.kv_heads, p.kv_len, D, h.dk.data());
  if (o.check || !o.dv_file.empty()) gg.dv = gather_rows(t, kl, B * p.kv_heads, p.kv_len, D, h.dv.data());
  if (o.check) {
    const std::vector<float> of = out_as_float(p, fwd);
    gg.out = gather_rows(t, ql, B * p.q_heads, p.q_len, D, of.data());
  }
  if (o.check && sampled) gg.lse = gather_rows(t, ql, B * p.q_heads, p.q_len, 1, fwd.lse.data());
  return gg;
}

// --dq/--dk/--dv in `layout` (the shapes of q, k and v in it), finished into `staged`, which moves
// them into place with the run's other outputs.
void write_grad_files(const RunOptions& o, const GlobalProblem& p, const GlobalGrads& gg, FileLayout layout,
                      FileSet& staged) {
  const int64_t B = p.batch, D = p.head_dim;
  for (const auto& [path, heads, len, data] : {std::tuple{&o.dq_file, p.q_heads, p.q_len, &gg.dq},
                                               std::tuple{&o.dk_file, p.kv_heads, p.kv_len, &gg.dk},
                                               std::tuple{&o.dv_file, p.kv_heads, p.kv_len, &gg.dv}}) {
    if (path->empty()) continue;
    NpyWriter file(*path, file_shape(layout, B, heads, len, D), DType::F32);
    const std::vector<float> x = to_file_order(layout, data->data(), B, heads, len, D);
    file.write(x.data(), int64_t(x.size()));
    staged.add(file.release_finished());
  }
}

// Rank 0: the check, the report, and the JSON and the gradient files staged (`write_failed` when
// one could not be written); returns the exit code.
int finish_on_rank0(const CommandLine& cl, const ProblemSetup& setup, const BackwardSetup& bs, const GlobalGrads& gg,
                    const Timings& tm, int64_t bad, int64_t bad_fwd, bool sampled, World& w, FileSet& staged,
                    bool& write_failed) {
  const RunOptions& o = cl.run;
  const GlobalProblem& p = setup.problem;
  int code = kExitOk;
  GradCheck c;
  try {
    if (o.check) {
      c.tolerance = dtype_info(p.dtype).grad_tolerance;  // the dtype table's bounds (core/dtype.hpp)
      c.score_rtol = dtype_info(p.dtype).tolerance.score_rtol;
      c.scale = p.resolved_scale();
      c.nonfinite = bad;
      const DoutSource ds = dout_source(p, bs);
      if (sampled)
        // --check-rows counts per rank, as the forward's check; rank 0 checks the gathered
        // gradients, so it compares that many rows for every rank (each capped at the total).
        check_sample(p, *setup.source, ds, gg, std::min<int64_t>(o.problem.check_rows, INT64_MAX / w.size) * w.size,
                     o.problem.seed, c);
      else
        check_all(p, *setup.source, ds, gg, c);
    }
  } catch (const std::exception& e) {
    spdlog::error("check: {}", e.what());
    code = kExitError;
  }
  std::FILE* f = o.json_file == "-" ? stderr : stdout;
  print_report(f, cl, p, w, tm, o.check ? &c : nullptr);
  if (bad + bad_fwd > 0) {
    spdlog::error("non-finite results: {} in the forward's output and lse, {} in the gradients (a NaN or Inf in q, "
                  "k, v or dO; --check-finite names the first such input)", bad_fwd, bad);
    code = std::max(code, kExitCheckFailed);
  }
  if (o.check && !c.pass()) code = std::max(code, kExitCheckFailed);
  try {
    if (!o.json_file.empty()) {
      nlohmann::json j = run_json(cl, p, w, tm);
      if (o.check) j["check"] = grads_json(c);
      stage_json(staged, o.json_file, j);
    }
    write_grad_files(o, p, gg, setup.layout, staged);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    write_failed = true;
  }
  return code;
}

}  // namespace

int backward_on(const CommandLine& cl, World& w) {
  const RunOptions& o = cl.run;
  Transport& t = *w.transport;
  ProblemSetup setup;
  LocalProblem local;
  BackwardBuffers g;
  BackwardSetup bs{o.problem.seed, o.do_file, o.deterministic, o.problem.tile_q, o.problem.tile_k};
  if (load_phase(o, w, setup, local, g, bs) != kExitOk) return kExitError;
  const GlobalProblem& p = setup.problem;
  agree_on_loaded_inputs(p, input_files_of(o), t);
  CpTransports cp;  // collective, as grad_transport: made here, outside the timed runs
  if (setup.cp_group > 1) {
    cp = split_cp(t, setup.cp_group);
    local.cp = &cp;
  } else {
    grad_transport(w);
  }

  ringattn::RunOptions ro;
  ro.tile_q = o.problem.tile_q;
  ro.tile_k = o.problem.tile_k;
  ro.deterministic = o.deterministic;
  const Timings tm = time_forward_backward(p, local, g, w, ro);

  const HostGrads h = copy_grads(g, *w.backend);
  const HostResult fwd = copy_result(p, local, *w.backend);
  const int64_t bad = sum_over_ranks(t, count_nonfinite(h)), bad_fwd = sum_over_ranks(t, count_nonfinite(p, fwd));
  const bool sampled = o.check && sampled_check(p, o.problem.check_rows);
  const GlobalGrads gg = gather_grads(o, p, local, h, fwd, sampled, w);
  // Every output of the run (--json, --dq/--dk/--dv, --out, --lse) moves into place together, or
  // none does.
  FileSet staged;
  bool write_failed = false;
  int code = w.rank == 0 ? finish_on_rank0(cl, setup, bs, gg, tm, bad, bad_fwd, sampled, w, staged, write_failed)
                         : kExitOk;
  wait_after_check(o.check, w.timeout_s, [&] { write_failed = agree_exit_code(t, write_failed ? 1 : 0) != 0; });
  if (!write_failed && write_global_outputs(p, local, fwd, t, o.out_file, o.lse_file, setup.layout, staged) != 0)
    write_failed = true;
  if (!write_failed) write_failed = commit_outputs(staged) != 0;
  if (write_failed) code = std::max(code, int(kExitError));
  return agree_exit_code(t, code);
}

}  // namespace ringattn::cli
