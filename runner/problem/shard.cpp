// Sharding of a global sequence over ranks: the segments of global positions each rank holds.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "core/mask.hpp"
#include "runner/problem/checked.hpp"
#include "core/error.hpp"
#include "runner/problem/problem.hpp"
#include "runner/problem/sharding.hpp"

namespace ringattn {

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::Contiguous: return "contiguous";
    case Sharding::Zigzag: return "zigzag";
    case Sharding::Striped: return "striped";
    case Sharding::DocZigzag: return "doc-zigzag";
  }
  return "?";
}

Sharding parse_sharding(const std::string& name) {
  if (name == "contiguous") return Sharding::Contiguous;
  if (name == "zigzag") return Sharding::Zigzag;
  if (name == "striped") return Sharding::Striped;
  if (name == "doc-zigzag") return Sharding::DocZigzag;
  fail_arg("unknown sharding '{}': allowed are contiguous, zigzag, striped, doc-zigzag", name);
}

int64_t ShardLayout::tokens() const {
  int64_t n = 0;
  for (const Segment& s : segments) n += s.len;
  return n;
}

int64_t ShardLayout::global_position(int64_t local_row) const {
  if (local_row >= 0) {
    int64_t row = local_row;
    for (const Segment& s : segments) {
      if (row < s.len) return s.position(row);
      row -= s.len;
    }
  }
  fail_arg("local row {} is outside this shard of {} tokens", local_row, tokens());
}

int64_t ShardLayout::first_row(size_t segment) const {
  if (segment >= segments.size()) fail_arg("segment {} does not exist: the shard has {}", segment, segments.size());
  int64_t row = 0;
  for (size_t i = 0; i < segment; ++i) row += segments[i].len;
  return row;
}

namespace {

// Boundary c of `chunks` near-equal chunks of n tokens: floor(c * n / chunks). Consecutive
// chunks differ in size by at most one token (128-bit product: c * n may pass int64).
int64_t chunk_begin(int64_t c, int64_t n, int64_t chunks) { return int64_t(PairCount(c) * n / chunks); }

Segment chunk(int64_t c, int64_t n, int64_t chunks) {
  const int64_t b = chunk_begin(c, n, chunks);
  return {b, chunk_begin(c + 1, n, chunks) - b, 1};
}

}  // namespace

void check_shardable(Sharding /*s*/, int64_t seq_len, int world) {
  if (world < 1) fail_arg("the world must have at least one rank (got {})", world);
  if (seq_len < 1) fail_arg("sequence length must be >= 1 (got {})", seq_len);
}

ShardLayout shard_layout(Sharding s, int64_t seq_len, int rank, int world, Documents docs) {
  check_shardable(s, seq_len, world);
  if (rank < 0 || rank >= world) fail_arg("rank {} is outside the world of {} ranks", rank, world);
  if (s == Sharding::DocZigzag && !docs.none() && docs.cu[docs.count] != seq_len)
    fail_arg("doc-zigzag sharding: the documents cover {} tokens but the sequence has {}", docs.cu[docs.count], seq_len);
  const int64_t P = world, r = rank;
  std::vector<Segment> raw;
  switch (s) {
    case Sharding::DocZigzag:
      if (docs.none()) return shard_layout(Sharding::Zigzag, seq_len, rank, world);
      for (int64_t d = 0; d < docs.count; ++d) {  // chunks r and 2P-1-r of every document
        const int64_t a = docs.cu[d], n = docs.cu[d + 1] - a;
        for (const int64_t c : {r, 2 * P - 1 - r}) {
          Segment g = chunk(c, n, 2 * P);
          g.start += a;
          raw.push_back(g);
        }
      }
      break;
    case Sharding::Contiguous:
      raw.push_back(chunk(r, seq_len, P));
      break;
    case Sharding::Zigzag:
      raw.push_back(chunk(r, seq_len, 2 * P));
      raw.push_back(chunk(2 * P - 1 - r, seq_len, 2 * P));
      break;
    case Sharding::Striped:  // tokens r, r + P, ...: ceil((seq_len - r) / P) of them, none when r >= seq_len
      raw.push_back({r, r < seq_len ? (seq_len - r - 1) / P + 1 : 0, P});
      break;
  }
  // Empty segments go (a rank may hold no tokens when the sequence is shorter than the chunks);
  // runs that continue each other become one segment (zigzag's last rank holds chunks P-1 and P;
  // at P = 1 every scheme is one run): one kernel call instead of several, and no fold between
  // them. Row order is unchanged.
  ShardLayout l;
  for (Segment g : raw) {
    if (g.len <= 0) continue;
    if (g.len == 1) g.stride = 1;
    Segment* last = l.segments.empty() ? nullptr : &l.segments.back();
    if (last && last->stride == 1 && g.stride == 1 && last->position(last->len) == g.start)
      last->len += g.len;
    else
      l.segments.push_back(g);
  }
  return l;
}

