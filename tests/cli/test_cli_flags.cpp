// The flag table's own rules (cli/flags.hpp): every row the ranks agree on carries the samples
// that the agreement walk (test_flag_agreement.cpp) starts two ranks with, every flag that
// changes the computation is agreed by value, names and JSON keys are unique per subcommand, and
// the reports' flags line and the records' "flags" object come from the rows; a refused choice
// shows its value quoted (an empty one too) and the error names its own subcommand's --help.
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
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

// The ParseError text of `ringattn <argv...>` and the help pointer main appends to it.
std::pair<std::string, std::string> refusal(std::vector<const char*> argv) {
  CommandLine cl;
  const std::unique_ptr<CLI::App> app = make_app(cl);
  argv.insert(argv.begin(), "ringattn");
  try {
    parse_command_line(*app, cl, static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return {e.what(), help_pointer(*app)};
  }
  return {"(accepted)", ""};
}

TEST(FlagTable, EveryChoiceShowsARefusedValueQuoted) {
  int seen = 0;
  for (const char* command : {"run", "bench", "plan"})
    for (const Flag* f : flags_of(command_bit(command))) {
      if (f->check != Check::Choice) continue;
      const std::string name = flag_name(*f), set = fmt::format("{{{}}}", fmt::join(f->choices, ","));
      for (const char* value : {"", "x y"}) {
        const auto [what, help] = refusal({command, name.c_str(), value});
        EXPECT_EQ(what, fmt::format("{}: '{}' not in {}", name, value, set)) << command;
        EXPECT_EQ(help, fmt::format("(see ringattn {} --help)", command)) << name;
      }
      ++seen;
    }
  EXPECT_EQ(seen, 12);  // run, bench: --device --dtype --shard --transport; bench: --timer --impl; plan: --shard --dtype
}

TEST(FlagTable, ParseErrorsNameTheirOwnSubcommandsHelp) {
  EXPECT_EQ(refusal({"plan", "--bogus"}).second, "(see ringattn plan --help)");
  EXPECT_EQ(refusal({"plan", "--seq", "0"}).second, "(see ringattn plan --help)");
  EXPECT_EQ(refusal({"bench", "--bogus"}).second, "(see ringattn bench --help)");
  EXPECT_EQ(refusal({"run", "--seq", "0"}).second, "(see ringattn run --help)");
  EXPECT_EQ(refusal({"--bogus"}).second, "(see ringattn --help)");
}

}  // namespace
