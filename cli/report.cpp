#include "cli/report.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "runner/io/atomic_file.hpp"
#include "core/error.hpp"
#include "core/host.hpp"
#include "runner/diagnostics/log.hpp"
#include "runner/diagnostics/peak_memory.hpp"

namespace ringattn::cli {

RankReport make_rank_report(const World& w, const RankStats& s, double wall_s, uint64_t workspace) {
  RankReport r;
  r.rank = w.rank;
  std::snprintf(r.host, sizeof(r.host), "%s", host_name().c_str());
  std::snprintf(r.device, sizeof(r.device), "%s", w.device_label.c_str());
  r.wall_s = wall_s;
  r.compute_s = s.compute_s;
  r.exposed_comm_s = s.exposed_comm_s;
  r.transfer_s = s.transfer_s;
  r.hidden = s.hidden_fraction();
  r.bytes_sent = s.bytes_sent;
  r.group_bytes_sent = s.group_bytes_sent;
  r.hops = int64_t(s.hops.size());
  r.peak_rss = peak_rss_bytes();
  r.workspace = workspace;
  return r;
}

void add_check(RankReport& r, const CheckResult& c) {
  r.rows_checked = c.rows_checked;
  r.rows_total = c.rows_total;
  r.nan_count = c.nan_count;
  r.lse_nonfinite = c.lse_nonfinite;
  r.violations = c.violations;
  r.max_abs = c.max_abs;
  r.max_rel = c.max_rel;
  r.max_lse_abs = c.max_lse_abs;
}

std::vector<RankReport> gather_reports(Transport& t, const RankReport& mine) {
  std::vector<RankReport> all(size_t(t.size()));
  t.allgather(&mine, all.data(), sizeof(RankReport));
  return all;
}

Summary summarize(const std::vector<RankReport>& all) {
  Summary s;
  double hidden_sum = 0;
  int hidden_n = 0;
  for (const RankReport& r : all) {
    s.wall_s = std::max(s.wall_s, r.wall_s);
    s.setup_s = std::max(s.setup_s, r.setup_s);
    s.world_s = std::max(s.world_s, r.world_s);
    s.inputs_s = std::max(s.inputs_s, r.inputs_s);
    s.warm_s = std::max(s.warm_s, r.warm_s);
    s.max_abs = std::max(s.max_abs, r.max_abs);
    s.max_rel = std::max(s.max_rel, r.max_rel);
    s.max_lse_abs = std::max(s.max_lse_abs, r.max_lse_abs);
    s.rows_checked += r.rows_checked;
    s.rows_total += r.rows_total;
    s.nan_count += r.nan_count;
    s.lse_nonfinite += r.lse_nonfinite;
    s.violations += r.violations;
    s.peak_rss = std::max(s.peak_rss, r.peak_rss);
    s.workspace = std::max(s.workspace, r.workspace);
    s.bytes_sent += r.bytes_sent;
    s.hops = std::max(s.hops, r.hops);
    if (r.hidden >= 0) {
      hidden_sum += r.hidden;
      ++hidden_n;
    }
  }
  if (hidden_n > 0) s.hidden = hidden_sum / hidden_n;
  return s;
}

std::string problem_line(const GlobalProblem& p) {
  const char* kind = p.kv_heads == p.q_heads ? "MHA" : p.kv_heads == 1 ? "MQA" : "GQA";
  return fmt::format("batch {}, heads {}/{} ({}), q_len {}, kv_len {}, dim {}, {}, {}, q_offset {}, {}", p.batch,
                     p.q_heads, p.kv_heads, kind, p.q_len, p.kv_len, p.head_dim, dtype_name(p.dtype),
                     p.causal ? "causal" : "full", p.resolved_q_offset(),
                     p.is_ring() ? fmt::format("ring, {} sharding", sharding_name(p.sharding))
                                 : std::string("kv-sharded decode")) +
         (p.doc_lens.empty() ? "" : fmt::format(", {} packed documents", p.doc_lens.size())) +
         (p.window.none() ? "" : fmt::format(", window {},{}", p.window.left, p.window.right));
}

std::string human_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}

std::string rate_string(double flops, double seconds) {
  if (seconds <= 0) return "n/a";
  const double r = flops / seconds;
  if (r >= 1e12) return fmt::format("{:.2f} TFLOP/s", r / 1e12);
  return fmt::format("{:.2f} GFLOP/s", r / 1e9);
}

void stage_json(FileSet& files, const std::string& path, const nlohmann::json& j) {
  if (path == "-") {
    std::cout << j.dump() << std::endl;
    return;
  }
  try {
    auto f = std::make_unique<AtomicFile>(path);
    const std::string text = j.dump() + "\n";
    f->write(text.data(), text.size());
    files.add(std::move(f));
  } catch (const std::exception& e) {
    fail_runtime("--json: {}", e.what());
  }
}

void write_json(const std::string& path, const nlohmann::json& j) {
  FileSet files;
  stage_json(files, path, j);
  files.commit();
}

nlohmann::json problem_json(const GlobalProblem& p) {
  return {{"batch", p.batch},       {"q_heads", p.q_heads},   {"kv_heads", p.kv_heads},
          {"q_len", p.q_len},       {"kv_len", p.kv_len},     {"head_dim", p.head_dim},
          {"dtype", dtype_name(p.dtype)}, {"causal", p.causal}, {"q_offset", p.resolved_q_offset()},
          {"sharding", sharding_name(p.sharding)}, {"mode", p.is_ring() ? "ring" : "decode"},
          {"scale", p.resolved_scale()}, {"documents", p.doc_lens.size()},
          {"window", {p.window.left, p.window.right}}};
}

nlohmann::json ranks_json(const std::vector<RankReport>& all) {
  nlohmann::json a = nlohmann::json::array();
  for (const RankReport& r : all)
    a.push_back({{"rank", r.rank},
                 {"host", r.host},
                 {"device", r.device},
                 {"wall_s", r.wall_s},
                 {"setup_s", r.setup_s},
                 {"setup", {{"world_s", r.world_s}, {"inputs_s", r.inputs_s}, {"warm_s", r.warm_s}}},
                 {"compute_s", r.compute_s},
                 {"exposed_comm_s", r.exposed_comm_s},
                 {"transfer_s", r.transfer_s},
                 {"hidden_fraction", r.hidden},
                 {"bytes_sent", r.bytes_sent},
                 {"group_bytes_sent", r.group_bytes_sent},
                 {"hops", r.hops},
                 {"peak_rss_bytes", r.peak_rss},
                 {"workspace_bytes", r.workspace},
                 {"rows_checked", r.rows_checked},
                 {"nan_count", r.nan_count},
                 {"max_abs_error", r.max_abs},
                 {"max_rel_error", r.max_rel}});
  return a;
}

}  // namespace ringattn::cli
