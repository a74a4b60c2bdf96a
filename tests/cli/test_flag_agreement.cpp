// ranks: 2
// The start-up agreement, walked over the flag table (cli/flags.hpp): for every row of every
// subcommand that the ranks agree on, rank 0 parses the row's first sample and rank 1 its second
// (with the flags the row needs to mean anything), both join agree_on_command, and every rank
// must stop with the same CollectiveError naming rank 1, the flag and both values. A new row is
// covered as soon as it exists: test_cli_flags.cpp refuses a row without samples.
#include <mpi.h>

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/command_agreement.hpp"
#include "cli/flags.hpp"
#include "cli/options.hpp"
#include "cli/world.hpp"

namespace {

using namespace ringattn;
using namespace ringattn::cli;

MpiSession* g_mpi = nullptr;

const char* command_name(Cmd cmd) { return cmd == kRun ? "run" : cmd == kBench ? "bench" : "plan"; }

// The other flags a row needs so that the command takes it: its `needs`, the rest of a q/k/v
// triple, a file for --layout, a sweep that -e can end.
std::vector<std::string> context_of(const Flag& f, Cmd cmd) {
  const std::string name = flag_name(f);
  std::vector<std::string> ctx;
  if (f.needs != nullptr) ctx.emplace_back(f.needs);
  static const std::map<std::string, std::vector<std::string>> kRunContext = {
      {"--q", {"--k", "k.npy", "--v", "v.npy"}},
      {"--k", {"--q", "q.npy", "--v", "v.npy"}},
      {"--v", {"--q", "q.npy", "--k", "k.npy"}},
      {"--layout", {"--q", "q.npy", "--k", "k.npy", "--v", "v.npy"}},
      {"--check-rows", {"--check"}},
      {"--q-offset", {"--causal"}},
  };
  if (cmd == kRun && kRunContext.count(name) != 0)
    for (const std::string& a : kRunContext.at(name)) ctx.push_back(a);
  if (cmd == kBench && name == "--q-offset") ctx.insert(ctx.end(), {"--causal", "--kv-seq", "512"});
  if (cmd == kBench && name == "--seq-max") ctx.insert(ctx.end(), {"-b", "64"});
  if (cmd == kBench && name == "--seq-min") ctx.insert(ctx.end(), {"-e", "512"});
  return ctx;
}

// Rank `side`'s command line for row `f`: the row's sample `side` (none: the flag left out; a
// bool: given on rank 1 only).
std::vector<std::string> argv_of(const Flag& f, Cmd cmd, int side) {
  std::vector<std::string> argv = {"ringattn", command_name(cmd)};
  for (const std::string& a : context_of(f, cmd)) argv.push_back(a);
  const bool give = flag_is_bool(f) ? side == 1 : f.samples[side] != nullptr;
  if (give) argv.push_back(flag_name(f));
  if (give && !flag_is_bool(f)) argv.emplace_back(f.samples[side]);
  return argv;
}

// How the agreement names the row's value on rank `side`.
std::string expected_value(const Flag& f, int side) {
  if (flag_is_bool(f) || f.agree == Agree::Given) {
    const bool given = flag_is_bool(f) ? side == 1 : f.samples[side] != nullptr;
    return given ? "yes" : "no";  // a negated bool ("!--no-check") too: whether it is given
  }
  return f.samples[side] != nullptr ? f.samples[side] : f.unset;
}

std::string expected_field(const Flag& f) { return flag_name(f) + (f.agree == Agree::Given ? " given" : ""); }

// Parses `argv` and joins the agreement; returns the CollectiveError's text ("" when none).
std::string agreement_error(const std::vector<std::string>& argv, std::string& parse_error) {
  CommandLine cl;
  const std::unique_ptr<CLI::App> app = make_app(cl);
  std::vector<const char*> ptrs;
  for (const std::string& a : argv) ptrs.push_back(a.c_str());
  try {
    parse_command_line(*app, cl, static_cast<int>(ptrs.size()), ptrs.data());
  } catch (const std::exception& e) {
    parse_error = e.what();
  }
  try {
    agree_on_command(cl, *g_mpi, 30, parse_error);
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "";
}

std::string joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

TEST(FlagAgreement, EveryAgreedFlagThatDiffersStopsEveryRank) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int walked = 0;
  for (const Cmd cmd : {kRun, kBench, kPlan}) {
    for (const Flag* f : flags_of(cmd)) {
      if (f->agree == Agree::Local || f->alias_of != nullptr) continue;
      const std::vector<std::string> argv = argv_of(*f, cmd, rank);
      std::string parse_error;
      const std::string error = agreement_error(argv, parse_error);
      const std::string want = "rank 1 has " + expected_field(*f) + " " + expected_value(*f, 1) + " where rank 0 has " +
                               expected_field(*f) + " " + expected_value(*f, 0);
      EXPECT_EQ(parse_error, "") << "rank " << rank << ": " << joined(argv);
      EXPECT_NE(error.find(want), std::string::npos)
          << "rank " << rank << ", " << command_name(cmd) << " " << flag_name(*f) << ": " << joined(argv)
          << "\n  got: " << error << "\n  want: " << want;
      ++walked;
    }
  }
  EXPECT_GT(walked, 50);  // the run, bench and plan rows
}

// The same command line on both ranks passes (the walk above does not pass by refusing always).
TEST(FlagAgreement, EqualFlagsAgree) {
  std::string parse_error;
  EXPECT_EQ(agreement_error({"ringattn", "run", "--seq", "64", "--backward", "--do", "a.npy", "--dq", "g.npy"},
                            parse_error),
            "");
  EXPECT_EQ(parse_error, "");
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ringattn::cli::MpiSession mpi;
  g_mpi = &mpi;
  const int code = RUN_ALL_TESTS();
  int worst = code;
  MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  mpi.finish();
  return worst;
}
