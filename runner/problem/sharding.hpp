// How a sequence is sharded over ranks: the schemes, the tokens each rank holds, and the KV split
// of distributed decode. Pure arithmetic: no backend, no transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/mask.hpp"

namespace ringattn {

// ---------------------------------------------------------------------------------------------
// Sharding: which global tokens each rank holds.

enum class Sharding : uint8_t {
  Contiguous = 0,  // rank r holds tokens [r*N/P, (r+1)*N/P)
  Zigzag = 1,      // N in 2P chunks; rank r holds chunks r and 2P-1-r (balances causal work)
  Striped = 2,     // token t on rank t mod P
  DocZigzag = 3,   // zigzag inside every packed document (TransformerEngine's); zigzag without documents
};

const char* sharding_name(Sharding s);  // "contiguous", "zigzag", "striped", "doc-zigzag"
// Parses "contiguous|zigzag|striped|doc-zigzag"; throws InvalidArgument naming the allowed values.
Sharding parse_sharding(const std::string& name);

// An arithmetic run of global token positions: start, start + stride, ..., len of them.
struct Segment {
  int64_t start = 0;
  int64_t len = 0;
  int64_t stride = 1;
  int64_t position(int64_t i) const { return start + i * stride; }
};

// The tokens one rank holds, in local row order: the segments one after another (local row 0 is
// segments[0].start, and so on). Fill a local tensor segment by segment with
// fill_input(view.rows(row0, seg.len), seed, which, seg.start, seg.stride).
struct ShardLayout {
  std::vector<Segment> segments;
  int64_t tokens() const;                         // sum of segment lengths
  int64_t global_position(int64_t local_row) const;  // throws InvalidArgument when out of range
  int64_t first_row(size_t segment) const;        // local row where segments[segment] begins
};

// Every length splits over every world: contiguous cuts the sequence into P chunks and zigzag
// into 2P chunks (rank r holds chunks r and 2P-1-r), chunk c being [floor(c N / n), floor((c+1)
// N / n)), so chunk sizes differ by at most one token; striped gives token t to rank t mod P.
// A rank may hold no tokens (P > N): it still takes part in the ring and contributes nothing.
// Throws InvalidArgument when `world` < 1 or `seq_len` < 1 (the same on every rank).
void check_shardable(Sharding s, int64_t seq_len, int world);

// The layout of `rank` out of `world` for a sequence of `seq_len` tokens. Calls check_shardable.
// Segments are never empty; a world of one is one segment [0, seq_len) under every scheme.
// doc-zigzag cuts every document of `docs` (core/mask.hpp; covering [0, seq_len)) into 2P chunks
// and gives rank r chunks r and 2P-1-r of each, document by document, so causal work inside
// every document is balanced; without documents it is zigzag.
ShardLayout shard_layout(Sharding s, int64_t seq_len, int rank, int world, Documents docs = {});

// Every rank's layout under scheme `s` (shard_layout for rank 0 .. world - 1): the layouts a ring
// plan is made from (runner/ring/ring_plan.hpp). A plan takes any layouts that check_layouts
// accepts, so a layout no scheme names (a hybrid group's union of shards) is made by the caller.
std::vector<ShardLayout> shard_layouts(Sharding s, int64_t seq_len, int world, Documents docs = {});

// Checks that `layouts` (one per rank) share the positions [0, seq_len) out exactly: every
// segment non-empty with a stride >= 1 and inside the sequence, no position held twice, none left
// out. Throws InvalidArgument naming the rank, the segment and its values, or the position held
// twice. The layouts shard_layout makes always pass.
void check_layouts(std::span<const ShardLayout> layouts, int64_t seq_len);

// The tokens every rank holds (shard_layout(...).tokens() for rank 0 .. world - 1).
std::vector<int64_t> shard_tokens(Sharding s, int64_t seq_len, int world, Documents docs = {});

// The contiguous KV split of distributed decode: rank r holds keys [r*S/P, (r+1)*S/P) (floor
// division, so any S works; a rank may hold none when S < P).
Segment kv_shard(int64_t kv_len, int rank, int world);

}  // namespace ringattn
