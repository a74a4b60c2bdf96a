#include "runner/problem/agree.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/timer.hpp"

namespace ringattn {
namespace {

constexpr uint32_t kMagic = 0x52494e47;  // "RING": catches a peer running something else entirely

// Fixed size and trivially copyable: it travels as bytes through Transport::allgather.
struct Description {
  uint32_t magic = kMagic, version = kProblemVersion;
  int32_t world = 0, operation = 0;  // operation: 1 ring, 2 decode, 3 ring backward
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0, q_offset = 0;
  int64_t doc_count = 0, doc_hash = 0;  // packed documents: how many, and a hash of their lengths
  int64_t window_left = -1, window_right = -1;
  uint32_t dtype = 0, out_dtype = 0, causal = 0, sharding = 0, scale_bits = 0, k_layout = 0, v_layout = 0;
  uint32_t unused = 0;  // keeps layouts_hash 8-aligned with no indeterminate padding in the bytes sent
  uint64_t layouts_hash = 0;
  char error[224] = {};
};

// FNV-1a over the document lengths: ranks with different lists disagree (a collision is 2^-64).
int64_t hash_lengths(const std::vector<int64_t>& lens) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t n : lens)
    for (int i = 0; i < 8; ++i) h = (h ^ ((uint64_t(n) >> (8 * i)) & 0xff)) * 1099511628211ull;
  return int64_t(h);
}

Description describe(const GlobalProblem& p, const LocalVerdict& local, int world) {
  Description d;
  d.world = world;
  d.operation = local.backward ? 3 : p.is_ring() && !local.decode ? 1 : 2;
  d.batch = p.batch;
  d.q_heads = p.q_heads;
  d.kv_heads = p.kv_heads;
  d.q_len = p.q_len;
  d.kv_len = p.kv_len;
  d.head_dim = p.head_dim;
  d.doc_count = int64_t(p.doc_lens.size());
  d.doc_hash = p.doc_lens.empty() ? 0 : hash_lengths(p.doc_lens);
  d.q_offset = p.resolved_q_offset();
  d.window_left = p.window.left;
  d.window_right = p.window.right;
  d.dtype = uint32_t(p.dtype);
  d.out_dtype = uint32_t(p.resolved_out_dtype());
  d.causal = p.causal ? 1 : 0;
  d.sharding = d.operation != 2 ? uint32_t(p.sharding) : 0;  // decode always splits KV contiguously
  const float s = p.resolved_scale();
  std::memcpy(&d.scale_bits, &s, 4);
  d.k_layout = local.k_layout;
  d.v_layout = local.v_layout;
  d.layouts_hash = local.layouts_hash;
  std::strncpy(d.error, local.error.c_str(), sizeof(d.error) - 1);
  return d;
}

float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The first field where `a` differs from `ref`, as "name = a (rank R has ref)"; "" when equal.
std::string first_difference(const Description& a, const Description& ref, int ref_rank) {
  auto field = [&](const char* name, auto va, auto vr) -> std::string {
    if (va == vr) return "";
    return fmt::format("{} = {} (rank {} has {})", name, va, ref_rank, vr);
  };
  // Hashes read as what they are: 16 hex digits, not a signed decimal.
  auto hash = [](auto v) { return fmt::format("{:016x}", static_cast<uint64_t>(v)); };
  const std::pair<const char*, std::pair<int64_t, int64_t>> ints[] = {
      {"magic", {a.magic, ref.magic}},          {"version", {a.version, ref.version}},
      {"world size", {a.world, ref.world}},
      {"operation (1 ring, 2 decode, 3 ring backward)", {a.operation, ref.operation}},
      {"batch", {a.batch, ref.batch}},          {"q_heads", {a.q_heads, ref.q_heads}},
      {"kv_heads", {a.kv_heads, ref.kv_heads}}, {"q_len", {a.q_len, ref.q_len}},
      {"kv_len", {a.kv_len, ref.kv_len}},       {"head_dim", {a.head_dim, ref.head_dim}},
      {"q_offset", {a.q_offset, ref.q_offset}}, {"causal", {a.causal, ref.causal}},
      {"documents (count)", {a.doc_count, ref.doc_count}},
      {"window left", {a.window_left, ref.window_left}}, {"window right", {a.window_right, ref.window_right}},
      {"k layout (0 bhtd, 1 bthd, 2 strided)", {a.k_layout, ref.k_layout}},
      {"v layout (0 bhtd, 1 bthd, 2 strided)", {a.v_layout, ref.v_layout}}};
  for (const auto& [name, v] : ints)
    if (std::string s = field(name, v.first, v.second); !s.empty()) return s;
  if (a.doc_hash != ref.doc_hash) return field("document lengths (hash)", hash(a.doc_hash), hash(ref.doc_hash));
  if (a.dtype != ref.dtype)
    return field("dtype", dtype_name(DType(a.dtype)), dtype_name(DType(ref.dtype)));
  if (a.out_dtype != ref.out_dtype)
    return field("output dtype", dtype_name(DType(a.out_dtype)), dtype_name(DType(ref.out_dtype)));
  if (a.sharding != ref.sharding)
    return field("sharding", sharding_name(Sharding(a.sharding)), sharding_name(Sharding(ref.sharding)));
  if (a.scale_bits != ref.scale_bits) return field("scale", bits_to_float(a.scale_bits), bits_to_float(ref.scale_bits));
  // Last: layouts of one sharding differ only when the fields above do.
  if (a.layouts_hash != ref.layouts_hash)
    return field("ring layouts (hash)", hash(a.layouts_hash), hash(ref.layouts_hash));
  return "";
}

