#include "cli/options.hpp"
#include "cli/file_layout.hpp"
#include "cli/problem.hpp"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include "core/error.hpp"
#include "kernels/params.hpp"
#include "ringattn/ring.hpp"

namespace ringattn::cli {
namespace {

// An integer flag with its real allowed range, lo..hi (hi: the largest value of the flag's type
// unless the program allows less), in one message for every bad value ("--iters: must be an
// integer in 1..2147483647 (got '2147483648')"); CLI11's own checks print the double range or
// "Could not convert". Runs after decimal_integer, which leaves out-of-range digits to it.
template <class T>
CLI::Validator int_range(T lo, T hi = std::numeric_limits<T>::max()) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        T v{};
        const char* b = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
        const auto r = std::from_chars(b, s.data() + s.size(), v);
        if (b == s.data() + s.size() || r.ec != std::errc() || r.ptr != s.data() + s.size() || v < lo || v > hi)
          return fmt::format("must be an integer in {}..{} (got '{}')", lo, hi, s);
        return std::string();
      },
      fmt::format("{}..{}", lo, hi));
}

// A wait bound in seconds: positive and finite; 1e6 s (11 days) keeps deadlines far from the
// clock's overflow.
CLI::Validator seconds_bound() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size() || !(v > 0) || v > kMaxTimeoutS)
          return fmt::format("must be a number of seconds > 0 and <= {:g} (got '{}')", kMaxTimeoutS, s);
        return std::string();
      },
      "SECONDS");
}

// Strictly decimal: CLI11 converts integers with strtoll(..., 0), where "064" is octal (52),
// "0x10" hex and "-1" wraps to 2^64-1 for an unsigned flag. This transform runs first on every
// integer flag: it accepts [+-]digits only, checks the range of the flag's type and hands CLI11
// the canonical decimal (no leading zeros), which base detection then reads as decimal.
CLI::Validator decimal_integer(bool is_unsigned) {
  return CLI::Validator(
      [is_unsigned](std::string& s) -> std::string {
        const char* b = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
        const char* e = s.data() + s.size();
        const bool digits = b != e && (std::isdigit(static_cast<unsigned char>(*b)) || (!is_unsigned && *b == '-'));
        std::from_chars_result r{};
        std::string canon;
        if (is_unsigned) {
          uint64_t v = 0;
          r = std::from_chars(b, e, v);
          canon = std::to_string(v);
        } else {
          int64_t v = 0;
          r = std::from_chars(b, e, v);
          canon = std::to_string(v);
        }
        // Too many digits for 64 bits: every integer option has an int_range check, which names
        // the option's real range.
        if (r.ec == std::errc::result_out_of_range && digits && r.ptr == e) return std::string();
        if (!digits || r.ec != std::errc() || r.ptr != e)
          return is_unsigned ? fmt::format("must be a decimal integer in 0..{} (got '{}')", UINT64_MAX, s)
                             : fmt::format("must be a decimal integer (got '{}')", s);
        s = canon;
        return std::string();
      },
      "");
}

// Decimal numbers only for floating-point flags: std::stod and CLI11 also take hex ("0x10"),
// "inf" and "nan".
CLI::Validator decimal_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.empty() || s.find_first_not_of("0123456789.eE+-") != std::string::npos)
          return fmt::format("must be a decimal number (got '{}')", s);
        return std::string();
      },
      "");
}

// Puts the decimal transforms in front of every numeric option of `app` and its subcommands.
void make_numbers_decimal(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands({})) make_numbers_decimal(*sub);
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size() == 0) continue;  // a flag
    const std::string type = opt->get_type_name();
    if (type.rfind("UINT", 0) == 0)
      opt->transform(decimal_integer(true));
    else if (type.rfind("INT", 0) == 0)
      opt->transform(decimal_integer(false));
    else if (type.rfind("FLOAT", 0) == 0)
      opt->transform(decimal_number());
  }
}

// --layout: parse_file_layout's message for anything but bhsd and bshd.
CLI::Validator file_layout_check() {
  return CLI::Validator(
      [](std::string& s) -> std::string { return s == "bhsd" || s == "bshd" ? std::string() : bad_layout_message(s); },
      "bhsd|bshd");
}

