// `ringattn bench`: a sweep over sequence lengths with an nccl-tests style table: a '#' header
// with the configuration and one line per rank, one row per size (median time, FLOP rate,
// hidden communication, error, NaNs), a footer that says OK or FAILED.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/backward.hpp"
#include "cli/check.hpp"
#include "cli/context_parallel.hpp"
#include "cli/flags.hpp"
#include "cli/outputs.hpp"
#include "cli/problem.hpp"
#include "cli/report.hpp"
#include "cli/run.hpp"
#include "core/timer.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "runner/faults/fault.hpp"

namespace ringattn::cli {
namespace {

// Sweeps longer than this print a progress line before each size.
constexpr double kProgressAfterS = 2.0;

// `got` [B, H, n, D] (or [B, H, n] with D 1) of an oracle part into rows [a, a + n) of `dst`.
template <class Store>
void scatter_part(const std::vector<double>& got, int64_t B, int64_t H, int64_t n, int64_t D, Store&& store) {
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < D; ++d) store(bh / H, bh % H, t, d, got[size_t((bh * n + t) * D + d)]);
}

// The fp64 oracle as an implementation, for the flash-vs-naive comparison: per packed document
// (each a problem of its own, as the check sees it); writes the same (out, lse) a run would.
RankStats run_naive(const GlobalProblem& p, const LocalProblem& l) {
  const bool documents = p.doc_bounds().size() >= 2;
  const TensorView out = l.views.out;
  const int64_t T = p.q_len;
  RankStats s;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& [a, n, mask] : oracle_parts(p)) {
    FlashParams fp;
    fp.q = documents ? l.views.q.rows(a, n) : l.views.q;
    fp.k = documents ? l.views.k.rows(a, n) : l.views.k;
    fp.v = documents ? l.views.v.rows(a, n) : l.views.v;
    fp.scale = p.resolved_scale();
    fp.mask = mask;
    const cpu::Reference ref = cpu::naive_attention(fp);
    const int64_t rows = fp.q.len, H = p.q_heads;
    scatter_part(ref.o, p.batch, H, rows, p.head_dim, [&](int64_t b, int64_t h, int64_t t, int64_t d, double x) {
      store_from_float(out.data, p.dtype, out.offset(b, h, a + t) + d, float(x));
    });
    scatter_part(ref.lse, p.batch, H, rows, 1, [&](int64_t b, int64_t h, int64_t t, int64_t, double x) {
      l.views.lse[size_t((b * H + h) * T + a + t)] = float(x);
    });
  }
  s.compute_s = seconds_since(t0);
  return s;
}

// The oracle's backward (--impl naive --backward), per packed document like its forward: dq, dk
// and dv of g's dO into g's gradient buffers (host memory: the oracle runs on one CPU process).
void run_naive_backward(const GlobalProblem& p, const BackwardBuffers& g) {
  const bool documents = p.doc_bounds().size() >= 2;
  const BackwardParams& bp = g.params;
  for (const auto& [a, n, mask] : oracle_parts(p)) {
    BackwardParams dp = bp;
    if (documents) {
      for (auto [dst, src] : {std::pair{&dp.q, &bp.q}, {&dp.k, &bp.k}, {&dp.v, &bp.v}, {&dp.dout, &bp.dout}})
        *dst = src->rows(a, n);
    }
    dp.mask = mask;
    const cpu::GradReference r = cpu::naive_backward(dp);
    for (auto [got, view, H, rows] : {std::tuple{&r.dq, bp.dq, p.q_heads, dp.q.len},
                                      std::tuple{&r.dk, bp.dk, p.kv_heads, dp.k.len},
                                      std::tuple{&r.dv, bp.dv, p.kv_heads, dp.k.len}}) {
      auto* f = static_cast<float*>(view.data);
      scatter_part(*got, p.batch, H, rows, p.head_dim, [&](int64_t b, int64_t h, int64_t t, int64_t d, double x) {
        f[view.offset(b, h, a + t) + d] = float(x);
      });
    }
  }
}

// Bytes of K and V that one call reads once: what bounds a decode, whose rate is K/V bandwidth.
double kv_read_bytes(const GlobalProblem& p) {
  return 2.0 * double(p.batch) * double(p.kv_heads) * double(p.kv_len) * double(p.head_dim) * dtype_size(p.dtype);
}