std::vector<ShardLayout> shard_layouts(Sharding s, int64_t seq_len, int world, Documents docs) {
  check_shardable(s, seq_len, world);
  std::vector<ShardLayout> all(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) all[size_t(r)] = shard_layout(s, seq_len, r, world, docs);
  return all;
}

namespace {

// The inverse of a modulo m (gcd(a, m) = 1), in [0, m); 0 when m is 1.
int64_t inverse_mod(int64_t a, int64_t m) {
  PairCount r0 = m, r1 = a, x0 = 0, x1 = 1;
  while (r1 != 0) {
    const PairCount q = r0 / r1;
    std::tie(r0, r1) = std::pair{r1, r0 - q * r1};
    std::tie(x0, x1) = std::pair{x1, x0 - q * x1};
  }
  return int64_t((x0 % m + m) % m);
}

// The first position that runs a and b both hold (a.start <= b.start, both inside the sequence),
// or none: b.start + t j for the least j >= 0 with t j = a.start - b.start (mod a's stride).
std::optional<int64_t> first_common(const Segment& a, const Segment& b) {
  const int64_t hi = std::min(a.position(a.len - 1), b.position(b.len - 1));
  const int64_t s = a.stride, t = b.stride, g = std::gcd(s, t), d = b.start - a.start;
  if (hi < b.start || d % g != 0) return std::nullopt;
  const int64_t m = s / g, rhs = ((-(d / g)) % m + m) % m;
  const PairCount j = PairCount(rhs) * inverse_mod((t / g) % m, m) % m;
  const PairCount x = PairCount(b.start) + PairCount(t) * j;
  if (x > hi) return std::nullopt;
  return int64_t(x);
}

struct HeldRun {
  int rank;
  size_t segment;
  Segment run;
  int64_t last;  // its last position
};

// Every segment of every rank, checked on its own; sorted by first position.
std::vector<HeldRun> held_runs(std::span<const ShardLayout> layouts, int64_t seq_len) {
  std::vector<HeldRun> runs;
  for (size_t r = 0; r < layouts.size(); ++r)
    for (size_t i = 0; i < layouts[r].segments.size(); ++i) {
      const Segment& g = layouts[r].segments[i];
      const auto bad = [&](const std::string& why) {
        fail_arg("rank {} segment {} (start {}, {} tokens, stride {}): {}", r, i, g.start, g.len, g.stride, why);
      };
      if (g.len < 1) bad("a segment holds at least one token");
      if (g.stride < 1) bad("the stride must be >= 1");
      const PairCount last = PairCount(g.start) + PairCount(g.stride) * (g.len - 1);
      if (g.start < 0 || last >= seq_len)
        bad(fmt::format("its positions {} to {:.0f} leave the sequence [0, {})", g.start, to_double(last), seq_len));
      runs.push_back({int(r), i, g, int64_t(last)});
    }
  std::sort(runs.begin(), runs.end(), [](const HeldRun& x, const HeldRun& y) { return x.run.start < y.run.start; });
  return runs;
}

}  // namespace

