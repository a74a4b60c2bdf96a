// The RINGATTN_* variables (core/settings.hpp): each one's values, its default when unset or
// empty, the refusal of a bad value (naming the variable, the value and what is allowed), raised
// only where the value is used; the docs table, and README.md's table held to it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "core/error.hpp"
#include "core/settings.hpp"

namespace ringattn {
namespace {

Settings parse(const std::map<std::string, std::string>& env) {
  return parse_settings([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// get() of `s` throws InvalidArgument with exactly `message`, which refusal() holds too.
template <class T>
void expect_refused(const Setting<T>& s, const std::string& message) {
  EXPECT_EQ(s.refusal(), message);
  try {
    s.get();
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(Settings, UnsetAndEmptyVariablesTakeTheDefaults) {
  std::map<std::string, std::string> empty;
  for (const SettingDoc& d : setting_docs()) empty[d.name] = "";
  for (const Settings& s : {parse({}), parse(empty)}) {
    EXPECT_EQ(s.fault.get(), "");
    EXPECT_EQ(s.log_level.get(), std::nullopt);
    EXPECT_EQ(s.mpi_timeout_s.get(), std::nullopt);
    EXPECT_EQ(s.timeout_s(std::nullopt), 300.0);
    EXPECT_EQ(s.mpi_progress.get(), MpiProgress::Auto);
    const KernelChoices k = s.kernels();
    EXPECT_EQ(k.flash, FlashKernel::Auto);
    EXPECT_EQ(k.backward, BackwardKernel::Auto);
    EXPECT_EQ(k.backward_dq, BackwardDq::Auto);
    EXPECT_EQ(k.hopper_tile, "");
    EXPECT_TRUE(k.hopper_lazy);
  }
  // A default-made Settings is the same as an empty environment.
  EXPECT_EQ(Settings{}.timeout_s(std::nullopt), 300.0);
  EXPECT_TRUE(Settings{}.kernels().hopper_lazy);
  EXPECT_EQ(Settings{}.mpi_progress.get(), MpiProgress::Auto);
}

TEST(Settings, TheFaultPlanIsKeptAsItsText) {
  // Its syntax is the runner's (parse_fault_plan, runner/faults/fault.hpp; FaultPlan tests).
  EXPECT_EQ(parse({{"RINGATTN_FAULT", "1:0:exit:grads"}}).fault.get(), "1:0:exit:grads");
  EXPECT_EQ(parse({{"RINGATTN_FAULT", "garbage"}}).fault.get(), "garbage");
}

TEST(Settings, LogLevel) {
  const std::pair<const char*, LogLevel> good[] = {
      {"trace", LogLevel::Trace}, {"debug", LogLevel::Debug}, {"info", LogLevel::Info},
      {"warn", LogLevel::Warn},   {"WARNING", LogLevel::Warn}, {"error", LogLevel::Error},
      {"Err", LogLevel::Error},   {"critical", LogLevel::Critical}, {"off", LogLevel::Off}};
  for (const auto& [text, level] : good) EXPECT_EQ(parse({{"RINGATTN_LOG_LEVEL", text}}).log_level.get(), level) << text;
  expect_refused(parse({{"RINGATTN_LOG_LEVEL", "loud"}}).log_level,
                 "RINGATTN_LOG_LEVEL='loud' is not understood: allowed are trace, debug, info, warn, error, critical, "
                 "off");
  EXPECT_STREQ(log_level_name(LogLevel::Warn), "warn");
}

TEST(Settings, MpiTimeoutTakesDecimalSecondsOnly) {
  for (const auto& [text, v] : std::map<std::string, double>{{"12", 12}, {"2.5", 2.5}, {"1e3", 1e3}, {"+7", 7},
                                                              {"1000000", 1e6}, {"0.001", 0.001}})
    EXPECT_EQ(parse({{"RINGATTN_MPI_TIMEOUT_S", text}}).mpi_timeout_s.get(), v) << text;
  for (const char* bad : {"abc", "0x10", " 5", "5 ", "0", "-1", "inf", "nan", "1e7", "1000001", "5s", ".", "1e-300",
                          "0.0009"})
    expect_refused(parse({{"RINGATTN_MPI_TIMEOUT_S", bad}}).mpi_timeout_s,
                   std::string("RINGATTN_MPI_TIMEOUT_S='") + bad +
                       "' must be a number of seconds >= 0.001 and <= 1e+06 (or use --timeout)");
}

TEST(Settings, AGivenTimeoutWinsOverTheVariableEvenARefusedOne) {
  EXPECT_EQ(parse({{"RINGATTN_MPI_TIMEOUT_S", "12"}}).timeout_s(std::nullopt), 12.0);
  EXPECT_EQ(parse({{"RINGATTN_MPI_TIMEOUT_S", "12"}}).timeout_s(7.0), 7.0);
  const Settings bad = parse({{"RINGATTN_MPI_TIMEOUT_S", "abc"}});
  EXPECT_EQ(bad.timeout_s(7.0), 7.0);
  EXPECT_THROW(bad.timeout_s(std::nullopt), InvalidArgument);
}

TEST(Settings, MpiProgress) {
  EXPECT_EQ(parse({{"RINGATTN_MPI_PROGRESS", "thread"}}).mpi_progress.get(), MpiProgress::HelperThread);
  EXPECT_EQ(parse({{"RINGATTN_MPI_PROGRESS", "nonblocking"}}).mpi_progress.get(), MpiProgress::Nonblocking);
  for (const char* bad : {"auto", "helper", "Thread"})
    expect_refused(parse({{"RINGATTN_MPI_PROGRESS", bad}}).mpi_progress,
                   std::string("RINGATTN_MPI_PROGRESS='") + bad +
                       "' is not understood: allowed are thread, nonblocking (or unset)");
}

TEST(Settings, FlashKernel) {
  EXPECT_EQ(parse({{"RINGATTN_FLASH_KERNEL", "auto"}}).flash_kernel.get(), FlashKernel::Auto);
  EXPECT_EQ(parse({{"RINGATTN_FLASH_KERNEL", "hopper"}}).flash_kernel.get(), FlashKernel::Hopper);
  EXPECT_EQ(parse({{"RINGATTN_FLASH_KERNEL", "portable"}}).flash_kernel.get(), FlashKernel::Portable);
  expect_refused(parse({{"RINGATTN_FLASH_KERNEL", "wgmma"}}).flash_kernel,
                 "RINGATTN_FLASH_KERNEL='wgmma' is not understood: allowed are auto, hopper, portable");
  EXPECT_STREQ(flash_kernel_name(FlashKernel::Portable), "portable");
}

TEST(Settings, BackwardKernel) {
  const std::pair<const char*, BackwardKernel> good[] = {{"auto", BackwardKernel::Auto},
                                                         {"hopper", BackwardKernel::Hopper},
                                                         {"mma", BackwardKernel::Mma},
                                                         {"simt", BackwardKernel::Simt}};
  for (const auto& [text, kernel] : good) {
    EXPECT_EQ(parse({{"RINGATTN_BACKWARD_KERNEL", text}}).backward_kernel.get(), kernel) << text;
    EXPECT_EQ(backward_kernel_name(kernel), std::string(text));
  }
  expect_refused(parse({{"RINGATTN_BACKWARD_KERNEL", "tensor"}}).backward_kernel,
                 "RINGATTN_BACKWARD_KERNEL='tensor' is not understood: allowed are auto, hopper, mma, simt");
}

TEST(Settings, BackwardDq) {
  EXPECT_EQ(parse({{"RINGATTN_BACKWARD_DQ", "auto"}}).backward_dq.get(), BackwardDq::Auto);
  EXPECT_EQ(parse({{"RINGATTN_BACKWARD_DQ", "separate"}}).backward_dq.get(), BackwardDq::Separate);
  EXPECT_EQ(parse({{"RINGATTN_BACKWARD_DQ", "atomic"}}).backward_dq.get(), BackwardDq::Atomic);
  expect_refused(parse({{"RINGATTN_BACKWARD_DQ", "atomics"}}).backward_dq,
                 "RINGATTN_BACKWARD_DQ='atomics' is not understood: allowed are auto, separate, atomic");
}

TEST(Settings, HopperTileAndLazy) {
  EXPECT_EQ(parse({{"RINGATTN_HOPPER_TILE", "auto"}}).hopper_tile.get(), "");
  for (const char* name : kHopperTileNames)
    EXPECT_EQ(parse({{"RINGATTN_HOPPER_TILE", name}}).hopper_tile.get(), name);
  expect_refused(parse({{"RINGATTN_HOPPER_TILE", "128x256"}}).hopper_tile,
                 "RINGATTN_HOPPER_TILE='128x256' is not understood: allowed are auto, 128x128, 128x176, 192x128, "
                 "128x128q2, 128x80, 128x176c2, 128x128c2");
  EXPECT_TRUE(parse({{"RINGATTN_HOPPER_LAZY", "1"}}).hopper_lazy.get());
  EXPECT_FALSE(parse({{"RINGATTN_HOPPER_LAZY", "0"}}).hopper_lazy.get());
  expect_refused(parse({{"RINGATTN_HOPPER_LAZY", "yes"}}).hopper_lazy,
                 "RINGATTN_HOPPER_LAZY='yes' is not understood: allowed are 1, 0");
}

// A bad value stops only what uses it: the other variables read as they are.
TEST(Settings, ARefusalStaysWithItsVariable) {
  const Settings s = parse({{"RINGATTN_HOPPER_TILE", "huge"}, {"RINGATTN_MPI_TIMEOUT_S", "9"},
                            {"RINGATTN_MPI_PROGRESS", "thread"}, {"RINGATTN_BACKWARD_DQ", "wrong"}});
  EXPECT_EQ(s.timeout_s(std::nullopt), 9.0);
  EXPECT_EQ(s.mpi_progress.get(), MpiProgress::HelperThread);
  EXPECT_EQ(s.flash_kernel.get(), FlashKernel::Auto);
  // kernels() throws the first refusal among the kernel variables, in Settings' order.
  try {
    s.kernels();
    ADD_FAILURE() << "kernels() accepted a refused value";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "RINGATTN_BACKWARD_DQ='wrong' is not understood: allowed are auto, separate, atomic");
  }
}

TEST(Settings, ReadsTheEnvironment) {
  const char* saved = std::getenv("RINGATTN_BACKWARD_KERNEL");
  const std::string keep = saved ? saved : "";
  setenv("RINGATTN_BACKWARD_KERNEL", "simt", 1);
  EXPECT_EQ(settings_from_environment().backward_kernel.get(), BackwardKernel::Simt);
  setenv("RINGATTN_BACKWARD_KERNEL", "bogus", 1);
  EXPECT_NE(settings_from_environment().backward_kernel.refusal().find("RINGATTN_BACKWARD_KERNEL='bogus'"),
            std::string::npos);
  if (saved) setenv("RINGATTN_BACKWARD_KERNEL", keep.c_str(), 1);
  else unsetenv("RINGATTN_BACKWARD_KERNEL");
}

// Every variable the parser reads is in the docs table, and a bad value of each names it.
TEST(Settings, TheDocsListEveryVariable) {
  std::vector<std::string> asked;
  parse_settings([&](const char* name) -> const char* {
    asked.emplace_back(name);
    return nullptr;
  });
  std::vector<std::string> documented;
  for (const SettingDoc& d : setting_docs()) {
    documented.emplace_back(d.name);
    EXPECT_FALSE(d.values.empty() || d.fallback.empty() || std::string(d.does).empty()) << d.name;
  }
  EXPECT_EQ(asked, documented);
  ASSERT_EQ(documented.size(), 9u);
  for (const std::string& name : documented) {
    if (name == "RINGATTN_FAULT") continue;  // parsed by the runner (FaultPlan tests)
    const Settings s = parse({{name, "?bad?"}});
    const std::string refusals = s.log_level.refusal() + s.mpi_timeout_s.refusal() + s.mpi_progress.refusal() +
                                 s.flash_kernel.refusal() + s.backward_kernel.refusal() + s.backward_dq.refusal() +
                                 s.hopper_tile.refusal() + s.hopper_lazy.refusal();
    EXPECT_EQ(refusals.rfind(name + "='?bad?'", 0), 0u) << refusals;
  }
}

// README.md's table of the variables is setting_docs(), row for row.
TEST(Settings, TheReadmeTableIsTheDocsTable) {
  std::ifstream in(RINGATTN_README_PATH);
  ASSERT_TRUE(in) << RINGATTN_README_PATH;
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  std::string previous;
  size_t at = 0;
  for (const SettingDoc& d : setting_docs()) {
    const std::string row = "| `" + std::string(d.name) + "` | " + d.values + " | " + d.fallback + " | " + d.does + " |\n";
    const size_t pos = readme.find(row);
    EXPECT_NE(pos, std::string::npos) << "README.md lacks the row\n" << row;
    if (pos != std::string::npos) {
      EXPECT_GE(pos, at) << d.name << " comes before " << previous << " in README.md";
      at = pos;
    }
    previous = d.name;
  }
}

}  // namespace
}  // namespace ringattn
