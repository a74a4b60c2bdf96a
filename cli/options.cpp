#include "cli/options.hpp"
#include "cli/file_layout.hpp"
#include "cli/flags.hpp"
#include "cli/problem.hpp"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include "comm/transport_factory.hpp"
#include "core/error.hpp"
#include "kernels/params.hpp"
#include "runner/ring/ring.hpp"

namespace ringattn::cli {
namespace {

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

}  // namespace

std::unique_ptr<CLI::App> make_app(CommandLine& cl) {
  auto app = std::make_unique<CLI::App>(
      "ringattn: ring attention over CPU ranks or GPUs (run `ringattn` alone for a checked default run)");
  app->require_subcommand(0, 1);
  add_flags(*app->add_subcommand("run", "run one attention problem (random inputs or .npy files)"), cl, kRun);
  add_flags(*app->add_subcommand("bench", "sweep sequence lengths and print a table (like nccl-tests)"), cl, kBench);
  add_flags(*app->add_subcommand("plan", "print the ring schedule and load balance of a sharding (no run)"), cl,
            kPlan);
  app->add_flag("--version", cl.show_version, "print what this build supports (cuda yes|no, nccl yes|no)");
  app->add_flag("--help-env", cl.show_env, "print the RINGATTN_* environment variables: values, defaults, effects");
  make_numbers_decimal(*app);
  return app;
}

namespace {

bool given(const CLI::App& sub, const char* name) {
  const CLI::Option* opt = sub.get_option_no_throw(name);
  return opt != nullptr && opt->count() > 0;
}

// `--out ''`, `--window ''` and the like: an empty value is no file, window or list at all (and
// used to mean "not given"). Every text flag of the table.
void refuse_empty_values(const CLI::App& sub, Cmd cmd) {
  for (const Flag* f : flags_of(cmd)) {
    if (!std::holds_alternative<Field<std::string>>(f->target) || f->alias_of != nullptr) continue;
    const CLI::Option* opt = sub.get_option_no_throw(flag_name(*f));
    if (opt == nullptr || opt->count() == 0) continue;
    for (const std::string& r : opt->results())
      if (r.empty()) {
        if (f->io != Io::None) fail_arg("{}: the path is empty; give a file name", flag_name(*f));
        fail_arg("{}: the value is empty; give one or drop {}", flag_name(*f), flag_name(*f));
      }
  }
}

// `--backward=false`, `--causal=0`, `--no-check=false`: a switch is given or not, and its value would
// count as given (the backward's flags accepted and ignored, the flags line claiming --backward) or,
// for a negated switch, be negated by CLI11 (which overflows on INT64_MIN). Read from the words as
// typed, before CLI11 sees them, for every switch of every command.
void refuse_switch_values(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") return;
    const size_t eq = word.find('=');
    if (word.rfind("--", 0) != 0 || eq == std::string::npos) continue;
    for (const Flag& f : flag_table())
      if (flag_is_bool(f) && word.compare(0, eq, flag_name(f)) == 0)
        fail_arg("{}: a switch takes no value; give {} or leave it out", word, flag_name(f));
  }
}

// Flags that a combination would silently ignore.
void refuse_ignored_flags(const CLI::App& sub, const ProblemOptions& o, bool check) {
  // An unbounded window (-1,-1) is no window: it leaves the offset as idle as no --window does.
  if (o.q_offset && !o.causal && (o.window.empty() || parse_window(o.window).none()))
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
  for (const Flag* f : flags_of(kRun))
    if ((f->io == Io::InputTensor || f->io == Io::OutputTensor) && given(sub, flag_name(*f).c_str())) return;
  fail_arg("--layout {} only says how the .npy files of --q/--k/--v, --out, --lse, --do and --dq/--dk/--dv hold "
           "their tensors and does nothing without one of them; add a file or drop --layout", layout);
}

// Flags that do nothing without another (the backward's without --backward).
void refuse_idle_flags(const CLI::App& sub, Cmd cmd) {
  for (const Flag* f : flags_of(cmd)) {
    if (f->needs == nullptr || !given(sub, flag_name(*f).c_str()) || given(sub, f->needs)) continue;
    const std::string name = flag_name(*f);
    if (std::string(f->needs) == "--backward")
      fail_arg("{} only applies to the backward pass and does nothing without --backward; add --backward or drop {}",
               name, name);
    fail_arg("{} does nothing without {}; add {} or drop {}", name, f->needs, f->needs, name);
  }
}

// A flag that is another's value (--naive: --impl naive) given beside that other: one of them
// would silently win.
void refuse_alias_with_target(const CLI::App& sub, Cmd cmd) {
  for (const Flag* f : flags_of(cmd)) {
    if (f->alias_of == nullptr || !given(sub, flag_name(*f).c_str()) || !given(sub, f->alias_of)) continue;
    const std::string name = flag_name(*f);
    fail_arg("{} is {} {} and {} is given too; give one of them", name, f->alias_of, f->alias_value, f->alias_of);
  }
}

// The table's names of the flags given on `sub`, in table order.
std::vector<std::string> given_flags(const CLI::App& sub, Cmd cmd) {
  std::vector<std::string> names;
  for (const Flag* f : flags_of(cmd))
    if (given(sub, flag_name(*f).c_str())) names.push_back(flag_name(*f));
  return names;
}

}  // namespace

