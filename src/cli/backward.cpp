#include "cli/backward.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/check.hpp"
#include "cli/finite.hpp"
#include "cli/gather.hpp"
#include "cli/outputs.hpp"
#include "cli/report.hpp"
#include "cli/run.hpp"
#include "core/timer.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

namespace ringattn::cli {
namespace {

// Bound on max |g - ref| / max |ref| per gradient, by input dtype. fp32: arithmetic only
// (measured near 1e-6). fp16/bf16: the oracle reads the same half inputs, but the forward's
// output is rounded to the dtype, and D = rowsum(dO * out) with it (measured up to 2e-3 for bf16).
double grad_tolerance(DType t) {
  switch (t) {
    case DType::F32: return 1e-4;
    case DType::F16: return 5e-3;
    case DType::BF16: return 2e-2;
  }
  return 0;
}

std::vector<int64_t> shape_of(const TensorView& x) { return {x.batch, x.heads, x.len, x.dim}; }

// Fills dO from the --do file (shape of q, any of its dtypes) into host memory `dst` in dtype.
void read_dout(const std::string& path, const TensorView& q, void* dst) {
  expect_regular_file("--do", path);
  NpyReader r(path);
  if (r.header().shape != shape_of(q))
    fail_arg("--do {} holds shape {} but q is [{}, {}, {}, {}]: dO must have the shape of q", path,
             r.header().shape_string(), q.batch, q.heads, q.len, q.dim);
  r.read(0, q.numel(), dst, q.dtype);
}

// A host copy of a contiguous view in backend memory (the view itself when the backend's memory
// is the host's).
TensorView host_view(const TensorView& x, Backend& b, std::vector<uint8_t>& store) {
  if (!b.device_memory()) return x;
  store.resize(size_t(x.numel() * dtype_size(x.dtype)));
  b.copy_to_host(store.data(), x.data, store.size());
  TensorView h = x;
  h.data = store.data();
  return h;
}

struct GradError {
  double max_abs = 0, max_ref = 0;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};

GradError compare(const std::vector<float>& g, const std::vector<double>& ref) {
  GradError e;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::abs(double(g[i]) - ref[i]);
    e.max_abs = std::isnan(d) ? INFINITY : std::max(e.max_abs, d);
    e.max_ref = std::max(e.max_ref, std::abs(ref[i]));
  }
  return e;
}

struct GradCheck {
  GradError dq, dk, dv;
  double tolerance = 0;
  int64_t nonfinite = 0;
  bool pass() const {
    return nonfinite == 0 && dq.rel() <= tolerance && dk.rel() <= tolerance && dv.rel() <= tolerance;
  }
};

// The gradients against the fp64 oracle over the whole problem.
GradCheck check_grads(const GlobalProblem& p, const BackwardBuffers& g, const HostGrads& h, Backend& b) {
  std::vector<uint8_t> q, k, v, dout;
  BackwardParams rp = g.params;
  rp.q = host_view(g.params.q, b, q);
  rp.k = host_view(g.params.k, b, k);
  rp.v = host_view(g.params.v, b, v);
  rp.dout = host_view(g.params.dout, b, dout);
  const cpu::GradReference ref = cpu::naive_backward(rp);
  GradCheck c;
  c.dq = compare(h.dq, ref.dq);
  c.dk = compare(h.dk, ref.dk);
  c.dv = compare(h.dv, ref.dv);
  c.tolerance = grad_tolerance(p.dtype);
  c.nonfinite = count_nonfinite(h);
  return c;
}

struct Timings {
  double forward_s = 0, backward_s = 0;
};

void print_report(std::FILE* f, const GlobalProblem& p, const World& w, const Timings& t, const GradCheck* c,
                  bool deterministic) {
  const double flops = attention_flops(p), bflops = kBackwardFlopFactor * flops;
  fmt::print(f, "# ringattn run --backward: {}\n", problem_line(p));
  fmt::print(f, "# world {}, transport {}, device {}, dq {}\n", w.size, w.transport_name, w.device_label,
             deterministic ? "deterministic" : "fast");
  fmt::print(f, "forward  {:.3f} ms, {}\n", t.forward_s * 1e3, rate_string(flops, t.forward_s));
  fmt::print(f, "backward {:.3f} ms, {} ({:.3f} GFLOP = 2.5 x the forward's)\n", t.backward_s * 1e3,
             rate_string(bflops, t.backward_s), bflops / 1e9);
  fmt::print(f, "total    {:.3f} ms, {} (forward + backward, 3.5 x the forward's FLOPs)\n",
             (t.forward_s + t.backward_s) * 1e3, rate_string(flops + bflops, t.forward_s + t.backward_s));
  if (c != nullptr) {
    fmt::print(f, "check    dq max abs {:.3e} max rel {:.3e} | dk max abs {:.3e} max rel {:.3e} | dv max abs {:.3e} max "
               "rel {:.3e} | non-finite {} -> {}\n", c->dq.max_abs, c->dq.rel(), c->dk.max_abs, c->dk.rel(),
               c->dv.max_abs, c->dv.rel(), c->nonfinite, c->pass() ? "OK" : "FAILED");
    fmt::print(f, "         tolerance {}: max |g - ref| <= {:.0e} max |ref| per gradient (fp64 reference, every element)\n",
               dtype_name(p.dtype), c->tolerance);
  }
  std::fflush(f);
}

nlohmann::json grads_json(const GradCheck& c) {
  auto one = [](const GradError& e) { return nlohmann::json{{"max_abs_error", e.max_abs}, {"max_rel_error", e.rel()}}; };
  return {{"dq", one(c.dq)}, {"dk", one(c.dk)}, {"dv", one(c.dv)}, {"nonfinite", c.nonfinite},
          {"tolerance", c.tolerance}, {"pass", c.pass()}};
}

nlohmann::json run_json(const RunOptions& o, const GlobalProblem& p, const World& w, const Timings& t) {
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
          {"total_gflops_per_s", rate(flops + bflops, total)}};
}