// --window LEFT,RIGHT: the sliding window (parse_window in problem.cpp checks the text).
void add_window_flag(CLI::App& app, std::string& window) {
  app.add_option("--window", window,
                 "sliding window LEFT,RIGHT: key j visible to query i when pos(i) - LEFT <= pos(j) <= pos(i) + RIGHT; "
                 "-1 leaves a side unbounded; with --causal RIGHT is 0 or -1 (e.g. --window 4096,0)");
}

// --kv-seq and --q-offset: the K/V length and where the queries sit against it.
void add_cache_flags(CLI::App& app, ProblemOptions& o, const char* kv_help) {
  app.add_option("--kv-seq", o.kv_seq, kv_help)->check(int_range<int64_t>(1));
  app.add_option("--q-offset", o.q_offset, "position of query 0 minus position of key 0 (default kv-seq - seq)")
      ->check(int_range<int64_t>(std::numeric_limits<int64_t>::min()));
}

}  // namespace

void add_problem_flags(CLI::App& app, ProblemOptions& o, bool with_seq) {
  app.add_option("--batch", o.batch, "batch size")->check(int_range<int64_t>(1))->capture_default_str();
  app.add_option("--heads", o.heads, "query heads")->check(int_range<int64_t>(1))->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "key/value heads (heads must be a multiple: GQA, MQA when 1)")
      ->check(int_range<int64_t>(1))
      ->capture_default_str();
  if (with_seq) {
    app.add_option("--seq", o.seq, "query tokens (global)")->check(int_range<int64_t>(1))->capture_default_str();
    add_cache_flags(app, o, "key/value tokens (global; default: --seq)");
    app.add_option("--q", o.q_file,
                   "queries: .npy [batch, heads, q_len, dim] (--layout bshd: [batch, q_len, heads, dim]), <f4 or <f2");
    app.add_option("--k", o.k_file,
                   "keys: .npy [batch, kv_heads, kv_len, dim] (--layout bshd: [batch, kv_len, kv_heads, dim])");
    app.add_option("--v", o.v_file, "values: .npy, the shape of --k");
    app.add_option("--layout", o.layout,
                   "how the .npy files of --q/--k/--v, --out, --lse, --do and --dq/--dk/--dv hold their tensors: bhsd "
                   "[batch, heads, seq, dim] (default) or bshd [batch, seq, heads, dim] (--lse [batch, seq, heads])")
        ->check(file_layout_check());
    app.add_option("--doc-lens", o.doc_lens,
                   "packed documents: their lengths, comma-separated, summing to the sequence; each attends only to "
                   "itself (causal within it with --causal)");
    app.add_option("--cu-seqlens", o.cu_seqlens_file,
                   "packed documents as a .npy of int32 or int64 boundaries: 0, then the running sums of the lengths");
  }
  app.add_option("--dim", o.dim, "head dimension")->check(int_range<int64_t>(1))->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the random inputs")->check(int_range<uint64_t>(0))->capture_default_str();
  app.add_flag("--causal", o.causal, "causal mask (key j visible to query i when pos(j) <= pos(i))");
  add_window_flag(app, o.window);
  app.add_option("--device", o.device, "compute device")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "input/output dtype (default: fp32 on cpu, bf16 on cuda, the files' dtype)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--tile-q", o.tile_q, "CPU query tile, 1 to 4096 rows (0: default)")->check(int_range<int>(0, kMaxTile));
  app.add_option("--tile-k", o.tile_k, "CPU key tile, 1 to 4096 rows (0: default)")->check(int_range<int>(0, kMaxTile));
  app.add_option("--shard", o.shard, "sequence sharding over ranks (auto: the best balanced for the mask and documents; doc-zigzag: zigzag inside every document)")
      ->check(CLI::IsMember({"auto", "contiguous", "zigzag", "striped", "doc-zigzag"}))
      ->capture_default_str();
  app.add_option("--transport", o.transport, "auto: nccl between GPUs when built, mpi under mpirun, else local")
      ->check(CLI::IsMember({"auto", "mpi", "nccl", "local"}))
      ->capture_default_str();
  app.add_option("--check-rows", o.check_rows, "rows per rank the check compares (0: all when small, else a sample)")
      ->check(int_range<int64_t>(0));
  app.add_option("--log-level", o.log_level, "trace|debug|info|warn|error|off (default: $RINGATTN_LOG_LEVEL or info)");
  app.add_option("--timeout", o.timeout_s,
                 "bound in seconds on every wait for another rank (the first hop gets 3x); on expiry every rank exits "
                 "with a message (default: $RINGATTN_MPI_TIMEOUT_S or 300)")
      ->check(seconds_bound());
}

