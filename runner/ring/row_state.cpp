#include "runner/ring/row_state.hpp"

#include <algorithm>

namespace ringattn {
namespace {

// For every call of every hop: whether it is the last call on its query rows (a later call
// starting at the same row reaches the same run of rows: the schedule's query segments).
std::vector<std::vector<char>> final_calls(const RingSchedule& sched) {
  std::vector<std::vector<char>> last(sched.hops().size());
  std::vector<int64_t> seen;
  for (size_t s = sched.hops().size(); s-- > 0;) {
    const auto& calls = sched.hops()[s].calls;
    last[s].assign(calls.size(), 0);
    for (size_t i = calls.size(); i-- > 0;) {
      const int64_t r0 = calls[i].q_row0;
      if (std::find(seen.begin(), seen.end(), r0) == seen.end()) {
        last[s][i] = 1;
        seen.push_back(r0);
      }
    }
  }
  return last;
}

// Calls `f(i, n)` for every maximal run [i, i + n) of rows in [r0, end) whose flag is 0.
template <typename F>
void for_each_unset_run(const std::vector<char>& flags, int64_t r0, int64_t end, F&& f) {
  for (int64_t i = r0; i < end;) {
    if (flags[size_t(i)]) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j < end && !flags[size_t(j)]) ++j;
    f(i, j - i);
    i = j;
  }
}

}  // namespace

RowState::RowState(Backend& b, const RingSchedule& sched, const TensorView& out, float* lse)
    : b_(b), out_(out), final_call_(final_calls(sched)) {
  const int64_t B = out.batch, H = out.heads, T = out.len, D = out.dim;
  o_ = DeviceBuffer(b, size_t(B * H * T * D) * sizeof(float));
  if (lse == nullptr) {
    lse_owned_ = DeviceBuffer(b, size_t(B * H * T) * sizeof(float));
    lse = lse_owned_.as<float>();
  }
  state_ = contiguous_state(o_.as<float>(), lse, B, H, T, D);
  written_.assign(size_t(T), 0);
  finalized_.assign(size_t(T), 0);
}

RowState::Call RowState::begin_call(int hop, size_t index, const PairCall& c) {
  Call call;
  // Rows all unwritten: the call writes them. Rows partly written are first emptied where
  // unwritten, so the call folds.
  const auto first = written_.begin() + c.q_row0, last = first + c.q_rows;
  const bool none = std::none_of(first, last, [](char w) { return w != 0; });
  if (!none) empty_unwritten(c.q_row0, c.q_rows);
  std::fill(first, last, char(1));
  call.mode = none ? StateMode::Write : StateMode::Fold;
  if (final_call_[size_t(hop)][index]) {
    call.writes_output = true;
    std::fill(finalized_.begin() + c.q_row0, finalized_.begin() + c.q_row0 + c.q_rows, char(1));
  }
  return call;
}

void RowState::empty_unwritten(int64_t r0, int64_t n) {
  const int64_t end = n < 0 ? int64_t(written_.size()) : r0 + n;
  for_each_unset_run(written_, r0, end, [&](int64_t i, int64_t len) {
    std::fill(written_.begin() + i, written_.begin() + i + len, char(1));
    b_.fill_empty(state_.rows(i, len));
  });
}

void RowState::finish() {
  empty_unwritten(0, -1);
  for_each_unset_run(finalized_, 0, int64_t(finalized_.size()), [&](int64_t i, int64_t len) {
    b_.finalize(FinalizeParams{state_.rows(i, len), out_.rows(i, len)});
  });
  b_.synchronize();
}

}  // namespace ringattn
