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
//   causal: key j is visible to row i when pos(k_j) <= pos(q_i), i.e. j <= i + q_offset
//           (the upper edge; a window's right edge is the same edge moved, see below).
//   window: key j is hidden from row i when j < i + q_offset - window (the lower edge), for
//           window >= 0; -1: no lower edge.
//
// A call's mask is therefore a band: keys [i + q_offset - window, i + q_offset] of row i, either
// edge optional. FlashAttention's window_size (left, right) on absolute positions maps onto it
// (window_mask below): the upper edge at pos + right (the diagonal when causal), the lower at
// pos - left. The ring schedule expresses strided shards in the same form.
//
// Every row sees one contiguous range of keys, and both ends of that range never decrease from
// one row to the next. classify_block and visible_range_of_rows rely on that. Document
// boundaries are the host-side part of the mask (below): calls never cross them.
#pragma once

#include <cstdint>

#include "core/hd.hpp"

namespace ringattn {

struct MaskSpec {
  bool causal = false;   // the upper edge: key j visible only when j <= i + q_offset
  int64_t q_offset = 0;  // pos(q_0) - pos(k_0) (or the band's offset); read when causal or windowed
  int64_t window = -1;   // >= 0: the lower edge, key j visible only when j >= i + q_offset - window
  RA_HD bool windowed() const { return window >= 0; }
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
// The first key that row `row` may see under the lower edge (not clamped; windowed masks only).
RA_HD int64_t window_begin(const MaskSpec& m, int64_t row) { return row + m.q_offset - m.window; }
}  // namespace mask_detail

// The same mask over rows [0, q_len) and keys [0, kv_len) with q_offset in [-q_len, kv_len] and
// window in [-1, q_len + kv_len): it selects exactly the same keys, and it keeps every index sum
// such as row + q_offset + 1 or row + q_offset - window far from int64 overflow, so offsets and
// windows near the int64 limits give the right answer. Every backend applies it on entry (the
// kernels then use the sums freely), and count_visible applies it itself. Why each step keeps the
// keys: the lower edge of row 0 at or past kv_len hides every key (the canonical empty mask);
// an offset past kv_len moves the upper edge past every key, so the offset comes down to kv_len
// and the window shrinks by as much, which keeps the lower edge; an offset at or below -q_len
// puts the upper edge before every key (empty) or, without one, the lower edge before key 0 for
// every row; a window of q_len + kv_len or more, with the offset in range, hides nothing.
RA_HD MaskSpec clamp_offset(const MaskSpec& m, int64_t q_len, int64_t kv_len) {
  MaskSpec c = m;
  if (!m.causal && !m.windowed()) return {false, 0, -1};
  if (m.windowed() && m.q_offset >= kv_len && m.q_offset - kv_len >= m.window) return {true, -q_len, -1};
  if (m.q_offset > kv_len) {
    if (m.windowed()) c.window = m.window - (m.q_offset - kv_len);  // >= 0: the test above failed
    c.q_offset = kv_len;
  }
  if (m.q_offset < -q_len) c.q_offset = -q_len;
  if (c.windowed() && c.window >= q_len + kv_len) c.window = -1;
  return c;
}

// The per-element predicate: is key `col` (a valid key index) visible to row `row`? (The offset
// as the kernels see it: clamp_offset'ed.)
RA_HD bool is_visible(const MaskSpec& m, int64_t row, int64_t col) {
  return (!m.causal || col < mask_detail::causal_end(m, row)) && (!m.windowed() || col >= mask_detail::window_begin(m, row));
}

// The keys of [0, kv_len) that row `row` sees.
RA_HD KeyRange visible_range(const MaskSpec& m, int64_t row, int64_t kv_len) {
  const int64_t begin = m.windowed() ? mask_detail::clamp(mask_detail::window_begin(m, row), 0, kv_len) : 0;
  const int64_t end = m.causal ? mask_detail::clamp(mask_detail::causal_end(m, row), 0, kv_len) : kv_len;
  return {begin, end};
}

// The keys of [0, kv_len) from the first that any of the rows [row0, row0 + rows) sees to the last
// (rows >= 1): the union of their ranges, one range since both ends grow with the row (and a
// row's lower edge never passes the previous row's upper one).
RA_HD KeyRange visible_range_of_rows(const MaskSpec& m, int64_t row0, int64_t rows, int64_t kv_len) {
  return {visible_range(m, row0, kv_len).begin, visible_range(m, row0 + rows - 1, kv_len).end};
}

// The transpose: the rows of [0, q_len) that see key `col` (a valid key index), [begin, end),
// empty when none. Row i sees key j when i >= j - q_offset (causal) and i <= j - q_offset + window
// (windowed), so both ends grow with the key. (The backward kernels walk keys, then their rows.)
RA_HD KeyRange visible_rows(const MaskSpec& m, int64_t col, int64_t q_len) {
  const int64_t begin = m.causal ? mask_detail::clamp(col - m.q_offset, 0, q_len) : 0;
  const int64_t end = m.windowed() ? mask_detail::clamp(col - m.q_offset + m.window + 1, 0, q_len) : q_len;
  return {begin, end};
}

// The rows of [0, q_len) that see any of the keys [col0, col0 + cols) (cols >= 1): from the first
// key's first row to the last key's end (the union, one range since both ends grow with the key);
// end >= begin.
RA_HD KeyRange visible_rows_of_keys(const MaskSpec& m, int64_t col0, int64_t cols, int64_t q_len) {
  const int64_t begin = visible_rows(m, col0, q_len).begin, end = visible_rows(m, col0 + cols - 1, q_len).end;
  return {begin, end < begin ? begin : end};
}

// The block of rows [row0, row0 + rows) and keys [col0, col0 + cols), under the mask alone (keys
// past kv_len are the caller's concern). Since both ends grow with the row, two corners decide:
// the block is Full when the first row sees the last key and the last row the first key; it is
// Empty when the last row's range ends before the first key or the first row's begins after the
// last key.
RA_HD BlockVisibility classify_block(const MaskSpec& m, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
  if (rows <= 0 || cols <= 0) return BlockVisibility::Empty;
  const int64_t row1 = row0 + rows - 1, col1 = col0 + cols - 1;
  if (is_visible(m, row0, col1) && is_visible(m, row1, col0)) return BlockVisibility::Full;
  if (m.causal && col0 >= mask_detail::causal_end(m, row1)) return BlockVisibility::Empty;
  if (m.windowed() && col1 < mask_detail::window_begin(m, row0)) return BlockVisibility::Empty;
  return BlockVisibility::Partial;
}

namespace mask_detail {
// Sum over r in [0, rows) of clamp(a + r, 0, kv_len), in closed form: 0 below lo, a + r in [lo, hi),
// kv_len from hi (|a| small enough that no sum overflows).
template <typename Acc>
RA_HD Acc sum_clamped(int64_t a, int64_t rows, int64_t kv_len) {
  const int64_t lo = clamp(-a, 0, rows);
  const int64_t hi = clamp(kv_len - a, lo, rows);
  const int64_t n = hi - lo;
  return Acc(n) * Acc(a) + Acc(lo + hi - 1) * Acc(n) / Acc(2) + Acc(rows - hi) * Acc(kv_len);
}
}  // namespace mask_detail

// Sum over rows [row0, row0 + rows) of visible_range(m, row, kv_len).size(), in closed form (a
// row's range is [clamp(lower edge), clamp(upper edge)), never reversed). Acc = double for pair
// counts that may exceed int64 (FLOP estimates).
template <typename Acc = int64_t>
RA_HD Acc count_visible(const MaskSpec& m, int64_t row0, int64_t rows, int64_t kv_len) {
  if (rows <= 0 || kv_len <= 0) return Acc(0);
  // Clamped first, so that the edges of row row0 cannot overflow.
  const MaskSpec c = clamp_offset(m, row0 + rows, kv_len);
  const Acc ends = c.causal ? mask_detail::sum_clamped<Acc>(mask_detail::causal_end(c, row0), rows, kv_len)
                            : Acc(rows) * Acc(kv_len);
  const Acc begins = c.windowed() ? mask_detail::sum_clamped<Acc>(mask_detail::window_begin(c, row0), rows, kv_len) : Acc(0);
  return ends - begins;
}

// ---------------------------------------------------------------------------------------------
// Sliding windows (FlashAttention's window_size) on absolute positions: the key at position pk is
// visible to the query at pq when pq - left <= pk <= pq + right, where -1 leaves that side
// unbounded; with causal the right edge is the diagonal (right is 0 or -1, validated above this
// layer). A window of the sequence length or more on a side is the same as none.

struct Window {
  int64_t left = -1, right = -1;
  RA_HD bool none() const { return left < 0 && right < 0; }
};

namespace mask_detail {
RA_HD int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && (a < 0)); }  // b > 0
RA_HD int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }                     // b > 0
RA_HD int64_t side(int64_t w) { return w < 0 ? -1 : w; }  // -1: unbounded
// Edges further than kFar from the diagonal lie beyond every key a run can have (lengths are far
// below it: the query-key pairs must fit an int64), so an edge is held to [-kFar, kFar]: exact for
// every row and key, and the two edges' difference (MaskSpec::window) fits an int64. a + b and
// a - b held to that range, for any int64 a and b >= 0 (no overflow on the way).
constexpr int64_t kFar = int64_t(1) << 61;
RA_HD int64_t hold_far(int64_t x) { return x > kFar ? kFar : x < -kFar ? -kFar : x; }
RA_HD int64_t far_add(int64_t a, int64_t b) { return a > kFar - b ? kFar : hold_far(a + b); }
RA_HD int64_t far_sub(int64_t a, int64_t b) { return a < -kFar + b ? -kFar : hold_far(a - b); }
}  // namespace mask_detail