struct SizeResult {
  int64_t seq = 0;
  std::string impl;
  double median_s = 0, flops = 0, hidden = -1;
  double kv_bytes = 0;  // decode sweeps: K/V bytes read per call (0 in a ring sweep)
  Summary sum;
  bool pass = true;
  bool checked = false;  // compared with the reference (else only non-finite values were counted)
  double backward_s = 0;  // --backward: median backward time (0: not timed)
  int64_t grad_nonfinite = 0;
};

// One call of the implementation on every rank (the flash call synchronized).
RankStats call_once(const std::string& impl, const GlobalProblem& p, LocalProblem& local, World& w,
                    const ringattn::RunOptions& ro) {
  if (impl == "naive") return run_naive(p, local);
  RankStats stats;
  try {
    stats = run_forward(p, local, *w.backend, *w.transport, ro);
  } catch (const InvalidArgument& e) {
    throw CollectiveError(e.what());
  }
  w.backend->synchronize();
  return stats;
}

// The slowest rank's `dt` (collective).
double slowest(Transport& t, double dt, int world) {
  std::vector<double> all(static_cast<size_t>(world), 0.0);
  t.allgather(&dt, all.data(), sizeof(double));
  return *std::max_element(all.begin(), all.end());
}

// The time of one call by --timer: per-call, the median over the iterations of barrier, call and
// synchronize (slowest rank each); batch, the iterations back to back after one barrier, the total
// over the iterations (slowest rank). `call` runs one synchronized call on every rank.
template <class Call>
double time_calls(const BenchOptions& o, World& w, Call&& call) {
  Transport& t = *w.transport;
  for (int it = 0; o.timer == "batch" && it < o.warmup; ++it) call();
  if (o.timer == "batch") {
    t.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < o.iters; ++it) call();
    return slowest(t, seconds_since(t0), w.size) / o.iters;
  }
  std::vector<double> times;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    t.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    call();
    const double dt = slowest(t, seconds_since(t0), w.size);
    if (it >= o.warmup) times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// One size, one implementation, on every rank.
SizeResult bench_size(const BenchOptions& o, const GlobalProblem& p, const RingPlan* ring, const CpTransports* cp,
                      InputSource& src, World& w, const std::string& impl) {
  Transport& t = *w.transport;
  SizeResult r;
  r.seq = p.q_len;
  r.impl = impl;
  r.flops = attention_flops(p);
  if (!p.is_ring()) r.kv_bytes = kv_read_bytes(p);
  w.counter->reset_peak();  // each size reports its own workspace
  LocalProblem local = load_local(p, ring, src, *w.backend, w.rank, w.size, cp != nullptr ? cp->group_size : 1);
  local.cp = cp;
  ringattn::RunOptions ro;
  ro.tile_q = o.problem.tile_q;
  ro.tile_k = o.problem.tile_k;
  ro.deterministic = o.deterministic;
  RankStats stats;
  r.median_s = time_calls(o, w, [&] { stats = call_once(impl, p, local, w, ro); });
  const HostResult result = copy_result(p, local, *w.backend);
  CheckResult chk;
  r.checked = o.check && impl != "naive";
  if (r.checked) {
    chk = check_rows(p, src, local, result, w.rank, w.size, o.problem.check_rows, o.problem.seed + uint64_t(p.q_len));
  } else {
    chk.nan_count = count_nonfinite(p, result, &chk.lse_nonfinite);
  }
  RankReport mine = make_rank_report(w, stats, r.median_s, w.counter->peak_bytes());
  add_check(mine, chk);
  wait_after_check(r.checked, w.timeout_s, [&] { r.sum = summarize(gather_reports(t, mine)); });
  r.hidden = r.sum.hidden;
  if (o.backward) {  // after the forward's iterations: their out and lse feed the backward
    const BackwardBuffers g = make_backward(p, local, *w.backend,
                                            {o.problem.seed, "", o.deterministic, o.problem.tile_q, o.problem.tile_k});
    if (cp == nullptr) grad_transport(w);  // collective: made before the timing (--cp groups have theirs)
    r.backward_s = time_calls(o, w, [&] {
      if (impl == "naive")
        run_naive_backward(p, g);
      else
        run_backward(p, local, g, w, ro);
    });
    int64_t bad = count_nonfinite(copy_grads(g, *w.backend));
    std::vector<int64_t> all(static_cast<size_t>(w.size), 0);
    t.allgather(&bad, all.data(), sizeof(int64_t));
    for (int64_t x : all) r.grad_nonfinite += x;
  }
  r.pass = r.sum.nan_count == 0 && r.sum.violations == 0 && r.grad_nonfinite == 0;
  return r;
}

