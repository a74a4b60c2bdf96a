// Randomized command lines through the real parser (parse_command_line, as main calls it):
// flags of every subcommand with plausible, extreme and garbage values, shuffled and cut. Every
// outcome must be a parsed configuration or a clean error (CLI11's ParseError or our
// InvalidArgument), never a crash or another exception. Bounded iterations, a fresh seed each
// run, printed on failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "common/test_util.hpp"
#include "core/error.hpp"

namespace ringattn::cli {
namespace {

const std::vector<std::string> kCommands = {"run", "bench", "plan", "", "--version", "--help", "frobnicate"};
const std::vector<std::string> kFlags = {
    "--batch", "--heads", "--kv-heads", "--seq", "--kv-seq", "--dim", "--q-offset", "--seed", "--q", "--k", "--v",
    "--layout", "--causal", "--device", "--dtype", "--tile-q", "--tile-k", "--shard", "--transport", "--check-rows",
    "--log-level", "--timeout", "--check", "--check-finite", "--dry-run", "--out", "--lse", "--json", "-b", "-e",
    "-f", "-n", "-w", "--seq-min", "--seq-max", "--seq-factor", "--iters", "--warmup", "--impl", "--naive",
    "--no-check", "--ranks", "--help", "--version", "-", "--", "---", "--seq=", "--timeout=0"};
const std::vector<std::string> kValues = {
    "0", "1", "2", "-1", "7", "64", "2048", "65536", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "1e3", "1.5", "0.0", "nan", "inf", "-inf", "1e308", "1e-320", "0x10", "",
    " ", "fp32", "bf16", "fp16", "cpu", "cuda", "zigzag", "striped", "contiguous", "mpi", "nccl", "local", "auto",
    "both", "naive", "flash", "info", "off", "TRACE", "/nonexistent/x.npy", "-", "--", "\xff\xfe", "%s%n",
    "{}", "a=b", "--seq", "300", "1e6", "1000001", "bhsd", "bshd", "thd",
    // Integers are decimal: octal- and hex-looking values, signs, seeds beyond 2^64 - 1.
    "064", "08", "010", "+5", "-0", "0x40", "0b1", "18446744073709551615", "18446744073709551616", "1e23",
    "-18446744073709551615", "00000000000000000000064"};

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
      // Every integer flag read its value as decimal: "064" is 64, never octal 52.
      size_t last_seq = 0;
      for (size_t i = 2; i < args.size(); ++i)
        if (args[i] == "--seq" || args[i].rfind("--seq=", 0) == 0) last_seq = i;
      if (cl.command == "run" && last_seq > 0 && args[last_seq] == "--seq" && last_seq + 1 < args.size() &&
          args[last_seq + 1] == "064")
        EXPECT_EQ(cl.run.problem.seq, 64) << "seed " << seed << ":" << shown;
      if (cl.command == "run") {
        EXPECT_GE(cl.run.problem.seq, 1) << "seed " << seed << ":" << shown;
        EXPECT_FALSE(cl.run.problem.q_offset && !cl.run.problem.causal) << "seed " << seed << ":" << shown;
        EXPECT_FALSE(cl.run.out_file.empty() && args.end() != std::find(args.begin(), args.end(), "--out="))
            << "seed " << seed << ":" << shown;
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

// Found by the fuzzer under UBSan: CLI11 negated the value of "--no-check=VALUE". Any value of a
// negated switch is refused before CLI11 reads it, "false" too (it used to be accepted).
TEST(CliFuzz, NegatedFlagTakesNoValue) {
  for (const char* word : {"--no-check=-9223372036854775808", "--no-check=false", "--no-check=true"}) {
    CommandLine cl;
    const auto app = make_app(cl);
    const char* argv[] = {"ringattn", "bench", word};
    try {
      parse_command_line(*app, cl, 3, argv);
      ADD_FAILURE() << word << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string(word) + ": a switch takes no value; give --no-check or leave it out");
    }
  }
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
  for (const char* bad : {"0", "-1", "nan", "inf", "abc", "1e7", "", "1e-300", "0.0009"}) {
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
  // --timeout wins over RINGATTN_MPI_TIMEOUT_S, even over one that is refused.
  const Settings bad_env = parse_settings([](const char* n) { return std::string(n) == "RINGATTN_MPI_TIMEOUT_S" ? "abc" : nullptr; });
  EXPECT_EQ(bad_env.timeout_s(cl.bench.problem.timeout_s), 2.5);
}

// Parses `args` (after "ringattn") and returns the message of the error, "" when it parsed.
std::string parse_error(CommandLine& cl, std::vector<const char*> args) {
  args.insert(args.begin(), "ringattn");
  const auto app = make_app(cl);
  try {
    parse_command_line(*app, cl, int(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(CliDecimal, IntegersAreDecimal) {
  CommandLine cl;
  ASSERT_EQ(parse_error(cl, {"run", "--seq", "064", "--dim", "010", "--heads", "08", "--kv-heads", "+2", "--seed",
                             "0777", "--check-rows", "09", "--causal", "--q-offset", "-010", "--check"}),
            "");
  EXPECT_EQ(cl.run.problem.seq, 64);
  EXPECT_EQ(cl.run.problem.dim, 10);
  EXPECT_EQ(cl.run.problem.heads, 8);
  EXPECT_EQ(cl.run.problem.kv_heads, 2);
  EXPECT_EQ(cl.run.problem.seed, 777u);
  EXPECT_EQ(cl.run.problem.check_rows, 9);
  EXPECT_EQ(cl.run.problem.q_offset, -10);
  CommandLine b;
  ASSERT_EQ(parse_error(b, {"bench", "-b", "010", "-e", "020", "-n", "03", "-w", "00", "--tile-q", "016"}), "");
  EXPECT_EQ(b.bench.seq_min, 10);
  EXPECT_EQ(b.bench.seq_max, 20);
  EXPECT_EQ(b.bench.iters, 3);
  EXPECT_EQ(b.bench.warmup, 0);
  EXPECT_EQ(b.bench.problem.tile_q, 16);
  CommandLine pl;
  ASSERT_EQ(parse_error(pl, {"plan", "--ranks", "010", "--seq", "0128"}), "");
  EXPECT_EQ(pl.plan.ranks, 10);
  EXPECT_EQ(pl.plan.seq, 128);
  CommandLine big;
  ASSERT_EQ(parse_error(big, {"run", "--seed", "18446744073709551615"}), "");
  EXPECT_EQ(big.run.problem.seed, UINT64_MAX);
}

TEST(CliDecimal, NonDecimalAndOutOfRangeAreRefused) {
  const std::pair<std::vector<const char*>, std::string> cases[] = {
      {{"run", "--seq", "0x40"}, "--seq: must be a decimal integer (got '0x40')"},
      {{"run", "--seq", "1e3"}, "--seq: must be a decimal integer (got '1e3')"},
      // The flag's own range, not the int64 range (review M5).
      {{"run", "--dim", "99999999999999999999"}, "--dim: must be an integer in 1..9223372036854775807 (got '99999999999999999999')"},
      {{"run", "--seed", "-1"}, "--seed: must be a decimal integer in 0..18446744073709551615 (got '-1')"},
      {{"run", "--seed", "18446744073709551616"},
       "--seed: must be an integer in 0..18446744073709551615 (got '18446744073709551616')"},
      {{"run", "--seed", "1e23"}, "--seed: must be a decimal integer in 0..18446744073709551615 (got '1e23')"},
      {{"bench", "-f", "0x2"}, "--seq-factor: must be a decimal number (got '0x2')"},
      {{"run", "--timeout", "0x10"}, "--timeout: must be a decimal number (got '0x10')"},
  };
  for (const auto& [args, want] : cases) {
    CommandLine cl;
    const std::string e = parse_error(cl, args);
    EXPECT_NE(e.find(want), std::string::npos) << "got: " << e << "\nwant: " << want;
  }
}

TEST(CliIgnoredFlags, CombinationsThatWouldBeIgnoredAreRefused) {
  const std::pair<std::vector<const char*>, std::string> cases[] = {
      {{"run", "--q-offset", "5"},
       "--q-offset 5 only shifts the causal mask or the window and does nothing without --causal or --window"},
      {{"run", "--check-rows", "4"}, "--check-rows 4 without the check does nothing"},
      {{"bench", "--no-check", "--check-rows", "4"}, "--check-rows 4 without the check does nothing"},
      {{"run", "--out", ""}, "--out: the path is empty; give a file name"},
      {{"run", "--lse", ""}, "--lse: the path is empty; give a file name"},
      {{"bench", "--json", ""}, "--json: the path is empty; give a file name"},
      {{"run", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--seq", "128"},
       "--seq does not apply with --q/--k/--v: the files' shapes fix batch, heads, lengths and dim; drop --seq"},
      {{"run", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--dim", "128"}, "--dim does not apply with --q/--k/--v"},
  };
  for (const auto& [args, want] : cases) {
    CommandLine cl;
    const std::string e = parse_error(cl, args);
    EXPECT_NE(e.find(want), std::string::npos) << "got: " << e << "\nwant: " << want;
  }
  CommandLine ok;
  EXPECT_EQ(parse_error(ok, {"run", "--q-offset", "5", "--causal", "--check-rows", "3", "--check"}), "");
}

}  // namespace
}  // namespace ringattn::cli
