#include "core/dtype.hpp"

#include "core/error.hpp"

namespace ringattn {

std::string dtype_names(const char* sep, const char* last) {
  std::string s;
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (i > 0) s += last != nullptr && i + 1 == kDTypes.size() ? last : sep;
    s += kDTypes[i].name;
  }
  return s;
}

DType parse_dtype(const std::string& name) {
  for (const DTypeInfo& d : kDTypes) {
    if (name == d.name || name == d.full_name) return d.id;
    for (const char* alias : d.aliases)
      if (alias != nullptr && name == alias) return d.id;
  }
  fail_arg("unknown dtype '{}': allowed are {}", name, dtype_names());
}

}  // namespace ringattn