// A decode sweep (--kv-seq) sweeps the query count against a fixed cache; a ring sweep, the
// length of a self-attention problem.
bool decode_sweep(const BenchOptions& o) { return o.problem.kv_seq.has_value(); }

void print_header(std::FILE* f, const CommandLine& cl, const GlobalProblem& p, const World& w,
                  const std::vector<RankReport>& ranks) {
  const BenchOptions& o = cl.bench;
  fmt::print(f, "# ringattn bench: impl {}, device {}, transport {}, world {}{}\n", o.impl, o.problem.device,
             w.transport_name, w.size, cp_suffix(cp_group_size(o.problem.cp, w.size), w.size));
  const std::string sweep =
      decode_sweep(o) ? fmt::format("queries {}..{} x{} over a K/V cache of {} (decode, K/V split over ranks; q_offset {})",
                                    o.seq_min, o.seq_max, o.seq_factor, p.kv_len,
                                    p.q_offset ? std::to_string(*p.q_offset) : std::string("kv - queries"))
                      : fmt::format("seq {}..{} x{}", o.seq_min, o.seq_max, o.seq_factor);
  fmt::print(f, "# batch {} heads {}/{} dim {} dtype {} {} shard {} | {} | iters {} warmup {} | seed {}\n", p.batch,
             p.q_heads, p.kv_heads, p.head_dim, dtype_name(p.dtype), p.causal ? "causal" : "full",
             o.problem.shard == "auto" ? "auto (the best balanced, per size)" : sharding_name(p.sharding), sweep,
             o.iters, o.warmup, o.problem.seed);
  if (!o.docs.empty())
    fmt::print(f, "# packed documents: {} per size, drawn from the seed; rates count visible pairs only\n", o.docs);
  if (!p.window.none())
    fmt::print(f, "# window {},{}: rates count visible pairs only\n", p.window.left, p.window.right);
  fmt::print(f, "# hops: ring hops taken (the ring stops after the last one that computes); sent: K/V bytes all ranks "
             "sent in one call\n");
  fmt::print(f, "# flags: {}\n", given_flags_line(cl));
  fmt::print(f, "# check: {}\n", o.impl == "naive" ? "none (the fp64 oracle is the reference; non-finite values counted)"
                                 : o.check         ? "fp64 naive reference (all rows when small, a seeded sample when large)"
                                                   : "off (non-finite values still counted)");
  fmt::print(f, "# time: {}\n", o.timer == "batch"
                                    ? "batch: the iterations back to back, one synchronize at the end, total / iters"
                                    : "per-call: barrier + call + synchronize per iteration, the median");
  fmt::print(f, "# rate: FLOP/s = 4 x batch x heads x dim x visible query-key pairs / time{}\n",
             decode_sweep(o) ? "; kv_GB/s = K and V read once per call (2 x batch x kv_heads x kv_len x dim x "
                               "dtype size) / time"
                             : "");
  fmt::print(f, "#\n");
  for (const RankReport& r : ranks) fmt::print(f, "#  Rank {:>3} Host {:<20} Device {}\n", r.rank, r.host, r.device);
  fmt::print(f, "#\n");
  fmt::print(f, "# {:>9} {:>6} {:>11} {:>10} {:>8}{} {:>8} {:>4} {:>10} {:>10} {:>10} {:>6} {:>8} {:>7}\n",
             decode_sweep(o) ? "queries" : "seq", "impl", "time_ms", "rate", "unit",
             decode_sweep(o) ? fmt::format(" {:>9}", "kv_GB/s") : std::string(), "hidden%", "hops", "sent",
             "max_abs", "max_rel", "#nan", "rss", "check");
}

