// The flag table's own rules (cli/flags.hpp): every row the ranks agree on carries the samples
// that the agreement walk (test_flag_agreement.cpp) starts two ranks with, every flag that
// changes the computation is agreed by value, names and JSON keys are unique per subcommand, and
// the reports' flags line and the records' "flags" object come from the rows.
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/flags.hpp"
#include "cli/options.hpp"

namespace {

using namespace ringattn::cli;

ringattn::cli::CommandLine parsed(std::vector<const char*> argv) {
  CommandLine cl;
  const std::unique_ptr<CLI::App> app = make_app(cl);
  argv.insert(argv.begin(), "ringattn");
  parse_command_line(*app, cl, static_cast<int>(argv.size()), argv.data());
  return cl;
}

TEST(FlagTable, EveryAgreedRowHasTwoSamples) {
  for (const Flag& f : flag_table()) {
    const std::string name = flag_name(f);
    if (f.agree == Agree::Local || f.alias_of != nullptr) continue;
    if (flag_is_bool(f)) {
      EXPECT_TRUE(f.samples[0] == nullptr && f.samples[1] == nullptr) << name << ": a bool is given or not";
    } else if (f.agree == Agree::Given) {
      EXPECT_TRUE(f.samples[0] == nullptr && f.samples[1] != nullptr) << name << ": left out on rank 0, given on rank 1";
    } else {
      ASSERT_TRUE(f.samples[0] != nullptr && f.samples[1] != nullptr) << name << " has no samples";
      EXPECT_NE(std::string(f.samples[0]), std::string(f.samples[1])) << name;
    }
  }
}

TEST(FlagTable, FlagsThatChangeTheResultAreAgreedByValue) {
  for (const Flag& f : flag_table())
    if (f.computes && f.alias_of == nullptr) EXPECT_EQ(f.agree, Agree::Value) << flag_name(f);
}

TEST(FlagTable, NamesAndKeysAreUniquePerCommand) {
  for (const Cmd cmd : {kRun, kBench, kPlan}) {
    std::set<std::string> names, keys;
    for (const Flag* f : flags_of(cmd)) {
      EXPECT_TRUE(names.insert(flag_name(*f)).second) << flag_name(*f) << " twice in command " << cmd;
      if (f->alias_of != nullptr) continue;
      ASSERT_NE(f->json_key, nullptr) << flag_name(*f);
      EXPECT_TRUE(keys.insert(f->json_key).second) << f->json_key << " twice in command " << cmd;
    }
    EXPECT_GE(names.size(), 10u);
  }
}

TEST(FlagTable, TheFlagsLineListsTheGivenFlagsInTableOrder) {
  const CommandLine cl = parsed({"run", "--do", "a.npy", "--causal", "--seq", "64", "--backward"});
  EXPECT_EQ(given_flags_line(cl), "--seq 64 --causal --backward --do a.npy");
  const nlohmann::json j = flags_json(cl);
  EXPECT_EQ(j.at("seq"), 64);
  EXPECT_EQ(j.at("causal"), true);
  EXPECT_EQ(j.at("do"), "a.npy");
  EXPECT_TRUE(j.at("dq").is_null());
  EXPECT_EQ(j.size(), flags_of(kRun).size());  // every run row (run has no alias)
}

}  // namespace
