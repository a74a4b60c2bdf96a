#include "comm/transport.hpp"

#include <utility>

#include "core/error.hpp"

namespace ringattn {

void Transport::check_peers(int to, int from) const {
  const int n = size();
  for (const auto& [role, peer] : {std::pair<const char*, int>{"to", to}, {"from", from}})
    if (peer < 0 || peer >= n)
      fail_arg("rank {}: exchange peer {} = {} is not a rank of the {} transport (allowed are 0 to {})", rank(), role,
               peer, name(), n - 1);
}

}  // namespace ringattn
