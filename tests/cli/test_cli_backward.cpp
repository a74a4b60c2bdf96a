// The backward's command-line rules through the real parser: the flags that need --backward, and
// what --backward no longer refuses (worlds of several ranks are not checked before MPI).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/options.hpp"
#include "core/error.hpp"

namespace ringattn::cli {
namespace {

// The InvalidArgument text of parsing `args` (after the program name); "" when it passes.
std::string refusal(std::vector<const char*> args, int /*world*/) {
  args.insert(args.begin(), "ringattn");
  CommandLine cl;
  const auto app = make_app(cl);
  try {
    parse_command_line(*app, cl, int(args.size()), args.data());
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(CliBackward, DocumentsAreAccepted) {
  EXPECT_EQ(refusal({"run", "--backward", "--causal", "--doc-lens", "10,20"}, 1), "");
  EXPECT_EQ(refusal({"bench", "--backward", "--docs", "fixed:7"}, 1), "");
}

TEST(CliBackward, FlagsThatNeedBackward) {
  for (const char* flag : {"--do", "--dq", "--dk", "--dv"}) {
    const std::string m = refusal({"run", flag, "x.npy"}, 1);
    EXPECT_NE(m.find(std::string(flag) + " only applies to the backward pass and does nothing without --backward"),
              std::string::npos)
        << m;
    EXPECT_EQ(refusal({"run", "--backward", flag, "x.npy"}, 1), "") << flag;
  }
  EXPECT_NE(refusal({"bench", "--deterministic"}, 1).find("--deterministic only applies to the backward pass"),
            std::string::npos);
}

}  // namespace
}  // namespace ringattn::cli
