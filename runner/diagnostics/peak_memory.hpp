// Peak memory of this process, for the reports of `ringattn run` and `ringattn bench`.
#pragma once

#include <cstdint>

namespace ringattn {

// The peak resident set size of this process so far (getrusage ru_maxrss), in bytes.
uint64_t peak_rss_bytes();

}  // namespace ringattn