// Writes the gradient files that were asked for; each whole or not at all.
void write_grads(const RunOptions& o, const BackwardBuffers& g, const HostGrads& h) {
  const std::pair<const std::string*, std::pair<const TensorView*, const std::vector<float>*>> files[] = {
      {&o.dq_file, {&g.params.dq, &h.dq}}, {&o.dk_file, {&g.params.dk, &h.dk}}, {&o.dv_file, {&g.params.dv, &h.dv}}};
  for (const auto& [path, what] : files)
    if (!path->empty()) write_npy(*path, shape_of(*what.first), DType::F32, what.second->data());
}

}  // namespace

void require_world_of_one(int world) {
  if (world > 1)
    throw CollectiveError(fmt::format("the ring backward is not built yet (issue 19): --backward needs a world of one "
                                      "(this job has {} ranks); run it without mpirun", world));
}

BackwardBuffers make_backward(const GlobalProblem& p, const LocalProblem& local, Backend& b, const BackwardSetup& s) {
  BackwardBuffers g;
  const TensorView& q = local.views.q;
  const size_t qn = size_t(q.numel()), kn = size_t(local.views.k.numel());
  g.dout = DeviceBuffer(b, qn * dtype_size(p.dtype));
  std::vector<uint8_t> host(qn * dtype_size(p.dtype));
  TensorView hd = bhtd_view(host.data(), p.dtype, q.batch, q.heads, q.len, q.dim);
  if (s.do_file.empty())
    fill_input(hd, s.seed, InputTensor::DO, 0, 1);
  else
    read_dout(s.do_file, q, host.data());
  b.copy_from_host(g.dout.get(), host.data(), host.size());
  g.dq = DeviceBuffer(b, qn * sizeof(float));
  g.dk = DeviceBuffer(b, kn * sizeof(float));
  g.dv = DeviceBuffer(b, kn * sizeof(float));
  // NaN poison (0xFF bytes are a NaN in fp32): the backward must write every element.
  std::vector<uint8_t> poison(std::max(qn, kn) * sizeof(float), 0xFF);
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

double time_backward(const BackwardBuffers& g, Backend& b, int warmup, int iters) {
  std::vector<double> times;
  for (int it = 0; it < warmup + iters; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    b.flash_backward(g.params);
    b.synchronize();
    if (it >= warmup) times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int backward_on(const RunOptions& o, World& w) {
  require_world_of_one(w.size);
  check_run_outputs(o);
  ProblemSetup setup = setup_problem(o.problem);
  const GlobalProblem& p = setup.problem;
  validate_problem(p, w.size);
  check_fault_for(p, w.size);
  spdlog::info("problem: {}; forward and backward on one device", problem_line(p));
  const LocalProblem local = load_local(p, *setup.source, *w.backend, 0, 1);
  if (o.check_finite)
    if (const std::string e = check_inputs_finite(p, local, *w.backend, 0, *setup.source); !e.empty())
      fail_arg("{}", e);
  const BackwardBuffers g = make_backward(p, local, *w.backend, {o.problem.seed, o.do_file, o.deterministic,
                                                                 o.problem.tile_q, o.problem.tile_k});
  ringattn::RunOptions ro;
  ro.tile_q = o.problem.tile_q;
  ro.tile_k = o.problem.tile_k;
  Timings t;
  auto t0 = std::chrono::steady_clock::now();
  run_attention(p, local.views, *w.backend, *w.transport, ro);
  w.backend->synchronize();
  t.forward_s = seconds_since(t0);
  t.backward_s = time_backward(g, *w.backend, 0, 1);

  const HostGrads h = copy_grads(g, *w.backend);
  const HostResult fwd = copy_result(p, local, *w.backend);
  int code = kExitOk;
  GradCheck c;
  if (o.check) c = check_grads(p, g, h, *w.backend);
  std::FILE* f = o.json_file == "-" ? stderr : stdout;
  print_report(f, p, w, t, o.check ? &c : nullptr, o.deterministic);
  const int64_t bad = count_nonfinite(h), bad_fwd = count_nonfinite(p, fwd);
  if (bad + bad_fwd > 0) {
    spdlog::error("non-finite results: {} in the forward's output and lse, {} in the gradients (a NaN or Inf in q, k, "
                  "v or dO; --check-finite names the first such input)", bad_fwd, bad);
    code = kExitCheckFailed;
  }
  if (o.check && !c.pass()) code = kExitCheckFailed;
  if (!o.json_file.empty()) {
    nlohmann::json j = run_json(o, p, w, t);
    if (o.check) j["check"] = grads_json(c);
    write_json(o.json_file, j);
  }
  write_grads(o, g, h);
  if (write_global_outputs(p, local, fwd, *w.transport, o.out_file, o.lse_file) != 0) code = std::max(code, kExitError);
  return code;
}

}  // namespace ringattn::cli
