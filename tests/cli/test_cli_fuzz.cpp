// Randomized command lines through the real parser (parse_command_line, as main calls it):
// flags of every subcommand with plausible, extreme and garbage values, shuffled and cut. Every
// outcome must be a parsed configuration or a clean error (CLI11's ParseError or our
// InvalidArgument), never a crash or another exception. Bounded iterations, a fresh seed each
// run, printed on failure.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "common/test_util.hpp"
#include "ringattn/error.hpp"

namespace ringattn::cli {
namespace {

const std::vector<std::string> kCommands = {"run", "bench", "plan", "", "--version", "--help", "frobnicate"};
const std::vector<std::string> kFlags = {
    "--batch", "--heads", "--kv-heads", "--seq", "--kv-seq", "--dim", "--q-offset", "--seed", "--q", "--k", "--v",
    "--causal", "--device", "--dtype", "--tile-q", "--tile-k", "--shard", "--transport", "--check-rows",
    "--log-level", "--timeout", "--check", "--check-finite", "--dry-run", "--out", "--lse", "--json", "-b", "-e",
    "-f", "-n", "-w", "--seq-min", "--seq-max", "--seq-factor", "--iters", "--warmup", "--impl", "--naive",
    "--no-check", "--ranks", "--help", "--version", "-", "--", "---", "--seq=", "--timeout=0"};
const std::vector<std::string> kValues = {
    "0", "1", "2", "-1", "7", "64", "2048", "65536", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "1e3", "1.5", "0.0", "nan", "inf", "-inf", "1e308", "1e-320", "0x10", "",
    " ", "fp32", "bf16", "fp16", "cpu", "cuda", "zigzag", "striped", "contiguous", "mpi", "nccl", "local", "auto",
    "both", "naive", "flash", "info", "off", "TRACE", "/nonexistent/x.npy", "-", "--", "\xff\xfe", "%s%n",
    "{}", "a=b", "--seq", "300", "1e6", "1000001"};

std::string garbage(std::mt19937_64& rng) {
  std::string s(rng() % 12, ' ');
  for (char& c : s) c = char(1 + rng() % 255);
  return s;
}

std::vector<std::string> random_argv(std::mt19937_64& rng) {
  std::vector<std::string> a = {"ringattn"};
  const std::string cmd = kCommands[rng() % kCommands.size()];
  if (!cmd.empty()) a.push_back(cmd);
  const int n = int(rng() % 9);
  for (int i = 0; i < n; ++i) {
    const unsigned pick = unsigned(rng() % 10);
    if (pick < 6) {
      a.push_back(kFlags[rng() % kFlags.size()]);
      if (rng() % 4 != 0) a.push_back(kValues[rng() % kValues.size()]);
    } else if (pick < 8) {
      a.push_back(kValues[rng() % kValues.size()]);
    } else if (pick < 9) {
      a.push_back(kFlags[rng() % kFlags.size()] + "=" + kValues[rng() % kValues.size()]);
    } else {
      a.push_back(garbage(rng));
    }
  }
  return a;
}

TEST(CliFuzz, EveryCommandLineParsesOrFailsCleanly) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const std::vector<std::string> args = random_argv(rng);
    std::vector<const char*> argv;
    for (const std::string& s : args) argv.push_back(s.c_str());
    std::string shown;
    for (const std::string& s : args) shown += " '" + s + "'";
    CommandLine cl;
    const auto app = make_app(cl);
    try {
      parse_command_line(*app, cl, int(argv.size()), argv.data());
      ++parsed;
      // A parsed command is one the program can act on.
      if (!cl.show_version) {
        ASSERT_TRUE(cl.command == "run" || cl.command == "bench" || cl.command == "plan")
            << "seed " << seed << ":" << shown;
      }
      if (cl.command == "run" && cl.run.problem.timeout_s) {
        EXPECT_GT(*cl.run.problem.timeout_s, 0) << "seed " << seed << ":" << shown;
        EXPECT_LE(*cl.run.problem.timeout_s, kMaxTimeoutS) << "seed " << seed << ":" << shown;
      }
      if (cl.command == "run") {
        EXPECT_GE(cl.run.problem.seq, 1) << "seed " << seed << ":" << shown;
        EXPECT_EQ(cl.run.problem.heads % cl.run.problem.kv_heads, 0) << "seed " << seed << ":" << shown;
      }
    } catch (const CLI::ParseError&) {
      ++rejected;
    } catch (const InvalidArgument&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "seed " << seed << ": unexpected " << typeid(e).name() << " '" << e.what() << "' for" << shown;
    }
  }
  // The vocabulary reaches both outcomes; a generator that only makes errors tests nothing.
  EXPECT_GT(parsed, 100) << "seed " << seed;
  EXPECT_GT(rejected, 100) << "seed " << seed;
}

// Found by the fuzzer under UBSan: CLI11 negated the value of "--no-check=VALUE".
TEST(CliFuzz, NegatedFlagTakesNoValue) {
  CommandLine cl;
  const auto app = make_app(cl);
  const char* argv[] = {"ringattn", "bench", "--no-check=-9223372036854775808"};
  EXPECT_THROW(parse_command_line(*app, cl, 3, argv), CLI::ParseError);
}

TEST(CliFuzz, NoArgumentsIsTheDefaultRun) {
  CommandLine cl;
  const auto app = make_app(cl);
  const char* argv[] = {"ringattn"};
  parse_command_line(*app, cl, 1, argv);
  EXPECT_EQ(cl.command, "run");
  EXPECT_TRUE(cl.run.problem.causal);
  EXPECT_TRUE(cl.run.check);
  EXPECT_FALSE(cl.run.problem.timeout_s.has_value());
}

TEST(CliFuzz, TimeoutMustBePositiveAndBounded) {
  for (const char* bad : {"0", "-1", "nan", "inf", "abc", "1e7", ""}) {
    CommandLine cl;
    const auto app = make_app(cl);
    const char* argv[] = {"ringattn", "run", "--timeout", bad};
    EXPECT_THROW(parse_command_line(*app, cl, 4, argv), CLI::ParseError) << bad;
  }
  CommandLine cl;
  const auto app = make_app(cl);
  const char* argv[] = {"ringattn", "bench", "--timeout", "2.5"};
  parse_command_line(*app, cl, 4, argv);
  ASSERT_TRUE(cl.bench.problem.timeout_s.has_value());
  EXPECT_EQ(*cl.bench.problem.timeout_s, 2.5);
  EXPECT_EQ(resolve_timeout(cl.bench.problem), 2.5);
}

}  // namespace
}  // namespace ringattn::cli
