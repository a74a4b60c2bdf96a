#include "core/host.hpp"

#include <unistd.h>

#include <atomic>

namespace ringattn {

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  std::string h(buf);
  if (const auto dot = h.find('.'); dot != std::string::npos) h.resize(dot);
  return h.empty() ? "unknown-host" : h;
}

namespace core {
namespace {
std::atomic<int> g_rank{-1};
}  // namespace

void set_identity(int rank) { g_rank.store(rank); }

int identity_rank() { return g_rank.load(); }

std::string identity_prefix() {
  static const std::string host = host_name();
  const int r = identity_rank();
  return r < 0 ? host + ": " : "rank " + std::to_string(r) + " on " + host + ": ";
}

}  // namespace core
}  // namespace ringattn
