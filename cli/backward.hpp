// `run --backward` and `bench --backward`: the forward ring (run_attention), then the ring
// backward (run_attention_backward) on every rank of the world, a world of one included.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "cli/problem.hpp"
#include "cli/world.hpp"

namespace ringattn::cli {

// FlashAttention's convention: the backward does 2.5x the forward's FLOPs (five matrix products
// of the forward's size instead of two).
inline constexpr double kBackwardFlopFactor = 2.5;

// dO and the fp32 gradients of this rank's shard in backend memory, and the BackwardParams over
// them and over `local`'s q, k, v, out and lse (the forward's, which must have run before use).
struct BackwardBuffers {
  DeviceBuffer dout, dq, dk, dv;
  BackwardParams params;
};

// What fills dO and how the backward runs.
struct BackwardSetup {
  uint64_t seed = 1;        // dO drawn like the inputs (InputTensor::DO) unless do_file is given
  std::string do_file;      // .npy in the shape of the global q, in `layout` ([batch, heads, q_len, dim] in bhsd)
  bool deterministic = false;
  int tile_q = 0, tile_k = 0;
  FileLayout layout = FileLayout::Bhsd;  // of --do (and --dq/--dk/--dv): the inputs' (ProblemSetup::layout)
};

// Where any global row of dO comes from: the seed (InputTensor::DO) or the --do file (read as the
// source's InputTensor::Q). Throws InvalidArgument naming --do for a file not in the shape of q
// (in the layout of s.layout).
struct DoutSource {
  std::unique_ptr<InputSource> src;
  InputTensor which = InputTensor::DO;
};
DoutSource dout_source(const GlobalProblem& p, const BackwardSetup& s);

// What `run --backward` refuses beyond the forward's checks, on every rank alike: a decode
// problem over several ranks, and a --do file that is missing or not in the shape of q. Throws
// InvalidArgument. Part of prepare_run (run.hpp), so the dry run refuses it too.
void check_backward_setup(const RunOptions& o, const ProblemSetup& setup, int world);

// Allocates this rank's dO (its rows of the global dO, drawn or read, by `local.q_layout`) and
// the gradients, poisoned with NaN so that anything the backward does not write shows up.
BackwardBuffers make_backward(const GlobalProblem& p, const LocalProblem& local, Backend& b, const BackwardSetup& s);

// --check-finite's verdict on this rank's inputs before any compute, as the run gives it: q, k, v
// and, with --backward, dO ("" when every element is finite, else the run's message). Loads the
// rank's shard; the dry run's check (dry_run.cpp).
std::string check_finite_before_run(const RunOptions& o, const ProblemSetup& setup, World& w);

// One backward on every rank, synchronized: the ring backward over w.transport and
// grad_transport(w) for self-attention, the hybrid backward over local.cp with --cp groups,
// Backend::flash_backward for a decode problem (a world of one only; its stats are empty).
// Collective. An InvalidArgument of the runtime becomes a CollectiveError.
RankStats run_backward(const GlobalProblem& p, const LocalProblem& local, const BackwardBuffers& g, World& w,
                       const ringattn::RunOptions& ro);

// The gradients copied to the host (fp32, contiguous like the buffers).
struct HostGrads {
  std::vector<float> dq, dk, dv;
};
HostGrads copy_grads(const BackwardBuffers& g, Backend& b);
int64_t count_nonfinite(const HostGrads& g);

// `ringattn run --backward` on any world.
int backward_on(const CommandLine& cl, World& w);

}  // namespace ringattn::cli