void print_row(std::FILE* f, const SizeResult& r, bool decode) {
  const double rate = r.median_s > 0 ? r.flops / r.median_s : 0;
  const bool tera = rate >= 1e12;
  // Without the check the error columns say "-", not a zero that looks measured.
  const auto err = [&](double e) { return r.checked ? fmt::format("{:.2e}", e) : std::string("-"); };
  const std::string kv = decode ? fmt::format(" {:>9.2f}", r.median_s > 0 ? r.kv_bytes / r.median_s / 1e9 : 0.0) : "";
  fmt::print(f, "  {:>9} {:>6} {:>11.3f} {:>10.2f} {:>8}{} {:>8} {:>4} {:>10} {:>10} {:>10} {:>6} {:>8} {:>7}\n", r.seq,
             r.impl, r.median_s * 1e3, tera ? rate / 1e12 : rate / 1e9, tera ? "TFLOP/s" : "GFLOP/s", kv,
             r.hidden >= 0 ? fmt::format("{:.1f}", 100 * r.hidden) : std::string("n/a"), r.sum.hops,
             human_bytes(double(r.sum.bytes_sent)), err(r.sum.max_abs),
             err(r.sum.max_rel), r.sum.nan_count, human_bytes(double(r.sum.peak_rss)),
             !r.pass ? "FAILED" : r.checked ? "OK" : "-");
  std::fflush(f);
}

// --backward: the backward's time and rate (FlashAttention's 2.5x the forward's FLOPs), and the
// forward+backward total.
void print_backward_row(std::FILE* f, const SizeResult& r) {
  const double total_s = r.median_s + r.backward_s;
  fmt::print(f, "# seq {}: backward {:.3f} ms, {} (2.5x the forward's FLOPs); forward+backward {:.3f} ms, {}; "
             "non-finite gradients {}\n", r.seq, r.backward_s * 1e3, rate_string(kBackwardFlopFactor * r.flops, r.backward_s),
             total_s * 1e3, rate_string((1 + kBackwardFlopFactor) * r.flops, total_s), r.grad_nonfinite);
  std::fflush(f);
}

void add_backward_fields(nlohmann::json& row, const SizeResult& r) {
  const double bflops = kBackwardFlopFactor * r.flops, total_s = r.median_s + r.backward_s;
  row["backward_median_s"] = r.backward_s;
  row["backward_flops"] = bflops;
  row["backward_gflops_per_s"] = bflops / r.backward_s / 1e9;
  row["fwd_bwd_median_s"] = total_s;
  row["fwd_bwd_gflops_per_s"] = (r.flops + bflops) / total_s / 1e9;
  row["grad_nonfinite"] = r.grad_nonfinite;
}

nlohmann::json size_json(const SizeResult& r, const GlobalProblem& p) {
  nlohmann::json j = {{"seq", r.seq}, {"impl", r.impl}, {"median_s", r.median_s}, {"flops", r.flops},
                      {"gflops_per_s", r.median_s > 0 ? r.flops / r.median_s / 1e9 : 0.0},
                      {"hidden_fraction", r.hidden},
                      {"hops", r.sum.hops}, {"bytes_sent", r.sum.bytes_sent},
                      {"checked", r.checked},
                      {"max_abs_error", r.checked ? nlohmann::json(r.sum.max_abs) : nlohmann::json(nullptr)},
                      {"max_rel_error", r.checked ? nlohmann::json(r.sum.max_rel) : nlohmann::json(nullptr)},
                      {"nonfinite", r.sum.nan_count},
                      {"peak_rss_bytes", r.sum.peak_rss}, {"workspace_bytes", r.sum.workspace}, {"pass", r.pass}};
  j["kv_len"] = p.kv_len;
  j["q_offset"] = p.resolved_q_offset();
  if (!p.is_ring()) {
    j["kv_bytes_read"] = r.kv_bytes;
    j["kv_gb_per_s"] = r.median_s > 0 ? r.kv_bytes / r.median_s / 1e9 : 0.0;
  }
  return j;
}

// The sizes of the sweep, each rounded to a token: every length splits over every world (uneven
// shards), and a decode sweep replicates the queries on every rank. The ends are the given
// values exactly (a double holds integers only to 2^53); the sizes between are the geometric ones.
std::vector<int64_t> sweep_sizes(const BenchOptions& o) {
  std::vector<int64_t> sizes{o.seq_min};
  const double last = double(o.seq_max);
  for (double s = double(o.seq_min) * o.seq_factor; s <= last * (1 + 1e-9); s *= o.seq_factor) {
    const int64_t n = s >= last * (1 - 1e-9) ? o.seq_max : std::max<int64_t>(1, int64_t(std::llround(s)));
    if (n > sizes.back()) sizes.push_back(n);
  }
  return sizes;
}

