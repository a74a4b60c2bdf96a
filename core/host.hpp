// Who this process is: the machine's host name and, once a transport or the logging setup knows
// it, the rank. Error messages that cross ranks start with "rank R on HOST: " (core/check.hpp).
#pragma once

#include <string>

namespace ringattn {

// This machine's host name (short form, without the domain); "unknown-host" when it has none.
std::string host_name();

namespace core {

// Records this process's rank for messages (-1: unknown); called by init_logging and by the
// MPI and NCCL transports when they learn their rank. Thread-safe; the last call wins.
void set_identity(int rank);

// The rank set by set_identity, or -1 before any call.
int identity_rank();

// "rank R on HOST: " when the rank is known, else "HOST: ".
std::string identity_prefix();

}  // namespace core
}  // namespace ringattn