void check_layouts(std::span<const ShardLayout> layouts, int64_t seq_len) {
  check_shardable(Sharding::Contiguous, seq_len, int(layouts.size()));
  const std::vector<HeldRun> runs = held_runs(layouts, seq_len);
  // A sweep by first position: a run can share a position only with the runs still open at its
  // start (those whose last position is not before it).
  std::vector<const HeldRun*> open;
  PairCount held = 0;
  for (const HeldRun& h : runs) {
    std::erase_if(open, [&](const HeldRun* o) { return o->last < h.run.start; });
    for (const HeldRun* o : open)
      if (const std::optional<int64_t> x = first_common(o->run, h.run))
        fail_arg("position {} is held twice: by rank {} (segment {}) and by rank {} (segment {}); every position must "
                 "be on exactly one rank", *x, o->rank, o->segment, h.rank, h.segment);
    open.push_back(&h);
    held += h.run.len;
  }
  if (held != seq_len)
    fail_arg("the layouts of the {} ranks hold {} of the {} positions: every position must be on exactly one rank",
             layouts.size(), int64_t(held), seq_len);
}

std::vector<int64_t> shard_tokens(Sharding s, int64_t seq_len, int world, Documents docs) {
  std::vector<int64_t> n(size_t(world > 0 ? world : 0));
  for (int r = 0; r < world; ++r) n[size_t(r)] = shard_layout(s, seq_len, r, world, docs).tokens();
  return n;
}

Segment kv_shard(int64_t kv_len, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) fail_arg("rank {} is outside the world of {} ranks", rank, world);
  // rank x kv_len may pass int64; the quotient never does.
  const int64_t b = int64_t(PairCount(rank) * kv_len / world), e = int64_t((PairCount(rank) + 1) * kv_len / world);
  return {b, e - b, 1};
}

std::vector<int64_t> GlobalProblem::doc_bounds() const {
  std::vector<int64_t> cu;
  if (doc_lens.empty()) return cu;
  cu.reserve(doc_lens.size() + 1);
  cu.push_back(0);
  for (int64_t n : doc_lens) cu.push_back(cu.back() + n);  // validate_problem bounds the sum
  return cu;
}

float GlobalProblem::resolved_scale() const {
  return scale != 0.f ? scale : float(1.0 / std::sqrt(double(head_dim > 0 ? head_dim : 1)));
}

namespace {

// Every position and size the run computes must be an int64: the last query's position
// q_offset + q_len - 1, and the element and byte counts of q, k, v and out.
void check_positions(const GlobalProblem& p) {
  const int64_t off = p.resolved_q_offset();
  if (!try_add(off, p.q_len - 1))
    fail_arg("q_offset (--q-offset) {} puts the last query at position {} + {} - 1, which does not fit in a 64-bit "
             "integer: with q_len {} the allowed q_offset is {} to {}", off, off, p.q_len, p.q_len, kInt64Min,
             kInt64Max - (p.q_len - 1));
  const int64_t es = dtype_size(p.dtype);
  checked_product({p.batch, p.q_heads, p.q_len, p.head_dim, es}, "the bytes of q (batch x heads x q_len x dim x dtype size)");
  checked_product({p.batch, p.kv_heads, p.kv_len, p.head_dim, es},
                  "the bytes of k (batch x kv_heads x kv_len x dim x dtype size)");
  checked_product({p.batch, p.q_heads, p.q_len, p.kv_len}, "the query-key pairs (batch x heads x q_len x kv_len)");
}

}  // namespace

// Packed documents: self-attention only, every length >= 1, the lengths summing to q_len.
void check_documents(const GlobalProblem& p) {
  if (p.doc_lens.empty()) return;
  if (!p.is_ring())
    fail_arg("packed documents need self-attention (q_len == kv_len, q_offset 0); got q_len={}, kv_len={}, "
             "q_offset={}", p.q_len, p.kv_len, p.resolved_q_offset());
  int64_t sum = 0;
  for (size_t d = 0; d < p.doc_lens.size(); ++d) {
    const int64_t n = p.doc_lens[d];
    if (n < 1) fail_arg("document {} has length {}: every document needs at least one token", d, n);
    const std::optional<int64_t> s = try_add(sum, n);
    if (!s || *s > p.q_len)
      fail_arg("the document lengths add up to more than the sequence length {} (by document {} of {})", p.q_len, d,
               p.doc_lens.size());
    sum = *s;
  }
  if (sum != p.q_len)
    fail_arg("the {} document lengths add up to {}, but the sequence has {} tokens: they must add up to it",
             p.doc_lens.size(), sum, p.q_len);
}