// One size of the sweep: its problem and, for a ring, its plan (made once, for every call).
struct SweepSize {
  GlobalProblem p;
  std::optional<RingPlan> ring;  // none for a decode and for --cp groups (U > 1)
};

// The problem of one size: self-attention of n tokens (with its ring plan for this rank), or n
// queries against the fixed cache. Throws InvalidArgument (the same on every rank) when it
// cannot run.
SweepSize problem_at(const BenchOptions& o, const GlobalProblem& base, int64_t n, int rank, int world, int U) {
  GlobalProblem p = base;
  p.q_len = n;
  if (!decode_sweep(o)) {
    p.kv_len = n;
    p.q_offset.reset();
    if (!o.docs.empty()) p.doc_lens = generate_documents(o.docs, n, o.problem.seed);
    validate_problem(p, world);
    if (U > 1) {  // --shard auto over the ring of the groups, which the hybrid run plans itself
      plan_ring(o.problem, p, world / U, rank / U);
      return {std::move(p), std::nullopt};
    }
    std::optional<RingPlan> ring = plan_ring(o.problem, p, world, rank);
    return {std::move(p), std::move(ring)};
  }
  try {
    validate_problem(p, world);
  } catch (const InvalidArgument& e) {
    fail_arg("bench --kv-seq {}, {} queries: {}", p.kv_len, n, e.what());
  }
  if (p.is_ring())
    fail_arg("bench --kv-seq {}: the sweep reaches {} queries at q_offset 0, which is self-attention (a ring run), "
             "not decode; keep -e/--seq-max below --kv-seq, give another --q-offset, or drop --kv-seq for a ring "
             "sweep", p.kv_len, n);
  return {std::move(p), std::nullopt};
}

// Every rank sees the same flags, so these errors are collective.
void check_bench(const BenchOptions& o, const World& w) {
  if (o.seq_max < o.seq_min)
    throw CollectiveError(fmt::format("--seq-max {} is below --seq-min {}", o.seq_max, o.seq_min));
  if (o.backward && w.size > 1 && decode_sweep(o))
    throw CollectiveError(fmt::format("bench --backward --kv-seq over {} ranks: the ring backward needs self-attention, "
                                      "a --kv-seq sweep is decode; drop --kv-seq or run it on one process", w.size));
  if ((o.impl == "naive" || o.impl == "both") && (w.size != 1 || o.problem.device != "cpu"))
    throw CollectiveError(fmt::format("--impl {} runs the fp64 oracle on one CPU process (got --device {} over {} ranks)",
                                      o.impl, o.problem.device, w.size));
}

// The footer and the JSON record (rank 0). Returns the exit code.
int finish_sweep(std::FILE* f, const CommandLine& cl, const World& w, const GlobalProblem& p,
                 const std::vector<RankReport>& ranks, const nlohmann::json& rows, bool all_ok, bool any_checked) {
  const BenchOptions& o = cl.bench;
  fmt::print(f, "# Out of tolerance or non-finite results: {}\n",
             !all_ok        ? "some (see the check column)"
             : any_checked ? "none"
                           : "no non-finite values; tolerance not checked");
  fmt::print(f, "# Result: {}\n", !all_ok ? "FAILED" : any_checked ? "OK" : "not checked");
  std::fflush(f);
  const int code = all_ok ? kExitOk : kExitCheckFailed;
  if (o.json_file.empty()) return code;
  nlohmann::json j = {{"command", "bench"},  {"impl", o.impl},       {"device", o.problem.device},
                      {"transport", w.transport_name}, {"world", w.size}, {"problem", problem_json(p)},
                      {"sweep", decode_sweep(o) ? "decode" : "ring"},
                      {"iters", o.iters},    {"warmup", o.warmup},   {"timer", o.timer}, {"sizes", rows},
                      {"ranks", ranks_json(ranks)},    {"pass", all_ok},
                      {"checked", any_checked}, {"flags", flags_json(cl)}};
  for (const char* k : {"q_len", "kv_len", "q_offset"}) j["problem"].erase(k);  // per size, in "sizes"
  try {
    write_json(o.json_file, j);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return kExitError;
  }
  return code;
}

