#include "comm/transport.hpp"

#include <numeric>
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

void Transport::check_alltoall_counts(std::span<const size_t> send_bytes, std::span<const size_t> recv_bytes) const {
  if (send_bytes.size() != size_t(size()) || recv_bytes.size() != size_t(size()))
    fail_arg("rank {}: all-to-all over the {} transport needs {} send and {} receive counts, one per rank (got {} and {})",
             rank(), name(), size(), size(), send_bytes.size(), recv_bytes.size());
}

void Transport::check_colours(std::span<const int> colours) const {
  for (size_t q = 0; q < colours.size(); ++q)
    if (colours[q] < 0)
      fail_arg("rank {}: split of the {} transport: rank {} gave colour {}; a colour must be >= 0", rank(), name(), q,
               colours[q]);
}

void Transport::alltoall(const void* send, std::span<const size_t> send_bytes, void* recv,
                         std::span<const size_t> recv_bytes) {
  check_alltoall_counts(send_bytes, recv_bytes);
  const int r = rank(), n = size();
  const auto offset = [](std::span<const size_t> counts, int q) {
    return std::accumulate(counts.begin(), counts.begin() + q, size_t(0));
  };
  for (int d = 0; d < n; ++d) {
    const int to = (r + d) % n, from = (r + n - d) % n;
    start_peer_exchange(to, static_cast<const char*>(send) + offset(send_bytes, to), send_bytes[size_t(to)], from,
                        static_cast<char*>(recv) + offset(recv_bytes, from), recv_bytes[size_t(from)]);
    wait_exchange();
  }
}

std::unique_ptr<Transport> Transport::split(int /*colour*/, int /*key*/) {
  fail_runtime("rank {}: the {} transport cannot split into groups", rank(), name());
}

}  // namespace ringattn
