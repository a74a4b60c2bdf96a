#include "core/check.hpp"

#include <string>

#include "core/error.hpp"
#include "core/host.hpp"

namespace ringattn::core {

void throw_call_failed(const char* library, const char* call, const char* file, int line, const char* text,
                       long long code, const char* code_name) {
  // The call's name only (its text up to the argument list), not every argument.
  std::string name(call ? call : "?");
  if (const auto paren = name.find('('); paren != std::string::npos && paren > 0 && name[paren - 1] != ' ')
    name.resize(paren);
  const std::string code_text = code_name ? std::string(code_name) : std::to_string(code);
  fail_runtime("{}{} failed at {}:{}: {} ({} error {})", identity_prefix(), name, file, line,
               (text && *text) ? text : "no description", library, code_text);
}

}  // namespace ringattn::core
