// The row bookkeeping of one ring run: the fp32 (o, lse) state of this rank's query rows and
// which rows the hops have reached. The state is not emptied up front: the first call on a run of
// query rows writes it (StateMode::Write), later calls fold. The last call on each run of query
// rows (the schedule's query segments) also writes the final output itself (FlashParams::out),
// cast once. finish() empties the rows that no call reached and finalizes every row not yet cast.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.hpp"
#include "runner/ring/schedule.hpp"

namespace ringattn {

class RowState {
 public:
  // Allocates the state for `out`'s rows in `b` (the lse in `lse` when given, e.g. the caller's
  // LocalTensors::lse; else owned).
  RowState(Backend& b, const RingSchedule& sched, const TensorView& out, float* lse);

  const StateView& state() const { return state_; }

  // How call `index` of hop `hop` treats its query rows: whether it writes them (first touch) or
  // folds into them, and whether it is the last call on them, which then writes the output.
  struct Call {
    StateMode mode = StateMode::Fold;
    bool writes_output = false;
  };
  Call begin_call(int hop, size_t index, const PairCall& c);

  // Rows no call reached: the empty state, cast into the output (none in self-attention); then
  // waits for the backend.
  void finish();

 private:
  // Empties the unwritten rows of [r0, r0 + n) (n < 0: to the end), in maximal runs.
  void empty_unwritten(int64_t r0, int64_t n);

  Backend& b_;
  TensorView out_;
  DeviceBuffer o_, lse_owned_;
  StateView state_;
  std::vector<std::vector<char>> final_call_;  // [hop][call]: the last call on its query rows
  std::vector<char> written_, finalized_;      // per local row
};

}  // namespace ringattn