void validate_window(const Window& w, bool causal) {
  for (const auto& [side, v] : {std::pair{"left", w.left}, std::pair{"right", w.right}})
    if (v < -1) fail_arg("window {} {} is out of range: a side is -1 (unbounded) or >= 0 tokens", side, v);
  if (causal && w.right > 0)
    fail_arg("window right {} does not fit causal attention: with causal the right edge is the diagonal, so right "
             "must be 0 or -1", w.right);
}

void validate_problem_values(const GlobalProblem& p, int world) {
  if (world < 1) fail_arg("the world must have at least one rank (got {})", world);
  if (p.batch < 1) fail_arg("batch must be >= 1 (got {})", p.batch);
  if (p.q_heads < 1) fail_arg("q_heads must be >= 1 (got {})", p.q_heads);
  if (p.kv_heads < 1) fail_arg("kv_heads must be >= 1 (got {})", p.kv_heads);
  if (p.q_heads % p.kv_heads != 0)
    fail_arg("q_heads={} is not a multiple of kv_heads={}: grouped-query attention needs q_heads = g * kv_heads",
             p.q_heads, p.kv_heads);
  if (p.head_dim < 1) fail_arg("head_dim must be >= 1 (got {})", p.head_dim);
  if (p.q_len < 1) fail_arg("q_len must be >= 1 (got {})", p.q_len);
  if (p.kv_len < 1) fail_arg("kv_len must be >= 1 (got {})", p.kv_len);
  if (!std::isfinite(p.scale)) fail_arg("softmax scale must be finite (got {})", p.scale);
  if (p.resolved_out_dtype() != p.dtype)
    fail_arg("output dtype {} differs from the input dtype {}: no kernel writes an output in another dtype than its "
             "input's yet; the output dtype must be {}", dtype_name(p.resolved_out_dtype()), dtype_name(p.dtype),
             dtype_name(p.dtype));
  check_positions(p);
  check_documents(p);
  validate_window(p.window, p.causal);
  const int64_t off = p.resolved_q_offset();
  // Clamped first (core/mask.hpp clamp_offset): row + q_offset + 1 cannot overflow.
  if (visible_range(clamp_offset(MaskSpec{p.causal, off}, p.q_len, p.kv_len), 0, p.kv_len).empty())
    fail_arg("causal attention with q_offset={} leaves query 0 with no visible key; it needs q_offset >= 0 (the "
             "default is kv_len - q_len = {})", off, p.kv_len - p.q_len);
  // Both ends of a row's keys grow with the row and a band never skips a row: the first and the
  // last query decide whether every query sees a key.
  // The rows without a key are then a run at the start (the window's upper edge below key 0) or
  // at the end (its lower edge past the last key): named whole, found by bisection.
  const MaskSpec m = clamp_offset(p.mask(), p.q_len, p.kv_len);
  const auto empty = [&](int64_t row) { return visible_range(m, row, p.kv_len).empty(); };
  int64_t first = -1, last = -1;
  if (empty(0)) {
    int64_t lo = 0, hi = p.q_len - 1;  // the last empty row of the leading run: in [lo, hi]
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (empty(mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    first = 0, last = lo;
  } else if (empty(p.q_len - 1)) {
    int64_t lo = 1, hi = p.q_len - 1;  // the first empty row of the trailing run: in [lo, hi]
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (empty(mid))
        hi = mid;
      else
        lo = mid + 1;
    }
    first = lo, last = p.q_len - 1;
  }
  if (first < 0) return;
  if (first == last)
    fail_arg("the window (left {}, right {}) leaves query {} (position {}) with no visible key among the {} keys: "
             "every query needs one", p.window.left, p.window.right, first, off + first, p.kv_len);
  fail_arg("the window (left {}, right {}) leaves queries {} to {} (positions {} to {}) with no visible key among the "
           "{} keys: every query needs one", p.window.left, p.window.right, first, last, off + first, off + last,
           p.kv_len);
}

void validate_problem(const GlobalProblem& p, int world) {
  validate_problem_values(p, world);
  if (p.is_ring()) check_shardable(p.sharding, p.q_len, world);
}

}  // namespace ringattn