void add_run_flags(CLI::App& app, RunOptions& o) {
  add_problem_flags(app, o.problem, true);
  app.add_flag("--check", o.check, "compare with the fp64 naive reference; exit 2 when over the tolerance");
  app.add_flag("--check-finite", o.check_finite,
               "stop with an error naming the rank, tensor and index of the first NaN/Inf in q, k, v (before the "
               "run) or out, lse (after)");
  app.add_flag("--dry-run", o.dry_run,
               "check the world, environment, versions and the problem on every rank, then exit (no attention)");
  app.add_option("--out", o.out_file,
                 "write the output as <f4 .npy [batch, heads, q_len, dim] (--layout bshd: [batch, q_len, heads, dim])");
  app.add_option("--lse", o.lse_file,
                 "write the log-sum-exp as <f4 .npy [batch, heads, q_len] (--layout bshd: [batch, q_len, heads])");
  app.add_option("--json", o.json_file, "write one JSON record ('-' for stdout)");
  app.add_flag("--backward", o.backward,
               "after the forward, compute the gradients dq, dk, dv of sum(dO * out) (under mpirun: the ring "
               "backward; rank 0 writes --dq/--dk/--dv in global token order)");
  app.add_flag("--deterministic", o.deterministic, "with --backward: bitwise reproducible dq (no atomics on GPUs)");
  app.add_option("--do", o.do_file,
                 "with --backward: dO as .npy in the shape of q, in --layout (default: random from --seed); each rank "
                 "reads its rows");
  app.add_option("--dq", o.dq_file, "with --backward: write dq as <f4 .npy in the shape of q (in --layout)");
  app.add_option("--dk", o.dk_file, "with --backward: write dk as <f4 .npy in the shape of k (in --layout)");
  app.add_option("--dv", o.dv_file, "with --backward: write dv as <f4 .npy in the shape of v (in --layout)");
}

void add_bench_flags(CLI::App& app, BenchOptions& o) {
  add_problem_flags(app, o.problem, false);
  add_cache_flags(app, o.problem,
                  "decode / chunked prefill: a fixed K/V cache of this many tokens, split over the ranks; the swept "
                  "size is then the number of queries (default: none, a self-attention ring sweep)");
  app.add_option("-b,--seq-min", o.seq_min, "smallest sequence length")->check(int_range<int64_t>(1))->capture_default_str();
  app.add_option("-e,--seq-max", o.seq_max, "largest sequence length")->check(int_range<int64_t>(1))->capture_default_str();
  app.add_option("-f,--seq-factor", o.seq_factor, "multiply the length by this between sizes")
      ->check(CLI::Range(1.01, 1e6))
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->check(int_range<int>(1))->capture_default_str();
  app.add_option("-w,--warmup", o.warmup, "untimed iterations per size")->check(int_range<int>(0))->capture_default_str();
  app.add_option("--timer", o.timer,
                 "per-call: barrier + call + synchronize per iteration, the median; batch: the iterations back to "
                 "back between one barrier and one synchronize, the mean (as the peers are timed)")
      ->check(CLI::IsMember({"per-call", "batch"}))
      ->capture_default_str();
  app.add_option("--docs", o.docs,
                 "packed documents at every size, drawn from the seed: uniform:MAX (lengths uniform in [1, MAX] "
                 "until the sequence is full) or fixed:L (length L; the last may be shorter)");
  app.add_option("--impl", o.impl, "flash (the runtime), naive (the fp64 oracle; cpu, one process) or both (the ratio in one run)")
      ->check(CLI::IsMember({"flash", "naive", "both"}))
      ->capture_default_str();
  // A callback without a value: "--naive=x" is then a clean parse error, where a counting flag
  // function let std::stoll's exception escape (found by tests/cli/test_cli_fuzz.cpp).
  app.add_flag_callback("--naive", [&o]() { o.impl = "naive"; }, "same as --impl naive");
  // No "--no-check=VALUE": CLI11 2.1 negates the value of a negated flag, which overflows on
  // INT64_MIN (UBSan, found by tests/cli/test_cli_fuzz.cpp).
  app.add_flag("!--no-check", o.check, "skip the per-size correctness check")->disable_flag_override();
  app.add_option("--json", o.json_file, "write the sweep as one JSON record, its sizes in a list ('-' for stdout)");
  app.add_flag("--backward", o.backward,
               "time the backward after the forward at each size (rate counted as 2.5x the forward FLOPs) and the "
               "forward+backward total (under mpirun: the ring backward)");
  app.add_flag("--deterministic", o.deterministic, "with --backward: bitwise reproducible dq (no atomics on GPUs)");
}

