#include "cli/outputs.hpp"

#include <filesystem>
#include <system_error>

#include "ringattn/atomic_file.hpp"
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

void check_run_outputs(const RunOptions& o) {
  check_output_paths({{"--out", o.out_file}, {"--lse", o.lse_file}, {"--json", o.json_file}, {"--dq", o.dq_file},
                      {"--dk", o.dk_file}, {"--dv", o.dv_file}},
                     {{"--q", o.problem.q_file}, {"--k", o.problem.k_file}, {"--v", o.problem.v_file},
                      {"--do", o.do_file}});
}

void check_bench_outputs(const BenchOptions& o) { check_output_paths({{"--json", o.json_file}}, {}); }

}  // namespace ringattn::cli
