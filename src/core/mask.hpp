// The attention mask, defined once for every layer: the CPU engine and the fp64 reference, every
// CUDA kernel (per element, per tile and for the tile order), the ring schedule, the checker and
// the CLI's pair counts ask this header which keys a query row sees. Host C++ and CUDA device
// code both include it; every function is a few integer operations.
//
// Rows and columns are indices within one call's q and k views. Every row and column has an
// absolute position: pos(q_i) = pos(q_0) + i, pos(k_j) = pos(k_0) + j, and
// q_offset = pos(q_0) - pos(k_0) (kv_len - q_len for a prefill or decode whose queries are the
// last positions; the ring schedule expresses strided shards in the same form).
//
//   full:   every key j in [0, kv_len) is visible to every row.
//   causal: key j is visible to row i when pos(k_j) <= pos(q_i), i.e. j <= i + q_offset.
//
// Every row sees one contiguous range of keys, and both ends of that range never decrease from
// one row to the next. classify_block and visible_range_of_rows rely on that; a sliding window
// (left, right) and document boundaries, the next mask kinds, are meant to drop in as fields of
// MaskSpec that keep it (a window moves `begin` up, a document boundary both ends).
#pragma once

#include <cstdint>

#include "core/hd.hpp"

namespace ringattn {

struct MaskSpec {
  bool causal = false;
  int64_t q_offset = 0;  // pos(q_0) - pos(k_0); only read when causal
};

// Keys [begin, end) of one row; empty when end <= begin.
struct KeyRange {
  int64_t begin = 0, end = 0;
  RA_HD bool empty() const { return end <= begin; }
  RA_HD int64_t size() const { return end > begin ? end - begin : 0; }
};

enum class BlockVisibility : uint8_t {
  Empty,    // no key of the block is visible to any row: skip it, never load it
  Partial,  // some are: the element mask is needed
  Full,     // every key is visible to every row: no masking cost
};

namespace mask_detail {
// One past the last key that row `row` may see under the causal rule (not clamped to the keys).
RA_HD int64_t causal_end(const MaskSpec& m, int64_t row) { return row + m.q_offset + 1; }
RA_HD int64_t clamp(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }
}  // namespace mask_detail

// The same mask over rows [0, q_len) and keys [0, kv_len) with q_offset clamped to [-q_len, kv_len].
// It selects exactly the same keys (from kv_len - 1 on, row 0 already sees every key; at -q_len and
// below, no row sees any), and it keeps every index sum such as row + q_offset + 1 far from int64
// overflow, so an offset near the int64 limits gives the right answer. Every backend applies it on
// entry (the kernels then use the sums freely), and count_visible applies it itself.
RA_HD MaskSpec clamp_offset(const MaskSpec& m, int64_t q_len, int64_t kv_len) {
  return {m.causal, mask_detail::clamp(m.q_offset, -q_len, kv_len)};
}

// The per-element predicate: is key `col` (a valid key index) visible to row `row`? (The offset
// as the kernels see it: clamp_offset'ed.)
RA_HD bool is_visible(const MaskSpec& m, int64_t row, int64_t col) {
  return !m.causal || col < mask_detail::causal_end(m, row);
}

// The keys of [0, kv_len) that row `row` sees.
RA_HD KeyRange visible_range(const MaskSpec& m, int64_t row, int64_t kv_len) {
  if (!m.causal) return {0, kv_len};
  return {0, mask_detail::clamp(mask_detail::causal_end(m, row), 0, kv_len)};
}

// The keys of [0, kv_len) that any of the rows [row0, row0 + rows) sees (rows >= 1): the union of
// their ranges, one range since both ends grow with the row.
RA_HD KeyRange visible_range_of_rows(const MaskSpec& m, int64_t row0, int64_t rows, int64_t kv_len) {
  return {visible_range(m, row0, kv_len).begin, visible_range(m, row0 + rows - 1, kv_len).end};
}

// The block of rows [row0, row0 + rows) and keys [col0, col0 + cols), under the mask alone (keys
// past kv_len are the caller's concern). Since the ranges grow with the row, the first row
// decides Full and the last row Empty.
RA_HD BlockVisibility classify_block(const MaskSpec& m, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
  if (rows <= 0 || cols <= 0) return BlockVisibility::Empty;
  if (is_visible(m, row0, col0 + cols - 1)) return BlockVisibility::Full;
  if (!is_visible(m, row0 + rows - 1, col0)) return BlockVisibility::Empty;
  return BlockVisibility::Partial;
}

// Sum over rows [row0, row0 + rows) of visible_range(m, row, kv_len).size(), in closed form. Acc
// = double for pair counts that may exceed int64 (FLOP estimates).
template <typename Acc = int64_t>
RA_HD Acc count_visible(const MaskSpec& m, int64_t row0, int64_t rows, int64_t kv_len) {
  if (rows <= 0 || kv_len <= 0) return Acc(0);
  if (!m.causal) return Acc(rows) * Acc(kv_len);
  // Row row0 + r sees clamp(a + r, 0, kv_len) keys: none below lo, a + r in [lo, hi), all from hi.
  // The offset is clamped first, so that a = row0 + q_offset + 1 cannot overflow.
  const int64_t a = mask_detail::causal_end(clamp_offset(m, row0 + rows, kv_len), row0);
  const int64_t lo = mask_detail::clamp(-a, 0, rows);
  const int64_t hi = mask_detail::clamp(kv_len - a, lo, rows);
  const int64_t n = hi - lo;
  return Acc(n) * Acc(a) + Acc(lo + hi - 1) * Acc(n) / Acc(2) + Acc(rows - hi) * Acc(kv_len);
}

// ---------------------------------------------------------------------------------------------
// Packed documents (FlashAttention's varlen, cu_seqlens): one sequence concatenated from
// documents with boundaries cu[0] = 0 < cu[1] < ... < cu[count] = sequence length, in absolute
// positions. A query sees only the keys of its own document: all of them, or (causal) those not
// after itself. Kernels never see documents: the ring schedule (src/ringattn/schedule.cpp) splits
// every call at the boundaries, so each kernel call lies inside one document and its MaskSpec
// above is exact; a tile across documents is never loaded, and a tile on a boundary is the tail
// tile of a call.

struct Documents {
  const int64_t* cu = nullptr;  // count + 1 boundaries; null when the sequence is one document
  int64_t count = 0;
  RA_HD bool none() const { return count <= 0; }
};

// The document d with cu[d] <= pos < cu[d + 1], for a position inside the sequence.
RA_HD int64_t document_of(const Documents& docs, int64_t pos) {
  int64_t lo = 0, hi = docs.count - 1;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (docs.cu[mid] <= pos) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The keys (absolute positions) that the query at absolute position `pos` sees in a
// self-attention over the packed sequence: its document's keys, cut at pos + 1 when causal.
RA_HD KeyRange document_keys(const Documents& docs, bool causal, int64_t pos) {
  const int64_t d = document_of(docs, pos);
  const int64_t end = docs.cu[d + 1];
  return {docs.cu[d], causal && pos + 1 < end ? pos + 1 : end};
}

// Visible query-key pairs of a whole self-attention over the packed sequence: each document is
// its own full or causal block.
template <typename Acc = int64_t>
RA_HD Acc count_document_pairs(const Documents& docs, bool causal) {
  Acc n = 0;
  for (int64_t d = 0; d < docs.count; ++d) {
    const int64_t len = docs.cu[d + 1] - docs.cu[d];
    n += count_visible<Acc>(MaskSpec{causal, 0}, 0, len, len);
  }
  return n;
}

}  // namespace ringattn
