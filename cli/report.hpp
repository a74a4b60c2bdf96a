// What a run reports: one fixed-size record per rank, gathered to every rank, printed by rank 0
// as a table and written as JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/check.hpp"
#include "cli/world.hpp"
#include "runner/io/atomic_file.hpp"

namespace ringattn::cli {

// Trivially copyable, so one allgather moves it.
struct RankReport {
  int rank = 0;
  char host[64] = {0};
  char device[32] = {0};
  double wall_s = 0;           // the timed call on this rank
  // run: the setup before it (not timed in wall_s): world (transport, communicator, backend),
  // inputs (allocation and fill), the ring's warm-up exchange (-1: none); setup_s is their sum.
  double setup_s = 0, world_s = 0, inputs_s = 0, warm_s = -1;
  double compute_s = 0, exposed_comm_s = 0, transfer_s = -1, hidden = -1;
  uint64_t bytes_sent = 0;
  uint64_t group_bytes_sent = 0;  // --cp groups: the all-to-alls' part of bytes_sent
  int64_t hops = 0;  // ring hops taken (the ring stops after the last one that computes); 0 for decode
  uint64_t peak_rss = 0, workspace = 0;
  int64_t rows_checked = 0, rows_total = 0, nan_count = 0, violations = 0;
  int64_t lse_nonfinite = 0;  // of nan_count
  double max_abs = 0, max_rel = 0, max_lse_abs = 0;
};

RankReport make_rank_report(const World& w, const RankStats& s, double wall_s, uint64_t workspace);
void add_check(RankReport& r, const CheckResult& c);

// Every rank's report, in rank order (collective).
std::vector<RankReport> gather_reports(Transport& t, const RankReport& mine);

// Sums and maxima over ranks.
struct Summary {
  double wall_s = 0;  // slowest rank
  double setup_s = 0, world_s = 0, inputs_s = 0, warm_s = -1;  // slowest rank, each on its own
  double max_abs = 0, max_rel = 0, max_lse_abs = 0;
  int64_t rows_checked = 0, rows_total = 0, nan_count = 0, violations = 0, lse_nonfinite = 0;
  uint64_t peak_rss = 0, workspace = 0, bytes_sent = 0;
  int64_t hops = 0;    // the most any rank took
  double hidden = -1;  // mean over ranks that could measure it
};
Summary summarize(const std::vector<RankReport>& all);

std::string problem_line(const GlobalProblem& p);
std::string human_bytes(double bytes);
std::string rate_string(double flops, double seconds);  // "12.3 GFLOP/s" or "1.23 TFLOP/s"

// Writes `j` to `path` ('-': stdout), one line. Throws on failure.
void write_json(const std::string& path, const nlohmann::json& j);
// The same into `files`, which moves it into place with the run's other outputs ('-': printed
// now). Throws on failure.
void stage_json(FileSet& files, const std::string& path, const nlohmann::json& j);
nlohmann::json problem_json(const GlobalProblem& p);
nlohmann::json ranks_json(const std::vector<RankReport>& all);

}  // namespace ringattn::cli
