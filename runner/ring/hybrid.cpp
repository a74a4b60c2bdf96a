#include "runner/ring/hybrid.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "runner/problem/agree.hpp"

namespace ringattn {
namespace {

// Rows [lo, hi) of `l`, in its row order, as a layout of their own.
ShardLayout rows_of(const ShardLayout& l, int64_t lo, int64_t hi) {
  ShardLayout out;
  int64_t row = 0;
  for (const Segment& s : l.segments) {
    const int64_t a = std::max(lo, row), e = std::min(hi, row + s.len);
    if (a < e) out.segments.push_back(Segment{s.position(a - row), e - a, s.stride});
    row += s.len;
  }
  return out;
}

// Where piece w of n rows cut U ways begins: n w / U (in 128 bits: n w may pass 2^63).
int64_t piece_begin(int64_t n, int w, int U) { return int64_t(__int128(n) * w / U); }

ShardLayout group_shard(const GlobalProblem& p, int g, int G) {
  const std::vector<int64_t> bounds = p.doc_bounds();
  return shard_layout(p.sharding, p.q_len, g, G, documents_of(bounds));
}

// Copies rows [t0, t0 + n) of heads [h0, h0 + hn) of every batch of `x` to `dst`, one after
// another ([batch][head][row][dim]); returns the end of what it wrote. Rows of dim elements are
// contiguous in every view the runner takes.
char* pack(const TensorView& x, int64_t h0, int64_t hn, int64_t t0, int64_t n, char* dst) {
  const size_t es = dtype_size(x.dtype), row = size_t(x.dim) * es;
  for (int64_t b = 0; b < x.batch; ++b)
    for (int64_t h = h0; h < h0 + hn; ++h)
      for (int64_t t = t0; t < t0 + n; ++t, dst += row)
        std::memcpy(dst, static_cast<const char*>(x.data) + size_t(x.offset(b, h, t)) * es, row);
  return dst;
}

// The inverse of pack: `src` into those rows and heads of `x`; returns the end of what it read.
const char* unpack(const char* src, const TensorView& x, int64_t h0, int64_t hn, int64_t t0, int64_t n) {
  const size_t es = dtype_size(x.dtype), row = size_t(x.dim) * es;
  for (int64_t b = 0; b < x.batch; ++b)
    for (int64_t h = h0; h < h0 + hn; ++h)
      for (int64_t t = t0; t < t0 + n; ++t, src += row)
        std::memcpy(static_cast<char*>(x.data) + size_t(x.offset(b, h, t)) * es, src, row);
  return src;
}

// What this rank refuses on its own (its tensors), "" when nothing.
std::string local_problem(const GlobalProblem& p, const LocalTensors& x, int64_t rows) {
  const std::pair<const char*, const TensorView*> views[] = {{"q", &x.q}, {"k", &x.k}, {"v", &x.v}, {"out", &x.out}};
  for (const auto& [name, v] : views) {
    const int64_t heads = v == &x.k || v == &x.v ? p.kv_heads : p.q_heads;
    if (v->batch != p.batch || v->heads != heads || v->len != rows || v->dim != p.head_dim)
      return fmt::format("{} is [{}, {}, {}, {}] but this rank's rows of the hybrid layout need [{}, {}, {}, {}]", name,
                         v->batch, v->heads, v->len, v->dim, p.batch, heads, rows, p.head_dim);
    if (v->data == nullptr && v->numel() > 0) return fmt::format("{} has no data", name);
  }
  return "";
}

// Both agreements, the group's and then the ring's carrying the group's verdict ("in group G,
// rank U: ..."): every ring holds one rank of every group, so a group that stops stops every rank,
// with the same text.
void agree_on_hybrid(const GlobalProblem& p, const std::string& error, Transport& group, Transport& ring) {
  constexpr std::string_view kStopped = "ranks stopped before the first hop: ";  // agree_on_run's
  LocalVerdict mine;
  mine.error = error;
  try {
    agree_on_run(p, mine, group);
    mine.error.clear();
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    if (what.rfind(kStopped, 0) == 0) what.erase(0, kStopped.size());
    mine.error = fmt::format("in group {}, {}", ring.rank(), what);
  }
  agree_on_run(p, mine, ring);
}

}  // namespace

ShardLayout hybrid_layout(const GlobalProblem& p, int group_size, int rank, int world) {
  if (group_size < 1 || world < 1 || world % group_size != 0)
    fail_arg("hybrid context parallelism: groups of {} ranks do not divide a world of {}; the group size must be a "
             "divisor of the world", group_size, world);
  if (rank < 0 || rank >= world) fail_arg("rank {} is outside the world of {}", rank, world);
  const int U = group_size, u = rank % U;
  const ShardLayout shard = group_shard(p, rank / U, world / U);
  const int64_t n = shard.tokens();
  return rows_of(shard, piece_begin(n, u, U), piece_begin(n, u + 1, U));
}

RankStats run_hybrid_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& group,
                               Transport& ring, const RunOptions& opt) {
  const int U = group.size(), u = group.rank(), G = ring.size(), g = ring.rank();
  if (!p.is_ring())
    fail_arg("hybrid context parallelism runs self-attention (kv_len = q_len, no q_offset); decode runs on the ring's "
             "KV split (run_attention)");
  if (p.q_heads % U != 0 || p.kv_heads % U != 0)
    fail_arg("hybrid context parallelism over groups of {} ranks: q_heads {} and kv_heads {} must both divide by {} "
             "(each rank of a group attends q_heads / {} and kv_heads / {} of them)", U, p.q_heads, p.kv_heads, U, U, U);
  if (b.device_memory())
    fail_arg("hybrid context parallelism moves host memory only for now: a backend with device memory ({}) is "
             "refused; run it on CPU ranks", b.name());
  const int64_t n = group_shard(p, g, G).tokens();
  std::vector<int64_t> at(size_t(U) + 1);
  for (int w = 0; w <= U; ++w) at[size_t(w)] = piece_begin(n, w, U);
  const int64_t mine = at[size_t(u) + 1] - at[size_t(u)];
  if (opt.check_agreement) agree_on_hybrid(p, local_problem(p, x, mine), group, ring);

  // The first all-to-all: to rank w of the group, this rank's rows of w's heads of q, k and v.
  const int64_t B = p.batch, D = p.head_dim, hq = p.q_heads / U, hk = p.kv_heads / U;
  const size_t es = dtype_size(p.dtype);
  std::vector<size_t> send_n(static_cast<size_t>(U)), recv_n(static_cast<size_t>(U));
  for (int w = 0; w < U; ++w) {
    send_n[size_t(w)] = size_t(B * (hq + 2 * hk) * mine * D) * es;
    recv_n[size_t(w)] = size_t(B * (hq + 2 * hk) * (at[size_t(w) + 1] - at[size_t(w)]) * D) * es;
  }
  std::vector<char> send(std::max<size_t>(1, size_t(B * (p.q_heads + 2 * p.kv_heads) * mine * D) * es));
  std::vector<char> recv(std::max<size_t>(1, size_t(B * (hq + 2 * hk) * n * D) * es));
  char* to = send.data();
  for (int w = 0; w < U; ++w) {
    to = pack(x.q, w * hq, hq, 0, mine, to);
    to = pack(x.k, w * hk, hk, 0, mine, to);
    to = pack(x.v, w * hk, hk, 0, mine, to);
  }
  group.alltoall(send.data(), send_n, recv.data(), recv_n);

  // The group's tokens of this rank's heads, in the ring shard's row order, and the ring over them.
  std::vector<char> qg(std::max<size_t>(1, size_t(B * hq * n * D) * es)), og(qg.size()),
      kg(std::max<size_t>(1, size_t(B * hk * n * D) * es)), vg(kg.size());
  std::vector<float> lg(std::max<size_t>(1, size_t(B * hq * n)));
  const TensorView Q = bhtd_view(qg.data(), p.dtype, B, hq, n, D), K = bhtd_view(kg.data(), p.dtype, B, hk, n, D),
                   V = bhtd_view(vg.data(), p.dtype, B, hk, n, D), O = bhtd_view(og.data(), p.dtype, B, hq, n, D);
  const char* from = recv.data();
  for (int w = 0; w < U; ++w) {
    const int64_t r0 = at[size_t(w)], rn = at[size_t(w) + 1] - r0;
    from = unpack(unpack(unpack(from, Q, 0, hq, r0, rn), K, 0, hk, r0, rn), V, 0, hk, r0, rn);
  }
  GlobalProblem sub = p;
  sub.q_heads = hq;
  sub.kv_heads = hk;
  const RankStats st = run_ring_attention(sub, LocalTensors{Q, K, V, O, lg.data()}, b, ring, opt);

  // The second all-to-all: to rank w, its rows of this rank's heads of out and lse; from rank v,
  // this rank's rows of v's heads.
  const TensorView L = bhtd_view(lg.data(), DType::F32, B, hq, n, 1);
  for (int w = 0; w < U; ++w) {
    const int64_t rows = at[size_t(w) + 1] - at[size_t(w)];
    send_n[size_t(w)] = size_t(B * hq * rows) * (size_t(D) * es + sizeof(float));
    recv_n[size_t(w)] = size_t(B * hq * mine) * (size_t(D) * es + sizeof(float));
  }
  send.assign(std::max<size_t>(1, size_t(B * hq * n) * (size_t(D) * es + sizeof(float))), 0);
  recv.assign(std::max<size_t>(1, size_t(B * p.q_heads * mine) * (size_t(D) * es + sizeof(float))), 0);
  to = send.data();
  for (int w = 0; w < U; ++w) {
    const int64_t r0 = at[size_t(w)], rn = at[size_t(w) + 1] - r0;
    to = pack(L, 0, hq, r0, rn, pack(O, 0, hq, r0, rn, to));
  }
  group.alltoall(send.data(), send_n, recv.data(), recv_n);
  std::vector<float> lse_rows(std::max<size_t>(1, size_t(B * p.q_heads * mine)));
  const TensorView Lx = bhtd_view(x.lse != nullptr ? x.lse : lse_rows.data(), DType::F32, B, p.q_heads, mine, 1);
  from = recv.data();
  for (int v = 0; v < U; ++v) from = unpack(unpack(from, x.out, v * hq, hq, 0, mine), Lx, v * hq, hq, 0, mine);
  return st;
}

}  // namespace ringattn
