// What is derived from the flag table (cli/flags.hpp): the CLI11 registration with each row's
// check, and the rows' values as text and JSON.
#include "cli/flags.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/file_layout.hpp"
#include "core/error.hpp"

namespace ringattn::cli {
namespace {

template <class T>
struct Plain {
  using type = T;
};
template <class T>
struct Plain<std::optional<T>> {
  using type = T;
};

// An integer flag with its real allowed range, lo..hi, in one message for every bad value
// ("--iters: must be an integer in 1..2147483647 (got '2147483648')"); CLI11's own checks print
// the double range or "Could not convert". Runs after decimal_integer (options.cpp), which leaves
// out-of-range digits to it.
template <class T>
CLI::Validator int_range(T lo, T hi) {
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
        if (used == 0 || used != s.size() || !(v >= kMinTimeoutS) || v > kMaxTimeoutS)
          return fmt::format("must be a number of seconds >= {:g} and <= {:g} (got '{}')", kMinTimeoutS, kMaxTimeoutS,
                             s);
        return std::string();
      },
      "SECONDS");
}

// One of `choices`, in one message for every bad value, quoted so that an empty one shows:
// "--dtype: '' not in {fp32,fp16,bf16}" (CLI11's IsMember prints the value bare).
CLI::Validator choice_check(std::vector<std::string> choices) {
  const std::string set = fmt::format("{{{}}}", fmt::join(choices, ","));
  return CLI::Validator(
      [choices = std::move(choices), set](std::string& s) -> std::string {
        if (std::find(choices.begin(), choices.end(), s) != choices.end()) return std::string();
        return fmt::format("'{}' not in {}", s, set);
      },
      set);
}

// --layout: parse_file_layout's message for anything but bhsd and bshd.
CLI::Validator file_layout_check() {
  return CLI::Validator(
      [](std::string& s) -> std::string { return s == "bhsd" || s == "bshd" ? std::string() : bad_layout_message(s); },
      "bhsd|bshd");
}

// A path: not a word that starts with '-' (CLI11 takes "--out --causal" as the path "--causal",
// which would drop the flag it names); "-" itself (stdout for --json) passes to the command's own
// checks.
CLI::Validator path_check() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.size() < 2 || s[0] != '-') return std::string();
        return fmt::format("'{}' is a flag, not a path: give the path first (a file whose name starts with '-' as "
                           "./{})", s, s);
      },
      "PATH");
}

template <class T>
void add_check(CLI::Option* opt, const Flag& f) {
  if constexpr (std::is_same_v<T, std::string>)
    if (f.io != Io::None) opt->check(path_check());
  switch (f.check) {
    case Check::None: return;
    case Check::Range:
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        const T hi = f.hi == 0 ? std::numeric_limits<T>::max() : T(f.hi);
        const T lo = f.lo < int64_t(std::numeric_limits<T>::min()) ? std::numeric_limits<T>::min() : T(f.lo);
        opt->check(int_range<T>(lo, hi));
        return;
      }
      break;
    case Check::Choice: opt->check(choice_check({f.choices.begin(), f.choices.end()})); return;
    case Check::Seconds: opt->check(seconds_bound()); return;
    case Check::Layout: opt->check(file_layout_check()); return;
    case Check::Factor: opt->check(CLI::Range(1.01, 1e6)); return;
  }
  fail_runtime("internal: flag {} has a check its type cannot take", f.names);
}

CLI::Option* add_one(CLI::App& app, CommandLine& cl, Cmd cmd, const Flag& f) {
  return std::visit(
      [&](auto field) -> CLI::Option* {
        auto& ref = field(cl, cmd);
        using T = std::remove_reference_t<decltype(ref)>;
        CLI::Option* opt = nullptr;
        if constexpr (std::is_same_v<T, bool>) {
          opt = app.add_flag(f.names, ref, f.help);
          if (f.names[0] == '!') opt->disable_flag_override();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (f.alias_of != nullptr)
            return app.add_flag_callback(f.names, [&ref, v = f.alias_value]() { ref = v; }, f.help);
          opt = app.add_option(f.names, ref, f.help);
        } else {
          opt = app.add_option(f.names, ref, f.help);
        }
        add_check<typename Plain<T>::type>(opt, f);
        if (f.show_default) opt->capture_default_str();
        return opt;
      },
      f.target);
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

}  // namespace