// The MaskSpec of queries at positions qs + stride * i against keys at ks + stride * j (one
// stride >= 1 for both: contiguous 1, striped P) under `causal` and the window `w`, with
// d = qs - ks the distance of the first query from the first key (any int64; the sides any int64
// >= 0, exact: an edge beyond every key is held at kFar, mask_detail). Key j is
// visible to row i when j <= i + floor((d + right) / stride) (right 0 when causal) and
// j >= i + ceil((d - left) / stride). `empty` is set when the edges cross, so that no row sees
// any key (strided runs between two window positions); the spec is then the canonical empty one.
RA_HD MaskSpec band_mask(bool causal, Window w, int64_t d, int64_t stride, bool* empty = nullptr) {
  const int64_t left = mask_detail::side(w.left), right = causal ? 0 : mask_detail::side(w.right);
  MaskSpec m;
  if (empty) *empty = false;
  if (right >= 0) {
    m.causal = true;
    m.q_offset = mask_detail::floor_div(mask_detail::far_add(d, right), stride);
  }
  if (left >= 0) {
    const int64_t lower = mask_detail::ceil_div(mask_detail::far_sub(d, left), stride);  // the first key offset
    if (!m.causal) {
      m.q_offset = lower;
      m.window = 0;
    } else if (lower > m.q_offset) {
      if (empty) *empty = true;
      return {true, -int64_t(1) << 62, -1};
    } else {
      m.window = m.q_offset - lower;
    }
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// Packed documents (FlashAttention's varlen, cu_seqlens): one sequence concatenated from
// documents with boundaries cu[0] = 0 < cu[1] < ... < cu[count] = sequence length, in absolute
// positions. A query sees only the keys of its own document: all of them, or (causal) those not
// after itself. Kernels never see documents: the ring schedule (runner/ring/schedule.cpp) splits
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
// self-attention over the packed sequence: its document's keys, cut at pos + 1 when causal and to
// [pos - left, pos + right] by a window. Without documents (docs.none()) the document is the
// whole sequence [0, seq_len).
RA_HD KeyRange document_keys(const Documents& docs, bool causal, int64_t pos, Window w = {}, int64_t seq_len = 0) {
  int64_t begin = 0, end = seq_len;
  if (!docs.none()) {
    const int64_t d = document_of(docs, pos);
    begin = docs.cu[d];
    end = docs.cu[d + 1];
  }
  const int64_t left = mask_detail::side(w.left), right = causal ? 0 : mask_detail::side(w.right);
  if (right >= 0 && right < end - pos - 1) end = pos + right + 1;  // compared as distances: no overflow
  if (left >= 0 && left < pos - begin) begin = pos - left;
  return {begin, end};
}

// Visible query-key pairs of a whole self-attention over the packed sequence: each document is
// its own full, causal or banded block.
template <typename Acc = int64_t>
RA_HD Acc count_document_pairs(const Documents& docs, bool causal, Window w = {}) {
  Acc n = 0;
  for (int64_t d = 0; d < docs.count; ++d) {
    const int64_t len = docs.cu[d + 1] - docs.cu[d];
    n += count_visible<Acc>(band_mask(causal, w, 0, 1), 0, len, len);
  }
  return n;
}

}  // namespace ringattn
