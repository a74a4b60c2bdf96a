// The Hopper flash forward's tile order, for host and device code alike: which (batch, head,
// query block) the t-th tile of a launch is, which key blocks it visits, and the size of the
// sections that the causal and windowed orders go through. The kernel (hopper_config.cuh and
// below), the plan (hopper_plan.cpp) and the tests (tests/gpu/hopper) read the same functions.
#pragma once

#include <cstdint>

#include "core/hd.hpp"
#include "core/mask.hpp"
#include "kernels/cuda/hopper/fwd_hopper_params.hpp"

namespace ringattn::cuda::hopper {

// The work of one CTA iteration: a block_m-row query tile of one (batch, head). Its key blocks
// are n_begin .. n_begin + n_blocks - 1, the blocks that hold a key some row of the tile sees;
// step i (0 .. n_blocks - 1) of the producer's and the consumers' loops takes block(i), from the
// last block down to the first. Both sides walk exactly n_blocks steps per tile.
struct Tile {
  int b, h;
  // The tile's first row: block_m x its query block - HopperParams::m_shift, below 0 for the first
  // block of a shifted order (query_shift). Rows outside [0, q_len) run on zero-filled Q and are
  // never stored.
  int m0;
  int n_begin;     // the first key block (0 without a window)
  int n_blocks;    // how many key blocks, from n_begin up; 0: the tile sees no key
  int full_begin;  // keys [full_begin, full_end) are visible to every row of the tile (and inside
  int full_end;    // kv_len); full_begin is 0 without a window
  RA_HD int block(int i) const { return n_begin + n_blocks - 1 - i; }
};

// The (batch, head) slots of one section of the causal and windowed orders (decode_tile): whole
// KV heads whose K and V together take at most half the L2, so that the CTAs working on one
// section at a time, which read the same heads' key blocks, find them in L2; only when all K and
// V together are more than the L2. Sections are made equal (a few heads more each rather than a
// small last one). `keys`: the keys a head's tiles
// read (kv_len; with a window, the band of one query block). Every slot in one section when all
// fit. With one section for the whole launch, batch 4 x 4k causal at head dim 64 (128 KV heads of
// 1 MB) read 1.5 GB from DRAM for 270 MB of inputs (L2 hit rate 33%, hopper/PERF.md).
inline int section_heads(int batch_heads, int group, int64_t keys, int head_dim, int elem_bytes, int64_t l2_bytes) {
  const int64_t kv_head_bytes = keys * head_dim * 2 * elem_bytes;  // K and V of one KV head
  // All of K and V within the L2: one section (sections measured 3% slower at 8k causal, d128,
  // 32 MB of K/V: the L2 already held them, 95% hits).
  if (batch_heads / group * kv_head_bytes <= l2_bytes) return batch_heads;
  const int64_t budget = l2_bytes / 2;
  const int64_t kv_fit = kv_head_bytes > 0 && budget / kv_head_bytes > 1 ? budget / kv_head_bytes : 1;
  const int64_t most = kv_fit * group;
  if (most >= batch_heads) return batch_heads;
  const int64_t sections = (batch_heads + most - 1) / most;
  const int64_t even = (batch_heads + sections - 1) / sections;
  const int64_t heads = (even + group - 1) / group * group;  // whole KV heads (q_heads is a multiple of group)
  return int(heads < batch_heads ? heads : batch_heads);
}

// Rows that the first query block starts before row 0 (HopperParams::m_shift). A causal row sees
// more keys the later it is, so when q_len is not a multiple of block_m the short query block goes
// first, where its rows see the fewest keys, instead of last, where the consumers of its missing
// rows would run the longest tile of the head on nothing: at batch 4 x 4k causal, head dim 64
// (192-row tiles, 4096 = 21 x 192 + 64), the last tile's 32 key blocks for 64 rows were 5.8% of
// the head's key blocks (measured +5.5%, hopper/PERF.md). The shift is a multiple of
// gcd(block_m, block_n), so the tiles' diagonals fall at the same offsets within key blocks as
// without it (a shift of 16 rows on 128 x 128 tiles would put every diagonal across two key
// blocks, both masked); the rest, under that gcd, stays past the last row. Other masks take no
// shift: full rows cost the same in every block, and a lower edge alone makes the first rows the
// longest.
RA_HD constexpr int gcd_of(int a, int b) { return b == 0 ? a : gcd_of(b, a % b); }
inline int query_shift(const MaskSpec& mask, int q_len, int block_m, int block_n) {
  if (!mask.causal || block_m <= 0 || block_n <= 0) return 0;
  const int g = gcd_of(block_m, block_n), short_rows = (block_m - q_len % block_m) % block_m;
  return short_rows / g * g;
}

// Causal tiles are ordered longest first (the last query block of every head of a section, then
// the one before...), so that the CTAs take the heavy tiles first and the short ones fill the
// tail (with a window as well, where the tiles are about equal and the order no longer matters).
// A window without the causal edge: the first query block of every head of a section, then the
// second... Those two orders go section by section (p.section_heads slots each, section_heads
// above): the CTAs running at one time share the K and V of a section's heads in L2. Full tiles
// go head by head, so concurrent CTAs share K/V in L2 without sections.
RA_HD Tile decode_tile(const HopperParams& p, int t) {
  Tile tile;
  const int bh_count = p.batch * p.q_heads;
  int bh, mb;
  if (p.mask.causal || p.mask.windowed()) {
    const int per_section = p.section_heads * p.m_blocks;
    const int section = t / per_section, first = section * p.section_heads;
    const int heads = p.section_heads < bh_count - first ? p.section_heads : bh_count - first;
    const int u = t - section * per_section;
    bh = first + u % heads;
    // causal: the last query blocks are the longest; only a lower edge: the first ones
    mb = p.mask.causal ? p.m_blocks - 1 - u / heads : u / heads;
  } else {
    bh = t / p.m_blocks;
    mb = t % p.m_blocks;
  }
  tile.b = bh / p.q_heads;
  tile.h = bh % p.q_heads;
  tile.m0 = mb * p.block_m - p.m_shift;
  const int first = tile.m0 > 0 ? tile.m0 : 0;  // the tile's rows within [0, q_len)
  const int rows = (tile.m0 + p.block_m < p.q_len ? tile.m0 + p.block_m : p.q_len) - first;
  const KeyRange keys = visible_range_of_rows(p.mask, first, rows, p.kv_len);  // within [0, kv_len]
  if (keys.empty()) {
    tile.n_begin = tile.n_blocks = 0;
  } else {
    tile.n_begin = int(keys.begin / p.block_n);
    tile.n_blocks = int((keys.end + p.block_n - 1) / p.block_n) - tile.n_begin;
  }
  // Both ends of the visible ranges grow with the row, so every row of the tile sees the keys
  // from the last row's begin to the first row's end (rows before 0 see less and are not stored:
  // a block left unmasked for them gives them finite scores of real keys).
  tile.full_begin = int(visible_range(p.mask, first + rows - 1, p.kv_len).begin);
  tile.full_end = int(visible_range(p.mask, first, p.kv_len).end);
  return tile;
}

// True when a cluster of `cluster` CTAs (1 or 2) may run tiles 2i and 2i + 1 of decode_tile's
// order side by side (Config::kCluster): both must read one KV head and visit the same key blocks.
// Full masks go head by head, so the pair is two query blocks of one head: the head needs an even
// number of them. The causal and windowed orders go query block by query block over a section's
// (batch, head) slots, which are whole KV heads: the pair is one query block of q heads 2j and
// 2j + 1, which share a KV head when the group (q heads per KV head) is even. A test walks every
// pair of many orders.
inline bool tiles_pair(const MaskSpec& mask, int group, int m_blocks, int cluster) {
  if (cluster == 1) return true;
  if (mask.causal || mask.windowed()) return group % cluster == 0;
  return m_blocks % cluster == 0;
}

}  // namespace ringattn::cuda::hopper
