// The rows of the flag table (cli/flags.hpp): every flag of run, bench and plan, once.
#include <limits>

#include "cli/flags.hpp"
#include "comm/transport_factory.hpp"
#include "kernels/params.hpp"

namespace ringattn::cli {
namespace {

ProblemOptions& problem_of(CommandLine& c, Cmd k) { return k == kBench ? c.bench.problem : c.run.problem; }

// The field of a row: of the subcommand's ProblemOptions, RunOptions, BenchOptions or PlanOptions.
#define RA_PROBLEM(f) +[](CommandLine& c, Cmd k) -> auto& { return problem_of(c, k).f; }
#define RA_RUN(f) +[](CommandLine& c, Cmd) -> auto& { return c.run.f; }
#define RA_BENCH(f) +[](CommandLine& c, Cmd) -> auto& { return c.bench.f; }
#define RA_PLAN(f) +[](CommandLine& c, Cmd) -> auto& { return c.plan.f; }
#define RA_BACKWARD(f) +[](CommandLine& c, Cmd k) -> auto& { return k == kBench ? c.bench.f : c.run.f; }

constexpr int64_t kAnyInt = std::numeric_limits<int64_t>::min();
constexpr unsigned kRunBench = kRun | kBench;
const std::vector<const char*> kShards = {"auto", "contiguous", "zigzag", "striped", "doc-zigzag"};
// The dtype table's names (core/dtype.hpp), in its order.
const std::vector<const char*> kDtypes = [] {
  std::vector<const char*> names;
  for (const DTypeInfo& d : kDTypes) names.push_back(d.name);
  return names;
}();
constexpr const char* kShardHelp =
    "sequence sharding over ranks (auto: the best balanced for the mask and documents; doc-zigzag: zigzag inside "
    "every document)";
constexpr const char* kCpHelp =
    "context parallelism: ring (K/V around a ring of every rank), ulysses (an all-to-all over heads: every rank "
    "attends all tokens of heads / P heads) or hybrid:U (all-to-all inside groups of U consecutive ranks, a ring "
    "across the P / U groups); CPU ranks only for ulysses and hybrid";
constexpr const char* kDocLensHelp =
    "packed documents: their lengths, comma-separated, summing to the sequence; each attends only to itself (causal "
    "within it with --causal)";
constexpr const char* kWindowHelp =
    "sliding window LEFT,RIGHT: key j visible to query i when pos(i) - LEFT <= pos(j) <= pos(i) + RIGHT; -1 leaves "
    "a side unbounded; with --causal RIGHT is 0 or -1 (e.g. --window 4096,0)";

std::vector<Flag> problem_rows() {
  return {
      {.names = "--batch", .commands = kRunBench, .target = RA_PROBLEM(batch), .json_key = "batch", .help = "batch size",
       .check = Check::Range, .lo = 1, .show_default = true, .samples = {"1", "2"}},
      {.names = "--heads", .commands = kRunBench, .target = RA_PROBLEM(heads), .json_key = "heads", .help = "query heads",
       .check = Check::Range, .lo = 1, .show_default = true, .samples = {"8", "16"}},
      {.names = "--kv-heads", .commands = kRunBench, .target = RA_PROBLEM(kv_heads), .json_key = "kv_heads",
       .help = "key/value heads (heads must be a multiple: GQA, MQA when 1)", .check = Check::Range, .lo = 1,
       .show_default = true, .samples = {"2", "4"}},
      {.names = "--seq", .commands = kRun, .target = RA_PROBLEM(seq), .json_key = "seq", .help = "query tokens (global)",
       .check = Check::Range, .lo = 1, .show_default = true, .samples = {"64", "65"}},
      {.names = "--kv-seq", .commands = kRun, .target = RA_PROBLEM(kv_seq), .json_key = "kv_seq",
       .help = "key/value tokens (global; default: --seq)", .check = Check::Range, .lo = 1, .unset = "default",
       .samples = {"64", "100"}},
      {.names = "--kv-seq", .commands = kBench, .target = RA_PROBLEM(kv_seq), .json_key = "kv_seq",
       .help = "decode / chunked prefill: a fixed K/V cache of this many tokens, split over the ranks; the swept size "
               "is then the number of queries (default: none, a self-attention ring sweep)",
       .check = Check::Range, .lo = 1, .unset = "default", .samples = {"128", "129"}},
      {.names = "--q-offset", .commands = kRunBench, .target = RA_PROBLEM(q_offset), .json_key = "q_offset",
       .help = "position of query 0 minus position of key 0 (default kv-seq - seq)", .check = Check::Range,
       .lo = kAnyInt, .unset = "default", .samples = {"0", "1"}},
      {.names = "--q", .commands = kRun, .target = RA_PROBLEM(q_file), .io = Io::InputTensor, .json_key = "q",
       .help = "queries: .npy [batch, heads, q_len, dim] (--layout bshd: [batch, q_len, heads, dim]), <f4 or <f2",
       .samples = {"q0.npy", "q1.npy"}},
      {.names = "--k", .commands = kRun, .target = RA_PROBLEM(k_file), .io = Io::InputTensor, .json_key = "k",
       .help = "keys: .npy [batch, kv_heads, kv_len, dim] (--layout bshd: [batch, kv_len, kv_heads, dim])",
       .samples = {"k0.npy", "k1.npy"}},
      {.names = "--v", .commands = kRun, .target = RA_PROBLEM(v_file), .io = Io::InputTensor, .json_key = "v",
       .help = "values: .npy, the shape of --k", .samples = {"v0.npy", "v1.npy"}},
      {.names = "--layout", .commands = kRun, .target = RA_PROBLEM(layout), .json_key = "layout",
       .help = "how the .npy files of --q/--k/--v, --out, --lse, --do and --dq/--dk/--dv hold their tensors: bhsd "
               "[batch, heads, seq, dim] (default) or bshd [batch, seq, heads, dim] (--lse [batch, seq, heads])",
       .check = Check::Layout, .unset = "default", .samples = {"bhsd", "bshd"}},
      {.names = "--doc-lens", .commands = kRun, .target = RA_PROBLEM(doc_lens), .json_key = "doc_lens",
       .help = kDocLensHelp, .samples = {"32,32", "16,48"}},
      {.names = "--cu-seqlens", .commands = kRun, .target = RA_PROBLEM(cu_seqlens_file), .io = Io::InputFile,
       .json_key = "cu_seqlens",
       .help = "packed documents as a .npy of int32 or int64 boundaries: 0, then the running sums of the lengths",
       .samples = {"c0.npy", "c1.npy"}},
      {.names = "--dim", .commands = kRunBench, .target = RA_PROBLEM(dim), .json_key = "dim", .help = "head dimension",
       .check = Check::Range, .lo = 1, .show_default = true, .samples = {"64", "32"}},
      {.names = "--seed", .commands = kRunBench, .target = RA_PROBLEM(seed), .json_key = "seed",
       .help = "seed of the random inputs", .check = Check::Range, .lo = 0, .show_default = true,
       .samples = {"1", "2"}},
      {.names = "--causal", .commands = kRunBench, .target = RA_PROBLEM(causal), .json_key = "causal",
       .help = "causal mask (key j visible to query i when pos(j) <= pos(i))"},
      {.names = "--window", .commands = kRunBench, .target = RA_PROBLEM(window), .json_key = "window",
       .help = kWindowHelp, .samples = {"4,0", "8,0"}},
      {.names = "--device", .commands = kRunBench, .target = RA_PROBLEM(device), .json_key = "device",
       .help = "compute device", .check = Check::Choice, .choices = {"cpu", "cuda"}, .show_default = true,
       .samples = {"cpu", "cuda"}},
      {.names = "--dtype", .commands = kRunBench, .target = RA_PROBLEM(dtype), .json_key = "dtype",
       .help = "input/output dtype (default: fp32 on cpu, bf16 on cuda, the files' dtype)", .check = Check::Choice,
       .choices = kDtypes, .unset = "default", .samples = {"fp32", "fp16"}},
      {.names = "--tile-q", .commands = kRunBench, .target = RA_PROBLEM(tile_q), .json_key = "tile_q",
       .help = "CPU query tile, 1 to 4096 rows (0: default)", .check = Check::Range, .lo = 0, .hi = kMaxTile,
       .samples = {"0", "16"}},
      {.names = "--tile-k", .commands = kRunBench, .target = RA_PROBLEM(tile_k), .json_key = "tile_k",
       .help = "CPU key tile, 1 to 4096 rows (0: default)", .check = Check::Range, .lo = 0, .hi = kMaxTile,
       .samples = {"0", "16"}},
      {.names = "--shard", .commands = kRunBench, .target = RA_PROBLEM(shard), .json_key = "shard", .help = kShardHelp,
       .check = Check::Choice, .choices = kShards, .show_default = true, .samples = {"zigzag", "striped"}},
      {.names = "--cp", .commands = kRunBench, .target = RA_PROBLEM(cp), .json_key = "cp", .help = kCpHelp,
       .show_default = true, .samples = {"ring", "ulysses"}},
      {.names = "--transport", .commands = kRunBench, .target = RA_PROBLEM(transport), .computes = false,
       .json_key = "transport", .help = "auto: nccl between GPUs when built, mpi under mpirun, else local",
       .check = Check::Choice, .choices = transport_choices(), .show_default = true,
       .samples = {"auto", "mpi"}},
      {.names = "--check-rows", .commands = kRunBench, .target = RA_PROBLEM(check_rows), .computes = false,
       .json_key = "check_rows", .help = "rows per rank the check compares (0: all when small, else a sample)",
       .check = Check::Range, .lo = 0, .samples = {"0", "5"}},
      {.names = "--log-level", .commands = kRunBench, .target = RA_PROBLEM(log_level), .agree = Agree::Local,
       .computes = false, .json_key = "log_level",
       .help = "trace|debug|info|warn|error|critical|off (default: $RINGATTN_LOG_LEVEL or info)", .unset = "default"},
      {.names = "--timeout", .commands = kRunBench, .target = RA_PROBLEM(timeout_s), .computes = false,
       .json_key = "timeout_s",
       .help = "bound in seconds on every wait for another rank (the first hop gets 3x, and waits behind it up to 4.5x); on expiry every rank exits "
               "with a message (default: $RINGATTN_MPI_TIMEOUT_S or 300)",
       .check = Check::Seconds, .unset = "default", .samples = {"5", "6"}},
  };
}

std::vector<Flag> run_rows() {
  return {
      {.names = "--check", .commands = kRun, .target = RA_RUN(check), .computes = false, .json_key = "check",
       .help = "compare with the fp64 naive reference; exit 2 when over the tolerance"},
      {.names = "--check-finite", .commands = kRun, .target = RA_RUN(check_finite), .computes = false,
       .json_key = "check_finite",
       .help = "stop with an error naming the rank, tensor and index of the first NaN/Inf in q, k, v, dO (before the "
               "run) or out, lse (after)"},
      {.names = "--dry-run", .commands = kRun, .target = RA_RUN(dry_run), .computes = false, .json_key = "dry_run",
       .help = "check the world, environment, versions and the problem on every rank, then exit (no attention)"},
      {.names = "--out", .commands = kRun, .target = RA_RUN(out_file), .agree = Agree::Given, .computes = false,
       .io = Io::OutputTensor, .json_key = "out",
       .help = "write the output as <f4 .npy [batch, heads, q_len, dim] (--layout bshd: [batch, q_len, heads, dim])",
       .samples = {nullptr, "o.npy"}},
      {.names = "--lse", .commands = kRun, .target = RA_RUN(lse_file), .agree = Agree::Given, .computes = false,
       .io = Io::OutputTensor, .json_key = "lse",
       .help = "write the log-sum-exp as <f4 .npy [batch, heads, q_len] (--layout bshd: [batch, q_len, heads])",
       .samples = {nullptr, "l.npy"}},
      {.names = "--json", .commands = kRun, .target = RA_RUN(json_file), .agree = Agree::Given, .computes = false,
       .io = Io::OutputFile, .json_key = "json", .help = "write one JSON record ('-' for stdout)",
       .samples = {nullptr, "r.json"}},
      {.names = "--backward", .commands = kRun, .target = RA_RUN(backward), .json_key = "backward",
       .help = "after the forward, compute the gradients dq, dk, dv of sum(dO * out) (under mpirun: the ring "
               "backward; rank 0 writes --dq/--dk/--dv in global token order)"},
      {.names = "--deterministic", .commands = kRunBench, .target = RA_BACKWARD(deterministic),
       .json_key = "deterministic", .help = "with --backward: bitwise reproducible dq (no atomics on GPUs)",
       .needs = "--backward"},
      {.names = "--do", .commands = kRun, .target = RA_RUN(do_file), .io = Io::InputTensor, .json_key = "do",
       .help = "with --backward: dO as .npy in the shape of q, in --layout (default: random from --seed); each rank "
               "reads its rows",
       .needs = "--backward", .samples = {"a.npy", "b.npy"}},
      {.names = "--dq", .commands = kRun, .target = RA_RUN(dq_file), .agree = Agree::Given, .computes = false,
       .io = Io::OutputTensor, .json_key = "dq", .help = "with --backward: write dq as <f4 .npy in the shape of q (in --layout)",
       .needs = "--backward", .samples = {nullptr, "g.npy"}},
      {.names = "--dk", .commands = kRun, .target = RA_RUN(dk_file), .agree = Agree::Given, .computes = false,
       .io = Io::OutputTensor, .json_key = "dk", .help = "with --backward: write dk as <f4 .npy in the shape of k (in --layout)",
       .needs = "--backward", .samples = {nullptr, "gk.npy"}},
      {.names = "--dv", .commands = kRun, .target = RA_RUN(dv_file), .agree = Agree::Given, .computes = false,
       .io = Io::OutputTensor, .json_key = "dv", .help = "with --backward: write dv as <f4 .npy in the shape of v (in --layout)",
       .needs = "--backward", .samples = {nullptr, "gv.npy"}},
  };
}

std::vector<Flag> bench_rows() {
  return {
      {.names = "-b,--seq-min", .commands = kBench, .target = RA_BENCH(seq_min), .json_key = "seq_min",
       .help = "smallest sequence length", .check = Check::Range, .lo = 1, .show_default = true,
       .samples = {"64", "128"}},
      {.names = "-e,--seq-max", .commands = kBench, .target = RA_BENCH(seq_max), .json_key = "seq_max",
       .help = "largest sequence length", .check = Check::Range, .lo = 1, .show_default = true,
       .samples = {"256", "512"}},
      {.names = "-f,--seq-factor", .commands = kBench, .target = RA_BENCH(seq_factor), .json_key = "seq_factor",
       .help = "multiply the length by this between sizes", .check = Check::Factor, .show_default = true,
       .samples = {"2", "3"}},
      {.names = "-n,--iters", .commands = kBench, .target = RA_BENCH(iters), .computes = false, .json_key = "iters",
       .help = "timed iterations per size", .check = Check::Range, .lo = 1, .show_default = true,
       .samples = {"2", "3"}},
      {.names = "-w,--warmup", .commands = kBench, .target = RA_BENCH(warmup), .computes = false, .json_key = "warmup",
       .help = "untimed iterations per size", .check = Check::Range, .lo = 0, .show_default = true,
       .samples = {"0", "1"}},
      {.names = "--timer", .commands = kBench, .target = RA_BENCH(timer), .computes = false, .json_key = "timer",
       .help = "per-call: barrier + call + synchronize per iteration, the median; batch: the iterations back to back "
               "between one barrier and one synchronize, the mean (as the peers are timed)",
       .check = Check::Choice, .choices = {"per-call", "batch"}, .show_default = true,
       .samples = {"per-call", "batch"}},
      {.names = "--docs", .commands = kBench, .target = RA_BENCH(docs), .json_key = "docs",
       .help = "packed documents at every size, drawn from the seed: uniform:MAX (lengths uniform in [1, MAX] until "
               "the sequence is full) or fixed:L (length L; the last may be shorter)",
       .samples = {"fixed:16", "fixed:32"}},
      {.names = "--impl", .commands = kBench, .target = RA_BENCH(impl), .json_key = "impl",
       .help = "flash (the runtime), naive (the fp64 oracle; cpu, one process) or both (the ratio in one run)",
       .check = Check::Choice, .choices = {"flash", "naive", "both"}, .show_default = true,
       .samples = {"flash", "naive"}},
      // A callback without a value: "--naive=x" is then a clean parse error, where a counting flag
      // function let std::stoll's exception escape (found by tests/cli/test_cli_fuzz.cpp).
      {.names = "--naive", .commands = kBench, .target = RA_BENCH(impl), .help = "same as --impl naive",
       .alias_of = "--impl", .alias_value = "naive"},
      // No "--no-check=VALUE": CLI11 2.1 negates the value of a negated flag, which overflows on
      // INT64_MIN (UBSan, found by tests/cli/test_cli_fuzz.cpp).
      {.names = "!--no-check", .commands = kBench, .target = RA_BENCH(check), .computes = false,
       .json_key = "no_check", .help = "skip the per-size correctness check"},
      {.names = "--json", .commands = kBench, .target = RA_BENCH(json_file), .agree = Agree::Given, .computes = false,
       .io = Io::OutputFile, .json_key = "json",
       .help = "write the sweep as one JSON record, its sizes in a list ('-' for stdout)",
       .samples = {nullptr, "b.json"}},
      {.names = "--backward", .commands = kBench, .target = RA_BENCH(backward), .json_key = "backward",
       .help = "time the backward after the forward at each size (rate counted as 2.5x the forward FLOPs) and the "
               "forward+backward total (under mpirun: the ring backward)"},
  };
}

std::vector<Flag> plan_rows() {
  return {
      {.names = "--seq", .commands = kPlan, .target = RA_PLAN(seq), .json_key = "seq", .help = "tokens (global)",
       .check = Check::Range, .lo = 1, .show_default = true, .samples = {"64", "65"}},
      {.names = "--ranks", .commands = kPlan, .target = RA_PLAN(ranks), .json_key = "ranks", .help = "ranks of the ring",
       .check = Check::Range, .lo = 1, .hi = 1 << 20, .show_default = true, .samples = {"2", "3"}},
      {.names = "--shard", .commands = kPlan, .target = RA_PLAN(shard), .json_key = "shard", .help = kShardHelp,
       .check = Check::Choice, .choices = kShards, .show_default = true, .samples = {"zigzag", "striped"}},
      {.names = "--cp", .commands = kPlan, .target = RA_PLAN(cp), .json_key = "cp",
       .help = "the context parallelism whose ranks are printed, as run's --cp (ring, ulysses or hybrid:U); the bytes "
               "of every layout are summed up below them",
       .show_default = true, .samples = {"ring", "ulysses"}},
      {.names = "--causal", .commands = kPlan, .target = RA_PLAN(causal), .json_key = "causal", .help = "causal mask"},
      {.names = "--window", .commands = kPlan, .target = RA_PLAN(window), .json_key = "window", .help = kWindowHelp,
       .samples = {"4,0", "8,0"}},
      {.names = "--doc-lens", .commands = kPlan, .target = RA_PLAN(doc_lens), .json_key = "doc_lens",
       .help = kDocLensHelp, .samples = {"4096,4096", "1024,7168"}},
      {.names = "--batch", .commands = kPlan, .target = RA_PLAN(batch), .json_key = "batch",
       .help = "batch size (scales the FLOP and byte columns)", .check = Check::Range, .lo = 1, .samples = {"1", "2"}},
      {.names = "--heads", .commands = kPlan, .target = RA_PLAN(heads), .json_key = "heads",
       .help = "query heads (scales the FLOP column)", .check = Check::Range, .lo = 1, .samples = {"8", "16"}},
      {.names = "--kv-heads", .commands = kPlan, .target = RA_PLAN(kv_heads), .json_key = "kv_heads",
       .help = "key/value heads (scales the byte column)", .check = Check::Range, .lo = 1, .show_default = true,
       .samples = {"2", "4"}},
      {.names = "--dim", .commands = kPlan, .target = RA_PLAN(dim), .json_key = "dim",
       .help = "head dimension (scales the FLOP and byte columns)", .check = Check::Range, .lo = 1,
       .samples = {"64", "32"}},
      {.names = "--dtype", .commands = kPlan, .target = RA_PLAN(dtype), .json_key = "dtype",
       .help = "K/V dtype (scales the byte column)", .check = Check::Choice, .choices = kDtypes, .show_default = true,
       .samples = {"fp32", "fp16"}},
  };
}

}  // namespace

const std::vector<Flag>& flag_table() {
  static const std::vector<Flag> table = [] {
    std::vector<Flag> t;
    for (auto part : {problem_rows, run_rows, bench_rows, plan_rows}) {
      std::vector<Flag> rows = part();
      t.insert(t.end(), rows.begin(), rows.end());
    }
    return t;
  }();
  return table;
}

}  // namespace ringattn::cli
