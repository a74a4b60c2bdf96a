// `run --backward` and `bench --backward`: the forward, then Backend::flash_backward on one
// device (the ring backward is issue 19).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "cli/problem.hpp"
#include "cli/world.hpp"

namespace ringattn::cli {

// FlashAttention's convention: the backward does 2.5x the forward's FLOPs (five matrix products
// of the forward's size instead of two).
inline constexpr double kBackwardFlopFactor = 2.5;

// Refuses --backward on a world of several ranks, with the same message on every rank.
void require_world_of_one(int world);

// dO and the fp32 gradients of one problem in backend memory, and the BackwardParams over them
// and over `local`'s q, k, v, out and lse (the forward's, which must have run before the call).
struct BackwardBuffers {
  DeviceBuffer dout, dq, dk, dv;
  BackwardParams params;
};

// What fills dO and how the backward runs.
struct BackwardSetup {
  uint64_t seed = 1;        // dO drawn like the inputs (InputTensor::DO) unless do_file is given
  std::string do_file;      // .npy in the shape of q
  bool deterministic = false;
  int tile_q = 0, tile_k = 0;
};

// Allocates dO (read or drawn) and the gradients, poisoned with NaN so that anything the backward
// does not write shows up. Throws InvalidArgument naming --do and the shape for a bad file.
BackwardBuffers make_backward(const GlobalProblem& p, const LocalProblem& local, Backend& b, const BackwardSetup& s);

// The gradients copied to the host (fp32, contiguous like the buffers).
struct HostGrads {
  std::vector<float> dq, dk, dv;
};
HostGrads copy_grads(const BackwardBuffers& g, Backend& b);
int64_t count_nonfinite(const HostGrads& g);

// The median over `iters` timed calls of flash_backward (after `warmup` untimed ones), in seconds.
double time_backward(const BackwardBuffers& g, Backend& b, int warmup, int iters);

// `ringattn run --backward` on a world of one.
int backward_on(const RunOptions& o, World& w);

}  // namespace ringattn::cli
