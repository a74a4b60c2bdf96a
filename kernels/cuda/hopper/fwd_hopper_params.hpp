// The Hopper flash kernel's launch description, visible to host code compiled by either
// compiler: the dispatch (kernels/cuda/flash_dispatch.cpp) builds it once per call, tensor maps
// included, and fwd_hopper.cu launches it.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; the encoder is fetched at run time)

#include <cstdint>

#include "kernels/params.hpp"

namespace ringattn::cuda {

// The kernel's tile configurations: query rows x keys per tile (64 query rows per consumer
// warpgroup), q2 = two Q buffers (the streamed consumer loop), c2 = clusters of two CTAs that
// share each K and V stage by multicast (where tiles pair up: hopper_plan.cpp, TileInfo::takes);
// 128x80 is head dim 256's only one. hopper/PERF.md measures them.
enum class HopperTile : uint8_t { M128N128, M128N176, M192N128, M128N128Q2, M128N80, M128N176C2, M128N128C2 };

namespace hopper {

struct HopperParams {
  CUtensorMap tm_q, tm_k, tm_v;  // 4-d maps over (dim, len, heads, batch), boxes of 64 x block rows
  StateView state;
  void* out;  // when set: the final output in the input dtype (then state.o is not written)
  long long out_stride_b, out_stride_h, out_stride_t;
  int batch, q_heads, kv_heads, group;  // group = q_heads / kv_heads
  int q_len, kv_len;
  MaskSpec mask;
  float scale;       // natural-log units, for the LSE
  float scale_log2;  // scale * log2(e): scores go through exp2
  int fold;
  int lazy_rescale;  // softmax_step(lazy): move the running max only when it grew past kLazyThreshold (hopper_config.cuh)
  int block_m, block_n;  // the Config's tile shape
  int m_blocks, num_tiles;
  int m_shift;  // query block mb starts at row mb * block_m - m_shift (hopper_tiles.hpp, query_shift)
  int section_heads;  // (batch, head) slots per section of the causal and windowed tile orders (hopper_tiles.hpp)
  // The dynamic tile schedule (hopper_config.cuh, TileFeed): [0] counts the tiles handed out after
  // the first gridDim.x, [1] the CTAs whose producer has finished; both 0 at launch (the last CTA
  // resets them), one pair per stream (fwd_hopper.cu).
  int* tile_counter;
  // The staged output's two fields stay last: inserted after `out`, they moved the other fields'
  // offsets, and ptxas then serialized the 128x176 kernel's wgmmas (C7511, registers short).
  // staged_out = 1: the output leaves through shared memory and bulk tensor stores (store_output_staged): out
  // set, no fold, a configuration with room for it (Config::kStagedOut) and a view that tm_out
  // could encode; else the epilogue stores from registers (store_state).
  int staged_out;
  CUtensorMap tm_out;  // the output's, boxes of 64 x 64 rows (read when staged_out)
  // The slow rows (fwd_hopper_redo.cuh): rows whose result is not finite while their row sum is (a
  // non-finite value in V, at a key they see or at one their tile masks), listed by the consumers
  // and recomputed exactly by the kernel launched after this one from q, k and v as plain views.
  // redo: [0] entries listed, [1] CTAs of the redo kernel done (both 0 at launch: the redo kernel's
  // last CTA resets them), then redo_capacity entries of 4 ints (b, h, the warp's first row, its
  // 16 rows as a bit mask); one list per stream (fwd_hopper.cu). Last, for the same reason as
  // the staged output's fields.
  TensorView q, k, v;
  int* redo;
  int redo_capacity;
};

}  // namespace hopper

// One call of the Hopper kernel, ready to launch: the tile configuration and its params.
struct HopperLaunch {
  HopperTile tile = HopperTile::M128N128;
  int head_dim = 0;
  DType dtype = DType::BF16;
  hopper::HopperParams params{};
};

}  // namespace ringattn::cuda