void add_plan_flags(CLI::App& app, PlanOptions& o) {
  app.add_option("--seq", o.seq, "tokens (global)")->check(int_range<int64_t>(1))->capture_default_str();
  app.add_option("--ranks", o.ranks, "ranks of the ring")->check(int_range<int>(1, 1 << 20))->capture_default_str();
  app.add_option("--shard", o.shard, "sequence sharding over ranks (auto: the best balanced for the mask and documents; doc-zigzag: zigzag inside every document)")
      ->check(CLI::IsMember({"auto", "contiguous", "zigzag", "striped", "doc-zigzag"}))
      ->capture_default_str();
  app.add_flag("--causal", o.causal, "causal mask");
  add_window_flag(app, o.window);
  app.add_option("--batch", o.batch, "batch size (scales the FLOP and byte columns)")->check(int_range<int64_t>(1));
  app.add_option("--heads", o.heads, "query heads (scales the FLOP column)")->check(int_range<int64_t>(1));
  app.add_option("--kv-heads", o.kv_heads, "key/value heads (scales the byte column)")
      ->check(int_range<int64_t>(1))
      ->capture_default_str();
  app.add_option("--dim", o.dim, "head dimension (scales the FLOP and byte columns)")->check(int_range<int64_t>(1));
  app.add_option("--dtype", o.dtype, "K/V dtype (scales the byte column)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
}

std::unique_ptr<CLI::App> make_app(CommandLine& cl) {
  auto app = std::make_unique<CLI::App>(
      "ringattn: ring attention over CPU ranks or GPUs (run `ringattn` alone for a checked default run)");
  app->require_subcommand(0, 1);
  add_run_flags(*app->add_subcommand("run", "run one attention problem (random inputs or .npy files)"), cl.run);
  add_bench_flags(*app->add_subcommand("bench", "sweep sequence lengths and print a table (like nccl-tests)"),
                  cl.bench);
  add_plan_flags(*app->add_subcommand("plan", "print the ring schedule and load balance of a sharding (no run)"),
                 cl.plan);
  app->add_flag("--version", cl.show_version, "print what this build supports (cuda yes|no, nccl yes|no)");
  make_numbers_decimal(*app);
  return app;
}

namespace {

bool given(const CLI::App& sub, const char* name) {
  const CLI::Option* opt = sub.get_option_no_throw(name);
  return opt != nullptr && opt->count() > 0;
}

// `--out ''` and the like: an empty path is no file at all (and used to mean "not given").
void refuse_empty_paths(const CLI::App& sub) {
  for (const char* name : {"--q", "--k", "--v", "--out", "--lse", "--json", "--do", "--dq", "--dk", "--dv"}) {
    const CLI::Option* opt = sub.get_option_no_throw(name);
    if (opt == nullptr || opt->count() == 0) continue;
    for (const std::string& r : opt->results())
      if (r.empty()) fail_arg("{}: the path is empty; give a file name", name);
  }
}

// Flags that a combination would silently ignore.
void refuse_ignored_flags(const CLI::App& sub, const ProblemOptions& o, bool check) {
  if (o.q_offset && !o.causal && o.window.empty())
    fail_arg("--q-offset {} only shifts the causal mask or the window and does nothing without --causal or "
             "--window; add one or drop --q-offset", *o.q_offset);
  if (given(sub, "--check-rows") && !check)
    fail_arg("--check-rows {} without the check does nothing; add --check (run) or drop --no-check (bench)",
             o.check_rows);
  if (o.from_files())
    for (const char* name : {"--batch", "--heads", "--kv-heads", "--seq", "--kv-seq", "--dim"})
      if (given(sub, name))
        fail_arg("{} does not apply with --q/--k/--v: the files' shapes fix batch, heads, lengths and "
                 "dim; drop {}", name, name);
}

// --layout says how .npy files hold their tensors: without any such file it does nothing.
void refuse_idle_layout(const CLI::App& sub, const std::string& layout) {
  if (!given(sub, "--layout")) return;
  for (const char* name : {"--q", "--k", "--v", "--out", "--lse", "--do", "--dq", "--dk", "--dv"})
    if (given(sub, name)) return;
  fail_arg("--layout {} only says how the .npy files of --q/--k/--v, --out, --lse, --do and --dq/--dk/--dv hold "
           "their tensors and does nothing without one of them; add a file or drop --layout", layout);
}

// Flags of the backward that do nothing without --backward.
void refuse_backward_flags(const CLI::App& sub, bool backward) {
  if (backward) return;
  for (const char* name : {"--do", "--dq", "--dk", "--dv", "--deterministic"})
    if (given(sub, name))
      fail_arg("{} only applies to the backward pass and does nothing without --backward; add --backward or drop {}",
               name, name);
}

}  // namespace

void parse_command_line(CLI::App& app, CommandLine& cl, int argc, const char* const* argv) {
  if (argc <= 1)
    app.parse(std::string(kDefaultArgs), false);
  else
    app.parse(argc, argv);
  cl.command.clear();
  for (const char* name : {"run", "bench", "plan"})
    if (app.got_subcommand(name)) cl.command = name;
  if (cl.show_version) return;
  if (cl.command.empty()) throw CLI::CallForHelp();
  CLI::App& sub = *app.get_subcommand(cl.command);
  refuse_empty_paths(sub);
  if (cl.command == "run") {
    validate_problem_options(cl.run.problem);
    refuse_ignored_flags(sub, cl.run.problem, cl.run.check);
    refuse_backward_flags(sub, cl.run.backward);
    refuse_idle_layout(sub, cl.run.problem.layout);
  }
  if (cl.command == "bench") {
    validate_problem_options(cl.bench.problem);
    if (!cl.bench.docs.empty()) generate_documents(cl.bench.docs, 1, 0);  // the spec is refused here, by name
    if (!cl.bench.docs.empty() && cl.bench.problem.kv_seq)
      fail_arg("--docs packs self-attention; a --kv-seq sweep is decode over a cache: drop one of them");
    refuse_ignored_flags(sub, cl.bench.problem, cl.bench.check);
    refuse_backward_flags(sub, cl.bench.backward);
    if (cl.bench.problem.q_offset && !cl.bench.problem.kv_seq)
      fail_arg("--q-offset {} applies to bench only with --kv-seq (a decode sweep); a sweep without --kv-seq runs "
               "self-attention at offset 0; add --kv-seq or drop --q-offset", *cl.bench.problem.q_offset);
  }
}

double resolve_timeout(const ProblemOptions& o) {
  if (o.timeout_s) return *o.timeout_s;
  const char* env = std::getenv("RINGATTN_MPI_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return 300.0;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  const bool decimal = std::string(env).find_first_not_of("0123456789.eE+-") == std::string::npos;
  if (!decimal || end == env || *end != '\0' || !(v > 0) || v > kMaxTimeoutS)
    fail_arg("RINGATTN_MPI_TIMEOUT_S='{}' must be a number of seconds > 0 and <= {:g} (or use --timeout)", env,
             kMaxTimeoutS);
  return v;
}

void validate_problem_options(const ProblemOptions& o) {
  if (o.heads % o.kv_heads != 0)
    fail_arg("--heads {} is not a multiple of --kv-heads {}: grouped-query attention needs heads = g * kv-heads "
             "(e.g. --heads {} --kv-heads {})", o.heads, o.kv_heads, o.kv_heads * std::max<int64_t>(1, o.heads / o.kv_heads),
             o.kv_heads);
  if (!o.doc_lens.empty() && !o.cu_seqlens_file.empty())
    fail_arg("--doc-lens and --cu-seqlens both give the documents: use one of them");
  const int nfiles = int(!o.q_file.empty()) + int(!o.k_file.empty()) + int(!o.v_file.empty());
  if (nfiles != 0 && nfiles != 3) fail_arg("--q, --k and --v go together: give all three files or none (got {})", nfiles);
  ringattn::RunOptions tiles;  // checked here, before MPI starts and anything is allocated
  tiles.tile_q = o.tile_q;
  tiles.tile_k = o.tile_k;
  validate_run_options(tiles);
  if (o.device == "cpu" && o.transport == "nccl")
    fail_arg("--transport nccl needs --device cuda (NCCL moves device buffers); use --transport mpi on cpu");
}

}  // namespace ringattn::cli
