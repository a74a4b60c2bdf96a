// The one check-macro family for library calls: CUDA, NCCL and MPI. A failed call throws
// RuntimeError "rank R on HOST: <call> failed at <file>:<line>: <text> (<library> error <code>)".
// This header includes none of cuda_runtime.h, nccl.h or mpi.h and uses no fmt, so nvcc parses
// it: each macro is expanded only where its library's header is already included.
#pragma once

namespace ringattn::core {

// Throws RuntimeError naming the call (its text up to the argument list), the file, the line,
// the rank and host (core/host.hpp), the library's text for the error and its code: `code_name`
// when non-null, else the number `code`.
[[noreturn]] void throw_call_failed(const char* library, const char* call, const char* file, int line,
                                    const char* text, long long code, const char* code_name = nullptr);

}  // namespace ringattn::core

// CUDA runtime calls. Clears a sticky launch error so that the next, unrelated call does not
// report it again.
#define RA_CHECK_CUDA(call)                                                                          \
  do {                                                                                               \
    const cudaError_t ra_err_ = (call);                                                              \
    if (ra_err_ != cudaSuccess) {                                                                    \
      (void)cudaGetLastError();                                                                      \
      ::ringattn::core::throw_call_failed("CUDA", #call, __FILE__, __LINE__, cudaGetErrorString(ra_err_), \
                                          (long long)ra_err_, cudaGetErrorName(ra_err_));            \
    }                                                                                                \
  } while (0)

// After a <<<...>>> launch: a bad configuration shows up in cudaGetLastError; `what` (a string
// literal) names the kernel in the message.
#define RA_CHECK_CUDA_LAUNCH(what)                                                                   \
  do {                                                                                               \
    const cudaError_t ra_err_ = cudaGetLastError();                                                  \
    if (ra_err_ != cudaSuccess)                                                                      \
      ::ringattn::core::throw_call_failed("CUDA", "launch of " what, __FILE__, __LINE__,             \
                                          cudaGetErrorString(ra_err_), (long long)ra_err_,           \
                                          cudaGetErrorName(ra_err_));                                \
  } while (0)

// NCCL calls; ncclInProgress (non-blocking communicators) is not a failure.
#define RA_CHECK_NCCL(call)                                                                          \
  do {                                                                                               \
    const ncclResult_t ra_res_ = (call);                                                             \
    if (ra_res_ != ncclSuccess && ra_res_ != ncclInProgress)                                         \
      ::ringattn::core::throw_call_failed("NCCL", #call, __FILE__, __LINE__, ncclGetErrorString(ra_res_), \
                                          (long long)ra_res_);                                       \
  } while (0)

// MPI calls. The communicator must have MPI_ERRORS_RETURN set, or MPI aborts before the check
// can speak.
#define RA_CHECK_MPI(call)                                                                           \
  do {                                                                                               \
    const int ra_rc_ = (call);                                                                       \
    if (ra_rc_ != MPI_SUCCESS) {                                                                     \
      char ra_text_[MPI_MAX_ERROR_STRING] = {};                                                      \
      int ra_len_ = 0;                                                                               \
      if (MPI_Error_string(ra_rc_, ra_text_, &ra_len_) != MPI_SUCCESS) ra_text_[0] = 0;              \
      ::ringattn::core::throw_call_failed("MPI", #call, __FILE__, __LINE__, ra_text_, ra_rc_);       \
    }                                                                                                \
  } while (0)
