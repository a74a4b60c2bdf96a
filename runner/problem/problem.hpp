// The global problem every rank passes (shape, dtype, mask, sharding) and its checks: the local
// validation and the agreement across ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "comm/transport.hpp"
#include "core/mask.hpp"
#include "core/types.hpp"
#include "runner/problem/sharding.hpp"

namespace ringattn {

// ---------------------------------------------------------------------------------------------
// The global problem. Every rank passes the same one; agree_on_problem checks that they do.

// 2: packed documents, 3: the window in the description, 4: the output dtype in the description,
// 5: the ring layouts
inline constexpr uint32_t kProblemVersion = 5;

struct GlobalProblem {
  int64_t batch = 1;
  int64_t q_heads = 1;
  int64_t kv_heads = 1;        // q_heads must be a multiple (GQA; MQA when 1)
  int64_t q_len = 0;           // global query tokens (ring: = kv_len; decode: replicated on all ranks)
  int64_t kv_len = 0;          // global key/value tokens
  int64_t head_dim = 0;
  DType dtype = DType::F32;    // of q, k and v
  // The output's (out, and the backward's dout); unset: the input dtype. Apart from dtype so that
  // an fp8 input with a bf16 output can be said; no kernel writes another dtype than its input's
  // yet, so validate_problem refuses a different one.
  std::optional<DType> out_dtype;
  bool causal = false;
  // pos(q_0) - pos(k_0); unset: kv_len - q_len. The ring needs 0 (self-attention). Any int64 for
  // which the last query's position q_offset + q_len - 1 is an int64 (validate_problem).
  std::optional<int64_t> q_offset;
  Sharding sharding = Sharding::Contiguous;  // ring only; decode always splits KV contiguously
  float scale = 0.f;           // softmax scale; 0 means 1/sqrt(head_dim)
  // Packed documents (ring only): their lengths in order, summing to q_len; each query attends
  // only to its own document (core/mask.hpp Documents). Empty: the sequence is one document.
  std::vector<int64_t> doc_lens;
  // Sliding window (FlashAttention's window_size, core/mask.hpp Window): key at position pk is
  // visible to the query at pq when pq - left <= pk <= pq + right; -1 leaves a side unbounded.
  // With causal, right is 0 or -1 (the diagonal is the right edge).
  Window window;

  int64_t resolved_q_offset() const { return q_offset.value_or(kv_len - q_len); }
  DType resolved_out_dtype() const { return out_dtype.value_or(dtype); }
  float resolved_scale() const;
  // The ring runs self-attention (q_len == kv_len, q_offset 0); anything else is a decode problem.
  bool is_ring() const { return q_len == kv_len && resolved_q_offset() == 0; }
  // The document boundaries (cu_seqlens: 0, then the running sums of doc_lens); empty without
  // documents. View them with documents_of.
  std::vector<int64_t> doc_bounds() const;
  // The mask of the whole problem's queries against its keys (core/mask.hpp band_mask with the
  // resolved q_offset): what one device computes, and what the decode splits over ranks.
  MaskSpec mask() const { return band_mask(causal, window, resolved_q_offset(), 1); }
};

// The Documents view of boundaries from doc_bounds() (none when empty); `bounds` must outlive it.
inline Documents documents_of(const std::vector<int64_t>& bounds) {
  return bounds.size() < 2 ? Documents{} : Documents{bounds.data(), int64_t(bounds.size()) - 1};
}
// A temporary's boundaries die at the end of the statement: keep them in a named vector.
Documents documents_of(std::vector<int64_t>&& bounds) = delete;

// Checks shapes and values on this rank alone (no communication). Throws InvalidArgument.
void validate_problem(const GlobalProblem& p, int world);

// The window alone: each side -1 (unbounded) or >= 0; with causal, right is 0 or -1. (Part of
// validate_problem; `plan` checks only this, the documents and the sharding.)
void validate_window(const Window& w, bool causal);
// Packed documents: self-attention only, every length >= 1, the lengths summing to q_len. (Part
// of validate_problem.)
void check_documents(const GlobalProblem& p);

// Allgathers a fixed-size description of `p` (shape, dtypes, causal, sharding, q_offset, scale,
// operation, version, world size) and compares. When any rank differs, every rank throws
// InvalidArgument with the same message, naming the rank(s) that differ and the first field.
// validate_problem without the sharding check (decode splits KV of any length).
void validate_problem_values(const GlobalProblem& p, int world);

void agree_on_problem(const GlobalProblem& p, Transport& t);

}  // namespace ringattn
