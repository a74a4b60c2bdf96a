// The backward's command-line rules through the real parser: which worlds --backward runs on
// (the ring backward is issue 19) and the flags that need --backward.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/options.hpp"
#include "core/error.hpp"

namespace ringattn::cli {
namespace {

// The InvalidArgument text of parsing `args` (after the program name) and then checking a world of
// `world` ranks; "" when both pass.
std::string refusal(std::vector<const char*> args, int world) {
  args.insert(args.begin(), "ringattn");
  CommandLine cl;
  const auto app = make_app(cl);
  try {
    parse_command_line(*app, cl, int(args.size()), args.data());
    check_world_for(cl, world);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(CliBackward, NeedsAWorldOfOne) {
  const std::string want =
      "the ring backward is not built yet (issue 19): --backward needs a world of one (this job has 4 ranks)";
  EXPECT_NE(refusal({"run", "--backward"}, 4).find(want), std::string::npos);
  EXPECT_NE(refusal({"bench", "--backward"}, 4).find(want), std::string::npos);
  EXPECT_EQ(refusal({"run", "--backward"}, 1), "");
  EXPECT_EQ(refusal({"run"}, 4), "");  // the forward runs on any world
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
