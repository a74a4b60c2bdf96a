// The check-macro family (core/check.hpp): the message names the call (without its arguments),
// the file, the line, the rank and host, the library's text and its error code. The NCCL macro
// is exercised with stand-ins for ncclResult_t and ncclGetErrorString, which is all it expands to.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "core/check.hpp"
#include "core/error.hpp"
#include "core/host.hpp"

namespace {

enum ncclResult_t { ncclSuccess = 0, ncclSystemError = 2, ncclInProgress = 7 };
const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSystemError ? "unhandled system error" : "?"; }

ncclResult_t fake_nccl_call(ncclResult_t r, int /*unused*/) { return r; }

std::string message_of(void (*f)()) {
  try {
    f();
  } catch (const ringattn::RuntimeError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckMacros, NameTheCallFileLineRankHostTextAndCode) {
  ringattn::core::set_identity(3);
  const int line = __LINE__ + 1;
  const std::string m = message_of([] { RA_CHECK_NCCL(fake_nccl_call(ncclSystemError, 42)); });
  const std::string expected = "rank 3 on " + ringattn::host_name() + ": fake_nccl_call failed at " +
                               std::string(__FILE__) + ":" + std::to_string(line) +
                               ": unhandled system error (NCCL error 2)";
  EXPECT_EQ(m, expected);
  ringattn::core::set_identity(-1);
}

TEST(CheckMacros, SuccessAndInProgressPass) {
  EXPECT_NO_THROW(RA_CHECK_NCCL(fake_nccl_call(ncclSuccess, 0)));
  EXPECT_NO_THROW(RA_CHECK_NCCL(fake_nccl_call(ncclInProgress, 0)));
}

TEST(CheckMacros, ACodeNameReplacesTheNumberAndADescriptionIsNeverEmpty) {
  ringattn::core::set_identity(0);
  const std::string m = message_of([] {
    ringattn::core::throw_call_failed("CUDA", "cudaMemcpy(dst, src, n, kind)", "f.cu", 7, "", 1, "cudaErrorInvalidValue");
  });
  EXPECT_TRUE(std::regex_search(m, std::regex(": cudaMemcpy failed at f\\.cu:7: no description \\(CUDA error "
                                              "cudaErrorInvalidValue\\)$")))
      << m;
  EXPECT_EQ(m.rfind("rank 0 on ", 0), 0u) << m;
  ringattn::core::set_identity(-1);
}

TEST(CheckMacros, AWhatWithASpaceBeforeItsParenthesisKeepsItAndNoRankIsNamedBeforeOneIsKnown) {
  const std::string m = message_of([] {
    ringattn::core::throw_call_failed("NCCL", "ncclCommGetAsyncError (exchange)", "t.cpp", 1, "remote error", 6);
  });
  EXPECT_NE(m.find(": ncclCommGetAsyncError (exchange) failed at t.cpp:1: remote error (NCCL error 6)"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.rfind(ringattn::host_name() + ": ", 0), 0u) << m;
}

}  // namespace
