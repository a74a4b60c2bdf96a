// The mask primitive (core/mask.hpp) against a brute-force definition on absolute positions,
// exhaustively over small specs: full and causal, with and without a window (lower edge), offsets
// negative, zero, positive and beyond both lengths, empty and partial blocks anywhere; the
// offset clamp at the int64 limits; band_mask (FlashAttention's window on strided positions)
// and documents with windows against positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/mask.hpp"

namespace ringattn {
namespace {

// The definition: row i sits at position q_offset + i, key j at position j; causal shows key j
// to row i when pos(k_j) <= pos(q_i), a window (>= 0) when pos(k_j) >= pos(q_i) - window. In
// 128-bit arithmetic, so that offsets and windows at the int64 limits are exact.
bool brute_visible(const MaskSpec& m, int64_t i, int64_t j) {
  const __int128 pos_q = __int128(m.q_offset) + i;
  return (!m.causal || j <= pos_q) && (m.window < 0 || j >= pos_q - m.window);
}

constexpr int64_t kMaxLen = 9, kMaxOffset = 14;

template <typename F>
void for_each_spec(F f) {
  for (bool causal : {false, true})
    for (int64_t window : {-1, 0, 1, 2, 3, 5, 12})
      for (int64_t off = -kMaxOffset; off <= kMaxOffset; ++off) f(MaskSpec{causal, off, window});
}

std::string name(const MaskSpec& m) {
  return std::string(m.causal ? "causal" : "full") + " q_offset=" + std::to_string(m.q_offset) +
         " window=" + std::to_string(m.window);
}

TEST(Mask, ElementPredicateMatchesPositions) {
  for_each_spec([](const MaskSpec& m) {
    for (int64_t i = 0; i < kMaxLen; ++i)
      for (int64_t j = 0; j < kMaxLen; ++j) ASSERT_EQ(is_visible(m, i, j), brute_visible(m, i, j)) << name(m);
  });
}

TEST(Mask, VisibleRangeIsExactlyTheVisibleKeys) {
  int empty = 0, partial = 0, all = 0;
  for_each_spec([&](const MaskSpec& m) {
    for (int64_t kv = 0; kv <= kMaxLen; ++kv)
      for (int64_t i = 0; i < kMaxLen; ++i) {
        const KeyRange r = visible_range(m, i, kv);
        int64_t n = 0;
        for (int64_t j = 0; j < kv; ++j) {
          const bool in = j >= r.begin && j < r.end;
          ASSERT_EQ(in, brute_visible(m, i, j)) << name(m) << " row " << i << " kv_len " << kv << " key " << j;
          n += in;
        }
        ASSERT_EQ(r.size(), n) << name(m) << " row " << i << " kv_len " << kv;
        ASSERT_EQ(r.empty(), n == 0);
        ASSERT_GE(r.begin, 0);
        ASSERT_LE(r.end, kv);
        (n == 0 ? empty : n == kv ? all : partial)++;
      }
  });
  EXPECT_GT(empty, 0);
  EXPECT_GT(partial, 0);
  EXPECT_GT(all, 0);
}

TEST(Mask, RangeOfRowsIsTheUnion) {
  for_each_spec([](const MaskSpec& m) {
    for (int64_t kv = 0; kv <= kMaxLen; ++kv)
      for (int64_t r0 = 0; r0 < kMaxLen; ++r0)
        for (int64_t rows = 1; r0 + rows <= kMaxLen; ++rows) {
          const KeyRange u = visible_range_of_rows(m, r0, rows, kv);
          for (int64_t j = 0; j < kv; ++j) {
            bool any = false;
            for (int64_t i = r0; i < r0 + rows; ++i) any = any || brute_visible(m, i, j);
            ASSERT_EQ(j >= u.begin && j < u.end, any) << name(m) << " rows " << r0 << "+" << rows << " key " << j;
          }
        }
  });
}

TEST(Mask, VisibleRowsAreExactlyTheRowsThatSeeTheKey) {
  for_each_spec([](const MaskSpec& m) {
    for (int64_t q_len = 0; q_len <= kMaxLen; ++q_len)
      for (int64_t j = 0; j < kMaxLen; ++j) {
        const KeyRange r = visible_rows(m, j, q_len);
        for (int64_t i = 0; i < q_len; ++i)
          ASSERT_EQ(i >= r.begin && i < r.end, brute_visible(m, i, j))
              << name(m) << " key " << j << " q_len " << q_len << " row " << i;
        ASSERT_GE(r.begin, 0);
        ASSERT_LE(r.end, q_len);
      }
  });
}

TEST(Mask, VisibleRowsOfKeysIsTheUnion) {
  for_each_spec([](const MaskSpec& m) {
    for (int64_t q_len = 0; q_len <= kMaxLen; ++q_len)
      for (int64_t j0 = 0; j0 < kMaxLen; ++j0)
        for (int64_t cols = 1; j0 + cols <= kMaxLen; ++cols) {
          const KeyRange u = visible_rows_of_keys(m, j0, cols, q_len);
          ASSERT_GE(u.end, u.begin);
          for (int64_t i = 0; i < q_len; ++i) {
            bool any = false;
            for (int64_t j = j0; j < j0 + cols; ++j) any = any || brute_visible(m, i, j);
            ASSERT_EQ(i >= u.begin && i < u.end, any) << name(m) << " keys " << j0 << "+" << cols << " row " << i;
          }
        }
  });
}

TEST(Mask, ClassifyBlockMatchesElements) {
  int seen[3] = {0, 0, 0};
  for_each_spec([&](const MaskSpec& m) {
    for (int64_t r0 = 0; r0 < 6; ++r0)
      for (int64_t rows = 0; rows < 5; ++rows)
        for (int64_t c0 = 0; c0 < 8; ++c0)
          for (int64_t cols = 0; cols < 5; ++cols) {
            int64_t visible = 0;
            for (int64_t i = r0; i < r0 + rows; ++i)
              for (int64_t j = c0; j < c0 + cols; ++j) visible += brute_visible(m, i, j);
            const BlockVisibility want = visible == 0             ? BlockVisibility::Empty
                                         : visible == rows * cols ? BlockVisibility::Full
                                                                  : BlockVisibility::Partial;
            const BlockVisibility got = classify_block(m, r0, rows, c0, cols);
            ASSERT_EQ(int(got), int(want)) << name(m) << " rows " << r0 << "+" << rows << " cols " << c0 << "+" << cols;
            ++seen[int(got)];
          }
  });
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
}

TEST(Mask, CountVisibleSumsTheRows) {
  for_each_spec([](const MaskSpec& m) {
    for (int64_t kv = 0; kv <= kMaxLen; ++kv)
      for (int64_t r0 = 0; r0 < kMaxLen; ++r0)
        for (int64_t rows = 0; r0 + rows <= kMaxLen; ++rows) {
          int64_t want = 0;
          for (int64_t i = r0; i < r0 + rows; ++i)
            for (int64_t j = 0; j < kv; ++j) want += brute_visible(m, i, j);
          ASSERT_EQ(count_visible(m, r0, rows, kv), want) << name(m) << " rows " << r0 << "+" << rows << " kv " << kv;
          ASSERT_EQ(count_visible<double>(m, r0, rows, kv), double(want)) << name(m);
        }
  });
}

// Every way of packing short sequences into documents (each composition of n), against the
// definition on positions: key k is visible to query q when both lie in the same document and,
// causal, k <= q.
TEST(MaskDocuments, DocumentKeysAndPairCountsMatchTheDefinition) {
  int packings = 0;
  for (int64_t n = 1; n <= 8; ++n)
    for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {  // bit i: a boundary after token i
      std::vector<int64_t> cu{0}, doc_of(size_t(n), 0);
      for (int64_t t = 0; t < n; ++t) {
        doc_of[size_t(t)] = int64_t(cu.size()) - 1;
        if (t == n - 1 || (cuts >> t & 1u)) cu.push_back(t + 1);
      }
      const Documents docs{cu.data(), int64_t(cu.size()) - 1};
      ++packings;
      for (bool causal : {false, true}) {
        int64_t pairs = 0;
        for (int64_t q = 0; q < n; ++q) {
          ASSERT_EQ(document_of(docs, q), doc_of[size_t(q)]);
          const KeyRange r = document_keys(docs, causal, q);
          for (int64_t k = 0; k < n; ++k) {
            const bool want = doc_of[size_t(k)] == doc_of[size_t(q)] && (!causal || k <= q);
            ASSERT_EQ(k >= r.begin && k < r.end, want) << "n " << n << " cuts " << cuts << " q " << q << " k " << k;
            pairs += want;
          }
        }
        ASSERT_EQ(count_document_pairs(docs, causal), pairs);
      }
    }
  EXPECT_EQ(packings, 255);  // 2^0 + ... + 2^7
}

// clamp_offset keeps exactly the visible keys, for offsets and windows anywhere in int64.
TEST(Mask, ClampKeepsTheKeysAtTheLimits) {
  const int64_t big = INT64_MAX, small = INT64_MIN;
  const std::vector<int64_t> offsets{small, small + 1, small / 2, -1000, -20, -10, -9, -8, -3, -1, 0, 1, 3, 8, 9, 10,
                                     17, 20, 1000, big / 2, big - 1, big};
  const std::vector<int64_t> windows{-1, 0, 1, 4, 9, 17, 18, 19, 1000, big / 2, big - 1, big};
  int checked = 0;
  for (bool causal : {false, true})
    for (int64_t off : offsets)
      for (int64_t window : windows)
        for (int64_t q_len : {1, 3, 9})
          for (int64_t kv : {1, 4, 9}) {
            const MaskSpec m{causal, off, window}, c = clamp_offset(m, q_len, kv);
            ASSERT_GE(c.q_offset, -q_len) << name(m);
            ASSERT_LE(c.q_offset, kv) << name(m);
            ASSERT_LT(c.window, q_len + kv) << name(m);
            int64_t n = 0;
            for (int64_t i = 0; i < q_len; ++i)
              for (int64_t j = 0; j < kv; ++j) {
                ASSERT_EQ(brute_visible(c, i, j), brute_visible(m, i, j)) << name(m) << " -> " << name(c);
                n += brute_visible(m, i, j);
              }
            ASSERT_EQ(count_visible(m, 0, q_len, kv), n) << name(m);
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 22 * 12 * 9);
}

// band_mask against FlashAttention's definition on absolute positions: query qs + S*i sees key
// ks + S*j when qs + S*i - left <= ks + S*j <= qs + S*i + right (right 0 when causal, -1 unbounded).
TEST(Mask, BandMaskMatchesWindowsOnStridedPositions) {
  int empty_seen = 0, visible_seen = 0;
  for (bool causal : {false, true})
    for (int64_t left : {-1, 0, 1, 2, 5})
      for (int64_t right : {-1, 0, 1, 3})
        for (int64_t S = 1; S <= 4; ++S)
          for (int64_t qs = 0; qs < 10; ++qs)
            for (int64_t ks = 0; ks < 10; ++ks) {
              bool empty = false;
              const Window w{left, right};
              const MaskSpec m = band_mask(causal, w, qs - ks, S, &empty);
              int64_t n = 0;
              for (int64_t i = 0; i < 6; ++i)
                for (int64_t j = 0; j < 6; ++j) {
                  const int64_t pq = qs + S * i, pk = ks + S * j;
                  const int64_t r = causal ? 0 : right;
                  const bool want = (r < 0 || pk <= pq + r) && (left < 0 || pk >= pq - left);
                  ASSERT_EQ(is_visible(clamp_offset(m, 6, 6), i, j), want)
                      << "causal " << causal << " window " << left << "," << right << " S " << S << " qs " << qs
                      << " ks " << ks << " i " << i << " j " << j << " -> " << name(m);
                  n += want;
                }
              if (empty) ASSERT_EQ(n, 0);
              (empty ? empty_seen : visible_seen)++;
            }
  EXPECT_GT(empty_seen, 0);
  EXPECT_GT(visible_seen, 0);
}

// Edges and offsets anywhere in the int64 range (issue 39's second pass: a window side of 2^60 or
// more was taken as unbounded although --q-offset may put the queries 2^62 from the keys): the
// spec matches the definition computed in 128 bits, and no edge arithmetic overflows.
TEST(Mask, BandMaskIsExactForEdgesAndOffsetsNearTheInt64Range) {
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  const int64_t p60 = int64_t(1) << 60, p62 = int64_t(1) << 62;
  const int64_t sides[] = {-1, 0, 3, p60 - 1, p60, p62, big};
  const int64_t offsets[] = {0, 5, -5, p60, -p60, p62, -p62, big - 10, small, small + 10, p62 + p60 - 2};
  int64_t visible_seen = 0, hidden_seen = 0;
  for (bool causal : {false, true})
    for (int64_t left : sides)
      for (int64_t right : sides)
        for (int64_t S : {1, 3})
          for (int64_t d : offsets) {
            const MaskSpec m = clamp_offset(band_mask(causal, Window{left, right}, d, S), 5, 7);
            for (int64_t i = 0; i < 5; ++i)
              for (int64_t j = 0; j < 7; ++j) {
                const __int128 dist = __int128(d) + __int128(S) * (i - j);  // pq - pk
                const int64_t r = causal ? 0 : right;
                const bool want = (r < 0 || -dist <= r) && (left < 0 || dist <= left);
                ASSERT_EQ(is_visible(m, i, j), want) << "causal " << causal << " window " << left << "," << right
                                                     << " S " << S << " d " << d << " i " << i << " j " << j;
                (want ? visible_seen : hidden_seen)++;
              }
          }
  EXPECT_GT(visible_seen, 0);
  EXPECT_GT(hidden_seen, 0);
  // Documents: the sides compared as distances (pos + right + 1 overflowed).
  const int64_t cu[] = {0, 4, 9};
  const Documents docs{cu, 2};
  for (int64_t w : sides)
    for (int64_t pos = 0; pos < 9; ++pos) {
      const KeyRange k = document_keys(docs, false, pos, Window{w, w});
      const int64_t b = pos < 4 ? 0 : 4, e = pos < 4 ? 4 : 9;
      EXPECT_EQ(k.begin, w < 0 ? b : std::max(b, pos - std::min(w, pos)));
      EXPECT_EQ(k.end, w < 0 ? e : std::min(e, w >= e - pos ? e : pos + w + 1));
    }
}

// Documents with windows: key k visible to query q when both lie in one document, k >= q - left,
// and k <= q + right (k <= q when causal).
TEST(MaskDocuments, WindowedDocumentKeysMatchTheDefinition) {
  const std::vector<int64_t> cu{0, 3, 4, 11, 16};
  const Documents docs{cu.data(), 4};
  for (bool causal : {false, true})
    for (int64_t left : {-1, 0, 1, 2, 6, 40})
      for (int64_t right : {-1, 0, 2, 7}) {
        const Window w{left, right};
        for (bool packed : {false, true}) {
          int64_t pairs = 0;
          for (int64_t q = 0; q < 16; ++q) {
            const KeyRange r = document_keys(packed ? docs : Documents{}, causal, q, w, 16);
            for (int64_t k = 0; k < 16; ++k) {
              const int64_t rr = causal ? 0 : right;
              const bool want = (!packed || document_of(docs, k) == document_of(docs, q)) &&
                                (rr < 0 || k <= q + rr) && (left < 0 || k >= q - left);
              ASSERT_EQ(k >= r.begin && k < r.end, want) << "q " << q << " k " << k << " window " << left << "," << right;
              pairs += want;
            }
          }
          if (packed) ASSERT_EQ(count_document_pairs(docs, causal, w), pairs);
        }
      }
}

}  // namespace
}  // namespace ringattn
