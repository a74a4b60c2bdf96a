#include "cli/outputs.hpp"

#include <filesystem>
#include <system_error>

#include "cli/flags.hpp"
#include "runner/io/atomic_file.hpp"
#include "core/error.hpp"

namespace ringattn::cli {
namespace {

namespace fs = std::filesystem;

// True when `a` and `b` name one file: the same canonical path, or (both existing) the same
// device and inode, which also catches hard links.
bool same_file(const std::string& a_given, const std::string& b_given) {
  const std::string a = resolve_output_path(a_given), b = resolve_output_path(b_given);  // dangling links too
  std::error_code ea, eb, ee;
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ea), ea).lexically_normal();
  const fs::path cb = fs::weakly_canonical(fs::absolute(b, eb), eb).lexically_normal();
  if (!ea && !eb && ca == cb) return true;
  return fs::exists(a, ea) && fs::exists(b, eb) && fs::equivalent(a, b, ee) && !ee;
}

bool is_file_path(const std::string& p) { return !p.empty() && p != "-"; }

}  // namespace

void check_output_paths(const NamedPaths& outputs, const NamedPaths& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [flag, path] = outputs[i];
    if (!is_file_path(path)) continue;
    if (const std::string why = output_path_problem(path); !why.empty())
      fail_arg("{} {}: cannot write the output there: {}", flag, path, why);
    for (const auto& [in_flag, in_path] : inputs)
      if (is_file_path(in_path) && same_file(path, in_path))
        fail_arg("{} {} is the input file of {} {}: writing it would overwrite the input; choose another name", flag,
                 path, in_flag, in_path);
    for (size_t j = 0; j < i; ++j)
      if (is_file_path(outputs[j].second) && same_file(path, outputs[j].second))
        fail_arg("{} {} and {} {} name the same file: each output needs a file of its own", outputs[j].first,
                 outputs[j].second, flag, path);
  }
}

namespace {

// The (flag, path) pairs of the table's rows of `cmd` that write (or read) files, as given.
void paths_of(const CommandLine& cl, Cmd cmd, NamedPaths& outputs, NamedPaths& inputs) {
  for (const Flag* f : flags_of(cmd)) {
    if (f->io == Io::None) continue;
    const nlohmann::json v = flag_json(*f, cl, cmd);
    const std::string path = v.is_string() ? v.get<std::string>() : std::string();
    const bool out = f->io == Io::OutputTensor || f->io == Io::OutputFile;
    // '-' is stdout for a text output (--json); a tensor's .npy goes to a file.
    if (f->io == Io::OutputTensor && path == "-")
      fail_arg("{} -: a tensor is written as a .npy file, not to stdout; give a file name", flag_name(*f));
    (out ? outputs : inputs).emplace_back(flag_name(*f), path);
  }
}

void check_command_outputs(const CommandLine& cl, Cmd cmd) {
  NamedPaths outputs, inputs;
  paths_of(cl, cmd, outputs, inputs);
  check_output_paths(outputs, inputs);
}

}  // namespace

void check_run_outputs(const RunOptions& o) {
  CommandLine cl;
  cl.run = o;
  check_command_outputs(cl, kRun);
}

void check_bench_outputs(const BenchOptions& o) {
  CommandLine cl;
  cl.bench = o;
  check_command_outputs(cl, kBench);
}

}  // namespace ringattn::cli