unsigned command_bit(const std::string& name) {
  if (name == "run") return kRun;
  if (name == "bench") return kBench;
  if (name == "plan") return kPlan;
  return 0;
}

std::vector<const Flag*> flags_of(unsigned cmd) {
  std::vector<const Flag*> rows;
  for (const Flag& f : flag_table())
    if ((f.commands & cmd) != 0) rows.push_back(&f);
  return rows;
}

std::string flag_name(const Flag& f) {
  std::string n = f.names;
  n = n.substr(n.rfind(',') == std::string::npos ? 0 : n.rfind(',') + 1);
  return n[0] == '!' ? n.substr(1) : n;
}

bool flag_is_bool(const Flag& f) { return std::holds_alternative<Field<bool>>(f.target) || f.alias_of != nullptr; }

void add_flags(CLI::App& app, CommandLine& cl, Cmd cmd) {
  for (const Flag* f : flags_of(cmd)) add_one(app, cl, cmd, *f);
}

std::string flag_text(const Flag& f, const CommandLine& cl, Cmd cmd) {
  auto& mut = const_cast<CommandLine&>(cl);  // the accessors hand out references; nothing is written
  return std::visit(
      [&](auto field) -> std::string {
        const auto& v = field(mut, cmd);
        using T = std::remove_cvref_t<decltype(v)>;
        if (f.agree == Agree::Given) {
          if constexpr (std::is_same_v<T, std::string>) return yes_no(!v.empty());
        }
        if constexpr (std::is_same_v<T, bool>) return yes_no(f.names[0] == '!' ? !v : v);
        else if constexpr (std::is_same_v<T, std::string>) return v.empty() ? f.unset : v;
        else if constexpr (std::is_same_v<T, double>) return fmt::format("{}", v);
        else if constexpr (std::is_same_v<T, std::optional<int64_t>>) return v ? std::to_string(*v) : f.unset;
        else if constexpr (std::is_same_v<T, std::optional<double>>) return v ? fmt::format("{}", *v) : f.unset;
        else return std::to_string(v);
      },
      f.target);
}

nlohmann::json flag_json(const Flag& f, const CommandLine& cl, Cmd cmd) {
  auto& mut = const_cast<CommandLine&>(cl);
  return std::visit(
      [&](auto field) -> nlohmann::json {
        const auto& v = field(mut, cmd);
        using T = std::remove_cvref_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) return f.names[0] == '!' ? !v : v;
        else if constexpr (std::is_same_v<T, std::string>) return v.empty() ? nlohmann::json(nullptr) : nlohmann::json(v);
        else if constexpr (std::is_same_v<T, std::optional<int64_t>> || std::is_same_v<T, std::optional<double>>)
          return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
        else return v;
      },
      f.target);
}

std::string given_flags_line(const CommandLine& cl) {
  const unsigned cmd = command_bit(cl.command);
  std::string line;
  for (const Flag* f : flags_of(cmd)) {
    const std::string name = flag_name(*f);
    if (std::find(cl.given.begin(), cl.given.end(), name) == cl.given.end()) continue;
    if (!line.empty()) line += ' ';
    if (flag_is_bool(*f)) {
      line += name;
    } else {
      Flag shown = *f;
      shown.agree = Agree::Value;  // the path, not whether it is given
      line += name + ' ' + flag_text(shown, cl, Cmd(cmd));
    }
  }
  return line.empty() ? std::string("(none: every default)") : line;
}

nlohmann::json flags_json(const CommandLine& cl) {
  const unsigned cmd = command_bit(cl.command);
  nlohmann::json j = nlohmann::json::object();
  for (const Flag* f : flags_of(cmd))
    if (f->json_key != nullptr) j[f->json_key] = flag_json(*f, cl, Cmd(cmd));
  return j;
}

}  // namespace ringattn::cli
