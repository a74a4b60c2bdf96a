// Errors are exceptions with a message a user can act on: what was wrong, the value, what is
// allowed. The CLI turns them into one line on stderr and a non-zero exit code.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace ringattn {

// A bad input or configuration (a user error): the message names the value and what is allowed.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A failure while running (a system, library or peer failure).
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail_arg(fmt::format_string<Args...> f, Args&&... args) {
  throw InvalidArgument(fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_runtime(fmt::format_string<Args...> f, Args&&... args) {
  throw RuntimeError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ringattn
