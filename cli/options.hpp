// The flags of `ringattn run`, `bench` and `plan`, parsed by CLI11 into plain structs (the flags
// themselves, their checks and what is derived from them: cli/flags.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/settings.hpp"

namespace ringattn::cli {

// The largest --timeout accepted is kMaxTimeoutS (core/settings.hpp), RINGATTN_MPI_TIMEOUT_S's.

// The problem and where it runs: shared by run and bench.
struct ProblemOptions {
  int64_t batch = 1, heads = 8, kv_heads = 2, seq = 2048, dim = 64;
  std::optional<int64_t> kv_seq;    // default: seq
  std::optional<int64_t> q_offset;  // default: kv_len - q_len
  uint64_t seed = 1;
  std::string q_file, k_file, v_file;
  std::string layout;           // --layout bhsd|bshd of the .npy files (empty: not given, bhsd; cli/file_layout.hpp)
  std::string doc_lens;         // packed documents: "1000,3000,517" (lengths summing to the sequence)
  std::string cu_seqlens_file;  // or their boundaries: a .npy of int32/int64 prefix sums from 0
  std::string window;           // sliding window "LEFT,RIGHT" (FlashAttention's window_size; -1 unbounded)
  bool causal = false;
  std::string device = "cpu";       // cpu | cuda
  std::string dtype;                // empty: fp32 on cpu, bf16 on cuda, the files' dtype for files
  int tile_q = 0, tile_k = 0;
  std::string shard = "auto";       // auto: the best balanced for the mask and documents (best_sharding)
  std::string transport = "auto";   // auto | mpi | nccl | local
  std::string cp = "ring";          // context parallelism: ring | ulysses | hybrid:U (cp_group_size)
  int64_t check_rows = 0;           // 0: all rows when small, a seeded sample when large
  std::string log_level;            // empty: RINGATTN_LOG_LEVEL, else info
  // Bound on every blocking wait (exchanges, collectives, NCCL); the first hop gets 3x for
  // connection set-up. Unset: RINGATTN_MPI_TIMEOUT_S, else 300 s (Settings::timeout_s).
  std::optional<double> timeout_s;

  bool from_files() const { return !q_file.empty() || !k_file.empty() || !v_file.empty(); }
};

struct RunOptions {
  ProblemOptions problem;
  bool check = false;
  bool check_finite = false;  // NaN/Inf in q, k, v (before the run) or out, lse (after) is an error
  bool dry_run = false;       // validate world, environment and problem; no attention
  std::string out_file, lse_file, json_file;
  // --backward: the gradients of sum(dO * out) after the forward (the ring backward under mpirun).
  bool backward = false;
  bool deterministic = false;  // --deterministic: bitwise reproducible dq (GPU; the CPU always is)
  std::string do_file, dq_file, dk_file, dv_file;
};

struct BenchOptions {
  ProblemOptions problem;
  int64_t seq_min = 1024, seq_max = 8192;
  double seq_factor = 2.0;
  int iters = 5, warmup = 1;
  // per-call: barrier, one call, synchronize, per iteration (the median of the slowest rank);
  // batch: the iterations back to back after one barrier, one synchronize at the end, total / iters
  // (how shared/bench/peers.py times the peers: short calls are not charged a barrier each).
  std::string timer = "per-call";
  std::string impl = "flash";  // flash | naive (the fp64 oracle, CPU, one process)
  std::string docs;            // packed documents per size: "uniform:MAX" or "fixed:L" (empty: none)
  bool check = true;
  bool backward = false;  // --backward: time forward + backward per size
  bool deterministic = false;
  std::string json_file;
};

// `ringattn plan`: the schedule only, for any rank count, without MPI.
struct PlanOptions {
  int64_t seq = 8192, batch = 1, heads = 8, kv_heads = 2, dim = 64;
  int ranks = 4;
  std::string shard = "auto";
  bool causal = false;
  std::string window;        // "LEFT,RIGHT", as for run
  std::string doc_lens;      // packed documents, as for run
  std::string dtype = "fp32";  // scales the bytes column
  std::string cp = "ring";     // the layout whose rows are printed (run's --cp); every layout is summed up
};

// The whole command line: every subcommand's options after parsing. parse_command_line fills it
// without running anything (the fuzz test calls it with random argv).
struct CommandLine {
  RunOptions run;
  BenchOptions bench;
  PlanOptions plan;
  bool show_version = false;
  bool show_env = false;  // --help-env: the RINGATTN_* variables (core/settings.hpp)
  std::string command;  // "run", "bench", "plan" or "" (none: help, --version or --help-env)
  std::vector<std::string> given;  // the flags given on the command line (cli/flags.hpp names), table order
  // The RINGATTN_* variables: main sets settings() (read once, before the command line is parsed);
  // every layer below takes what it needs from here. Default: every variable unset.
  Settings env;
};

// The default command line: `ringattn` alone is `ringattn run --causal --check`.
inline constexpr const char* kDefaultArgs = "run --causal --check";

// Builds the CLI11 app over `cl`. The app keeps pointers into `cl`: keep both alive together.
std::unique_ptr<CLI::App> make_app(CommandLine& cl);

// Parses argv (argc <= 1: kDefaultArgs) and runs the cross-flag checks of the chosen command.
// Throws CLI::ParseError (CLI::CallForHelp when no command was given) or InvalidArgument.
void parse_command_line(CLI::App& app, CommandLine& cl, int argc, const char* const* argv);

// The help to read after `app` refused a command line: "(see ringattn plan --help)" for the
// subcommand that was being parsed, "(see ringattn --help)" before any subcommand.
std::string help_pointer(const CLI::App& app);

// What `ringattn --help-env` prints: every RINGATTN_* variable (setting_docs, core/settings.hpp)
// with its values, default and effect.
std::string environment_help();

// Cross-flag checks CLI11 cannot express; throws InvalidArgument naming the flags.
void validate_problem_options(const ProblemOptions& o);
// --heads a multiple of --kv-heads (run, bench and plan); InvalidArgument naming both and an example.
void check_head_counts(int64_t heads, int64_t kv_heads);
// A --transport kind that moves device buffers (comm/transport_factory.hpp: nccl) with --device
// cpu: InvalidArgument naming both. Unknown kinds pass (make_world names them).
void check_transport_device(const std::string& transport, const std::string& device);

}  // namespace ringattn::cli
