// The CPU engine: fp32 compute on fp32/fp16/bf16 inputs, OpenMP over (batch, head, query tile).
// It is the reference engine for CI and a real fallback on machines without a GPU.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/params.hpp"

namespace ringattn::cpu {

inline constexpr int kDefaultTileQ = 128;
inline constexpr int kDefaultTileK = 128;

// Tiled flash forward (online softmax). Never allocates anything of size q_len x kv_len.
// Validates `p` first (complete = false: rows with no visible key get the empty state).
void flash_forward(const FlashParams& p);

// One step of the online-softmax recurrence for one query row: folds the scores s[0..n) of a key
// tile (and the tile's values v[n][D]) into the running max m, sum l and unnormalized acc[D].
// Overwrites s with exp(s - m_new).
void online_softmax_step(float& m, float& l, float* acc, float* s, int64_t n, const float* v, int64_t D);

// The softmax half of that step: updates m and l, rescales acc[D] by exp(m_old - m_new) and
// overwrites s[0..n) with exp(s - m_new). A row whose scores are all -inf is left unchanged; a NaN
// score makes l NaN (and m, when no score before it was finite): it is never dropped.
void softmax_rescale(float& m, float& l, float* acc, float* s, int64_t n, int64_t D);

// Bytes of workspace flash_forward allocates for `p` with `threads` OpenMP threads. Depends on
// the tile sizes, head_dim and threads only, never on q_len or kv_len.
size_t flash_workspace_bytes(const FlashParams& p, int threads);

// The workspace the last flash_forward call on this thread allocated, in bytes (measured at the
// allocation, for tests that assert the bound above).
size_t last_flash_workspace_bytes();

// Tiled backward (BackwardParams): dq, dk, dv in fp32 from P recomputed out of lse, in two
// passes, each parallel without atomics and so deterministic: dk and dv per (batch, kv head, key
// tile) over the query rows of the group, then dq per (batch, head, query tile). Needs the
// per-row D = rowsum(dout * o) (O(B x Hq x T) floats) and a few tiles per thread beyond its
// inputs, never anything of size q_len x kv_len. Validates `p` first.
void flash_backward(const BackwardParams& p);

// Bytes of workspace flash_backward allocates for `p` with `threads` OpenMP threads: the tiles
// (tile sizes and head_dim only) plus the per-row D (batch x q_heads x q_len floats).
size_t backward_workspace_bytes(const BackwardParams& p, int threads);

// The workspace the last flash_backward call on this thread allocated, in bytes.
size_t last_backward_workspace_bytes();

// state := merge(state, other), the associative (o, lse) merge of core/state.hpp
// (ARCHITECTURE.md, "Contracts").
void merge_states(const MergeParams& p);

// One row of the merge: (o_a, lse_a) := merge((o_a, lse_a), (o_b, lse_b)) over `dim` values.
void merge_row(float* o_a, float* lse_a, const float* o_b, float lse_b, int64_t dim);

// Split-KV decode: the keys in `splits` chunks, a partial state for each, merged in order.
void decode_split_kv(const DecodeParams& p);

// Casts the fp32 state output into out.dtype.
void finalize(const FinalizeParams& p);

// Fills the state with the empty state (o = 0, lse = -inf).
void fill_empty(const StateView& s);

// The fp64 oracle: materializes each row's scores and accumulates in double. Results are
// contiguous [B, Hq, T, D] (o) and [B, Hq, T] (lse); rows with no visible key get o = 0 and
// lse = -inf. Ignores p.state and p.mode.
struct Reference {
  std::vector<double> o, lse;
};
Reference naive_attention(const FlashParams& p);

// The fp64 gradient oracle: the exact gradient of sum(dout * attention(q, k, v)) under p.mask,
// from q, k, v and dout alone (it recomputes o and lse in double and reads neither p.o nor p.lse,
// nor p.dq/dk/dv, p.mode or the tiles). Results are contiguous: dq [B, Hq, T, D], dk and dv
// [B, Hkv, S, D], dk and dv summed over each group's query heads. Rows with no visible key
// contribute nothing. With OracleDelta::FromOutput, D = rowsum(dout * o) reads p.o, the forward's
// output as the backward reads it, instead of the oracle's own o: a 16-bit output moves D by a
// rounding of o, which the gradients carry in proportion to |dout| |o| |k| (or |q|), far above
// their arithmetic error when the inputs are large and the head dim small.
struct GradReference {
  std::vector<double> dq, dk, dv;
};
enum class OracleDelta { Exact, FromOutput };
GradReference naive_backward(const BackwardParams& p, OracleDelta delta = OracleDelta::Exact);

// One row (b, h, i) of the oracle into o_out[0..D) and *lse_out.
void naive_row(const FlashParams& p, int64_t b, int64_t h, int64_t i, double* o_out, double* lse_out);

}  // namespace ringattn::cpu