bool same(const Description& a, const Description& b) {
  return first_difference(a, b, 0).empty();
}

// Throws, on every rank alike, the errors the gathered records carry: each distinct text once,
// after the ranks that hold it ("rank 1: ...", "ranks 0 and 2: ..."), in the order of its first rank.
template <typename Record>
void stop_on_errors(const std::vector<Record>& all) {
  std::vector<std::pair<std::string, std::vector<size_t>>> texts;
  for (size_t r = 0; r < all.size(); ++r) {
    const Record& d = all[r];
    if (d.magic != kMagic || d.error[0] == '\0') continue;
    const std::string e(d.error, strnlen(d.error, sizeof(d.error)));
    auto it = std::find_if(texts.begin(), texts.end(), [&](const auto& t) { return t.first == e; });
    if (it == texts.end()) texts.push_back({e, {r}});
    else it->second.push_back(r);
  }
  if (texts.empty()) return;
  std::string errors;
  for (const auto& [text, ranks] : texts) {
    std::string who = fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", ranks[0]);
    for (size_t i = 1; i < ranks.size(); ++i) who += fmt::format("{}{}", i + 1 == ranks.size() ? " and " : ", ", ranks[i]);
    errors += fmt::format("{}{}: {}", errors.empty() ? "" : "; ", who, text);
  }
  fail_arg("ranks stopped before the first hop: {}", errors);
}

// agree_on_local_step's record: trivially copyable, no padding.
struct StepRecord {
  uint32_t magic = kMagic, version = kProblemVersion;
  int64_t value = 0;
  char error[480] = {};
};

}  // namespace

std::vector<int64_t> agree_on_local_step(Transport& t, const std::string& error, int64_t value) {
  StepRecord mine;
  mine.value = value;
  std::strncpy(mine.error, error.c_str(), sizeof(mine.error) - 1);
  std::vector<StepRecord> all(size_t(t.size()));
  t.allgather(&mine, all.data(), sizeof(StepRecord));
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].magic != kMagic || all[r].version != kProblemVersion)
      fail_arg("ranks disagree on the problem: rank {} sent a record of another kind or version (magic {:#x}, version "
               "{}; this rank has {:#x}, {})", r, all[r].magic, all[r].version, kMagic, kProblemVersion);
  stop_on_errors(all);
  std::vector<int64_t> values;
  for (const StepRecord& d : all) values.push_back(d.value);
  return values;
}

void agree_on_run(const GlobalProblem& p, const LocalVerdict& local, Transport& t) {
  const int P = t.size();
  const Description mine = describe(p, local, P);
  std::vector<Description> all(static_cast<size_t>(P));
  t.allgather(&mine, all.data(), sizeof(Description));

  // Every rank evaluates the same gathered bytes in the same order: the verdict is identical.
  stop_on_errors(all);

  // The reference is the description most ranks hold (ties: the lowest rank), so a single odd
  // rank is the one named, even when it is rank 0.
  int ref = 0, best = 0;
  for (int r = 0; r < P; ++r) {
    int votes = 0;
    for (int s = 0; s < P; ++s) votes += same(all[size_t(r)], all[size_t(s)]) ? 1 : 0;
    if (votes > best) best = votes, ref = r;
  }
  std::vector<int> differ;
  for (int r = 0; r < P; ++r)
    if (!same(all[size_t(r)], all[size_t(ref)])) differ.push_back(r);
  if (differ.empty()) return;
  std::string msg = fmt::format("ranks disagree on the problem ({} of {} differ from rank {}):", differ.size(), P, ref);
  for (int r : differ) msg += fmt::format(" rank {}: {};", r, first_difference(all[size_t(r)], all[size_t(ref)], ref));
  msg += " every rank must pass the same problem";
  fail_arg("{}", msg);
}

void agree_on_problem(const GlobalProblem& p, Transport& t) { agree_on_run(p, LocalVerdict{}, t); }

}  // namespace ringattn