int bench_on(const CommandLine& cl, World& w) {
  const BenchOptions& o = cl.bench;
  Transport& t = *w.transport;
  check_bench(o, w);
  std::string error;
  ProblemSetup setup;
  std::vector<SweepSize> problems;
  try {
    setup = setup_problem(o.problem);
    setup.cp_group = cp_group_size(o.problem.cp, w.size);
    if (setup.cp_group > 1 && decode_sweep(o))
      fail_arg("--cp {} runs self-attention; a --kv-seq sweep is decode: use --cp ring", o.problem.cp);
    check_cp(o.problem.cp, setup.problem, setup.cp_group, w.backend->device_memory(), w.fault.active());
    for (const int64_t n : sweep_sizes(o))
      problems.push_back(problem_at(o, setup.problem, n, w.rank, w.size, setup.cp_group));
    // A plan fires in the first ring run, the first size's (a decode sweep has no hops to fault,
    // the naive oracle no ring).
    if (o.impl == "naive" && w.fault.active())
      fail_arg("{} applies to ring runs; bench --impl naive runs the oracle only", w.fault.text());
    if (!problems.empty()) try {
        check_fault_plan(w.fault, problems.front().p, ring_of(problems.front().ring), w.size, o.backward);
      } catch (const InvalidArgument& e) {
        fail_arg("{} (bench faults the ring of its first size, seq {}: -b sets it)", e.what(), problems.front().p.q_len);
      }
    // Last (as run's): only rank 0 writes, and its verdict is shared below; a problem every rank
    // meets is what every rank reports first.
    if (w.rank == 0) check_bench_outputs(o);
  } catch (const InvalidArgument& e) {
    error = e.what();
  }
  if (agree_on_errors(t, error.empty() ? kExitOk : kExitError, error) != kExitOk) return kExitError;
  const std::vector<std::string> impls = o.impl == "both" ? std::vector<std::string>{"flash", "naive"}
                                                          : std::vector<std::string>{o.impl};
  CpTransports cp;  // --cp groups: split once, after the agreement, for every size
  if (setup.cp_group > 1) cp = split_cp(t, setup.cp_group);
  RankReport me = make_rank_report(w, RankStats{}, 0, 0);
  const auto ranks = gather_reports(t, me);
  // With --json - the record owns stdout; the table moves to stderr.
  std::FILE* f = o.json_file == "-" ? stderr : stdout;
  if (w.rank == 0) print_header(f, cl, setup.problem, w, ranks);

  bool all_ok = true, any_checked = false;
  nlohmann::json rows = nlohmann::json::array();
  const auto sweep_t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < problems.size(); ++i) {
    const GlobalProblem& p = problems[i].p;
    // A long sweep says where it is, on stderr so the table on stdout stays clean to parse; the
    // first seconds stay quiet so short sweeps print nothing extra. '#' keeps it a comment line.
    const double elapsed = seconds_since(sweep_t0);
    if (w.rank == 0 && elapsed > kProgressAfterS) {
      fmt::print(stderr, "# [{}/{}] seq {} ({:.1f} s into the sweep)\n", i + 1, problems.size(), p.q_len, elapsed);
      std::fflush(stderr);
    }
    double flash_s = 0;
    for (const std::string& impl : impls) {
      const SizeResult r =
          bench_size(o, p, ring_of(problems[i].ring), setup.cp_group > 1 ? &cp : nullptr, *setup.source, w, impl);
      all_ok = all_ok && r.pass;
      any_checked = any_checked || r.checked;
      if (impl == "flash") flash_s = r.median_s;
      if (w.rank != 0) continue;
      print_row(f, r, decode_sweep(o));
      if (r.backward_s > 0) print_backward_row(f, r);
      if (impl == "naive" && flash_s > 0)
        fmt::print(f, "# seq {}: flash is {:.1f}x the naive reference ({:.2f} vs {:.2f} GFLOP/s)\n", p.q_len,
                   r.median_s / flash_s, r.flops / flash_s / 1e9, r.flops / r.median_s / 1e9);
      rows.push_back(size_json(r, p));
      if (r.backward_s > 0) add_backward_fields(rows.back(), r);
    }
  }
  int code = all_ok ? kExitOk : kExitCheckFailed;
  if (w.rank == 0) code = finish_sweep(f, cl, w, setup.problem, ranks, rows, all_ok, any_checked);
  return agree_exit_code(t, code);
}

}  // namespace

int bench_command(const CommandLine& cl, MpiSession& mpi) {
  World w = make_world(cl.bench.problem, cl.env, mpi, true);
  return run_guarded(w, [&] { return bench_on(cl, w); });
}

}  // namespace ringattn::cli