void parse_command_line(CLI::App& app, CommandLine& cl, int argc, const char* const* argv) {
  refuse_switch_values(argc, argv);
  if (argc <= 1)
    app.parse(std::string(kDefaultArgs), false);
  else
    app.parse(argc, argv);
  cl.command.clear();
  for (const char* name : {"run", "bench", "plan"})
    if (app.got_subcommand(name)) cl.command = name;
  if (cl.show_version && cl.show_env)  // one was printed, the other silently dropped
    fail_arg("--version and --help-env each print one thing and exit: give one of them");
  if (cl.show_version || cl.show_env) return;
  if (cl.command.empty()) throw CLI::CallForHelp();
  CLI::App& sub = *app.get_subcommand(cl.command);
  const Cmd cmd = Cmd(command_bit(cl.command));
  cl.given = given_flags(sub, cmd);
  refuse_empty_values(sub, cmd);
  refuse_idle_flags(sub, cmd);
  refuse_alias_with_target(sub, cmd);
  if (cl.command == "run") {
    validate_problem_options(cl.run.problem);
    refuse_ignored_flags(sub, cl.run.problem, cl.run.check);
    refuse_idle_layout(sub, cl.run.problem.layout);
  }
  if (cl.command == "bench") {
    validate_problem_options(cl.bench.problem);
    if (!cl.bench.docs.empty()) generate_documents(cl.bench.docs, 1, 0);  // the spec is refused here, by name
    if (!cl.bench.docs.empty() && cl.bench.problem.kv_seq)
      fail_arg("--docs packs self-attention; a --kv-seq sweep is decode over a cache: drop one of them");
    refuse_ignored_flags(sub, cl.bench.problem, cl.bench.check);
    if (cl.bench.impl == "naive")  // the oracle alone: nothing sharded, tiled or checked
      for (const char* name : {"--check-rows", "--tile-q", "--tile-k", "--shard", "--deterministic"})
        if (given(sub, name))
          fail_arg("{} does nothing with --impl naive (the fp64 oracle on one process: not sharded, not tiled, the "
                   "reference itself); drop {} or run --impl flash or both", name, name);
    if (cl.bench.problem.q_offset && !cl.bench.problem.kv_seq)
      fail_arg("--q-offset {} applies to bench only with --kv-seq (a decode sweep); a sweep without --kv-seq runs "
               "self-attention at offset 0; add --kv-seq or drop --q-offset", *cl.bench.problem.q_offset);
  }
}

std::string help_pointer(const CLI::App& app) {
  for (const char* name : {"run", "bench", "plan"})
    if (app.got_subcommand(name)) return fmt::format("(see ringattn {} --help)", name);
  return "(see ringattn --help)";
}

std::string environment_help() {
  std::string text =
      "ringattn reads these environment variables once, at start-up (unset or empty: the default; a value it does "
      "not understand stops the run where the variable is used, naming it):\n";
  for (const SettingDoc& d : setting_docs())
    text += fmt::format("\n{}\n  {}\n  values:  {}\n  default: {}\n", d.name, d.does, d.values, d.fallback);
  return text;
}

void check_head_counts(int64_t heads, int64_t kv_heads) {
  if (heads % kv_heads != 0)
    fail_arg("--heads {} is not a multiple of --kv-heads {}: grouped-query attention needs heads = g * kv-heads "
             "(e.g. --heads {} --kv-heads {})", heads, kv_heads, kv_heads * std::max<int64_t>(1, heads / kv_heads),
             kv_heads);
}

void validate_problem_options(const ProblemOptions& o) {
  check_head_counts(o.heads, o.kv_heads);
  if (!o.doc_lens.empty() && !o.cu_seqlens_file.empty())
    fail_arg("--doc-lens and --cu-seqlens both give the documents: use one of them");
  const int nfiles = int(!o.q_file.empty()) + int(!o.k_file.empty()) + int(!o.v_file.empty());
  if (nfiles != 0 && nfiles != 3) fail_arg("--q, --k and --v go together: give all three files or none (got {})", nfiles);
  ringattn::RunOptions tiles;  // checked here, before MPI starts and anything is allocated
  tiles.tile_q = o.tile_q;
  tiles.tile_k = o.tile_k;
  validate_run_options(tiles);
  check_transport_device(o.transport, o.device);
}

void check_transport_device(const std::string& transport, const std::string& device) {
  const TransportKind* k = find_transport_kind(transport);
  if (device == "cpu" && k != nullptr && k->needs_cuda)
    fail_arg("--transport {} needs --device cuda ({} moves device buffers); use --transport mpi on cpu", k->name,
             k->library);
}

}  // namespace ringattn::cli
