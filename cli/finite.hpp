// --check-finite: the first NaN or Inf of a rank's inputs (q, k, v and, with --backward, dO) (before the run, so bad input never
// reaches a kernel) or outputs (after it), named by rank, tensor and global index.
#pragma once

#include <string>

#include "cli/check.hpp"
#include "cli/problem.hpp"

namespace ringattn::cli {

// "" when q, k and v of this rank are finite; else one message naming the rank, the tensor, the
// value and its [batch, head, token, dim] index (token: the global position). An infinity that a
// finite source value became in a half dtype is reported as that value overflowing the dtype
// (`src` rebuilds the element in fp32).
std::string check_inputs_finite(const GlobalProblem& p, const LocalProblem& l, Backend& b, int rank,
                                InputSource& src);

// The same for this rank's rows of dO (the backward's upstream gradient, in `dout`), drawn from
// `src`'s `which` (the seed's InputTensor::DO or the --do file's rows).
std::string check_dout_finite(const GlobalProblem& p, const LocalProblem& l, const DeviceBuffer& dout, Backend& b,
                              int rank, InputSource& src, InputTensor which);

// The same for this rank's out and lse (copied to the host by copy_result).
std::string check_outputs_finite(const GlobalProblem& p, const LocalProblem& l, const HostResult& r, int rank);

}  // namespace ringattn::cli
