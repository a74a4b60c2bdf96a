// Deterministic random inputs: every element is a function of (seed, tensor, batch, head, global
// token position, dim), so each rank can generate exactly its own shard and any rank can rebuild
// any row of the global problem for a check.
#pragma once

#include <cstdint>

#include "core/types.hpp"

namespace ringattn {

// DO: the output gradient dO of `run --backward` (shape of q).
enum class InputTensor : uint32_t { Q = 1, K = 2, V = 3, DO = 4 };

// Standard normal value for one element (counter-based: splitmix64 hashing + Box-Muller).
float input_value(uint64_t seed, InputTensor which, int64_t b, int64_t h, int64_t global_t, int64_t d);

// Fills host view `x` (fp32/fp16/bf16) where local row i holds global token first + i * stride.
void fill_input(const TensorView& x, uint64_t seed, InputTensor which, int64_t first, int64_t stride);

}  // namespace ringattn
