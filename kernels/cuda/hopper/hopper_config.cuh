// Tile shapes, shared-memory plan, kernel params and the tile schedule of the Hopper flash kernel.
// Shared by the producer and consumer code, which must agree on every one of these.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; the encoder is fetched at run time)
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/params.hpp"

namespace ringattn::cuda::hopper {

// One CTA: warpgroup 0 produces (one thread issues the bulk copies), warpgroups 1 and 2 consume,
// each owning 64 of the tile's 128 query rows. Keys stream in tiles of 128 through a 2-stage ring.
template <int D>
struct Config {
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerWarps = 8;
  // A 128-byte swizzled box holds 64 16-bit values per row, so rows of D values are stored as
  // D/64 column blocks of [rows][64], each block contiguous (the layout wgmma reads K-major).
  static constexpr int kColBlocks = D / 64;
  static constexpr int kQBytes = kColBlocks * kBlockM * 128;
  static constexpr int kKVBytes = kColBlocks * kBlockN * 128;  // one K or V stage
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKVBytes;
  static constexpr int kOffBar = kOffV + kStages * kKVBytes;
  // Barriers: full_k[2], full_v[2], empty_k[2], empty_v[2], q_full, q_empty.
  static constexpr int kNumBars = 4 * kStages + 2;
  // +1024: the dynamic buffer is realigned to 1024 bytes, where the 128-byte swizzle repeats.
  static constexpr int kSmemBytes = kOffBar + kNumBars * 8 + 1024;
  // Register budget after setmaxnreg: 128 * 40 + 256 * 232 <= 65536.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
};

struct HopperParams {
  CUtensorMap tm_q, tm_k, tm_v;  // 4-d maps over (dim, len, heads, batch), boxes of 64 x 128
  StateView state;
  int batch, q_heads, kv_heads, group;  // group = q_heads / kv_heads
  int q_len, kv_len;
  long long q_offset;
  float scale;       // natural-log units, for the LSE
  float scale_log2;  // scale * log2(e): scores go through exp2
  int causal, fold;
  int m_blocks, num_tiles;
};

// The work of one CTA iteration: a 128-row query tile of one (batch, head).
struct Tile {
  int b, h, m0;
  int n_blocks;  // key tiles with at least one visible key, processed from last to first
};

// Causal tiles are ordered longest first (the last query block of every head, then the one
// before...), so that the static round-robin over CTAs hands out the heavy tiles first and the
// short ones fill the tail. Full tiles go head by head, so concurrent CTAs share K/V in L2.
__host__ __device__ inline Tile decode_tile(const HopperParams& p, int t) {
  Tile tile;
  const int bh_count = p.batch * p.q_heads;
  int bh, mb;
  if (p.causal) {
    mb = p.m_blocks - 1 - t / bh_count;
    bh = t % bh_count;
  } else {
    bh = t / p.m_blocks;
    mb = t % p.m_blocks;
  }
  tile.b = bh / p.q_heads;
  tile.h = bh % p.q_heads;
  tile.m0 = mb * 128;
  long long n_end = p.kv_len;
  if (p.causal) {
    const long long last_row = (tile.m0 + 128 < p.q_len ? tile.m0 + 128 : p.q_len) - 1;
    const long long e = last_row + p.q_offset + 1;  // one past the last key any row sees
    n_end = e < n_end ? e : n_end;
  }
  tile.n_blocks = n_end <= 0 ? 0 : int((n_end + 127) / 128);
  return tile;
}

// True when key block nb needs the element mask: it reaches past kv_len, or (causal) past the
// last key that the tile's first row may see. Every other block is fully visible.
__device__ __forceinline__ bool block_needs_mask(const HopperParams& p, const Tile& t, int nb) {
  const long long end = (long long)(nb + 1) * 128;
  if (end > p.kv_len) return true;
  return p.causal && end - 1 > (long long)t.m0 + p.q_offset;
}

}  // namespace ringattn::cuda::hopper
