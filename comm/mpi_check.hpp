// Every MPI call is checked: a failure throws RuntimeError naming the call, file, line and rank.
// The communicator must have MPI_ERRORS_RETURN set, or MPI aborts before the check can speak.
#pragma once

#include <mpi.h>

#include <string>

#include "ringattn/error.hpp"

namespace ringattn {

inline void mpi_check(int rc, const char* call, const char* file, int line, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  // The call's name only (the text up to its argument list), not every argument.
  const std::string text_of_call(call);
  const std::string name = text_of_call.substr(0, text_of_call.find('('));
  fail_runtime("{} failed at {}:{} on rank {}: {} (MPI error {})", name, file, line, rank, std::string(text, size_t(len)),
               rc);
}

}  // namespace ringattn

// `rank` must name the caller's rank in scope (-1 before it is known).
#define RINGATTN_MPI_CHECK(call, rank) ::ringattn::mpi_check((call), #call, __FILE__, __LINE__, (rank))
