#include "runner/ring/hybrid.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "runner/problem/agree.hpp"
#include "runner/ring/ring_buffers.hpp"
#include "runner/ring/ring_plan.hpp"

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

// A tensor the all-to-alls move: this rank's rows with every head, and the group's rows (every
// rank's piece, in the group shard's row order) with this rank's block of heads (group.heads of
// them: block u of rows.heads = U * group.heads).
struct Moved {
  TensorView rows, group;
};

enum class Toward { Group, Rows };

// One all-to-all over `group` moving every tensor of `m`: toward the group, to rank w its rows of
// w's heads (received: w's rows of this rank's heads, at rows [at[w], at[w + 1]) of m.group);
// toward the rows, the inverse. Adds its bytes to the other ranks and its time to `st`.
void exchange(const std::vector<Moved>& m, const std::vector<int64_t>& at, Transport& group, Toward dir,
              RankStats& st) {
  const auto t0 = std::chrono::steady_clock::now();
  const int U = group.size(), u = group.rank();
  const int64_t mine = at[size_t(u) + 1] - at[size_t(u)];
  std::vector<size_t> to_group(size_t(U), 0), to_rows(size_t(U), 0);  // bytes to or from rank w
  for (int w = 0; w < U; ++w)
    for (const Moved& t : m) {
      const size_t one = size_t(t.group.batch * t.group.heads * t.group.dim) * dtype_size(t.group.dtype);
      to_group[size_t(w)] += one * size_t(mine);
      to_rows[size_t(w)] += one * size_t(at[size_t(w) + 1] - at[size_t(w)]);
    }
  const bool out = dir == Toward::Group;
  const std::vector<size_t>& send_n = out ? to_group : to_rows;
  const std::vector<size_t>& recv_n = out ? to_rows : to_group;
  const auto total = [](const std::vector<size_t>& n) { return std::max<size_t>(1, std::accumulate(n.begin(), n.end(), size_t(0))); };
  std::vector<char> send(total(send_n)), recv(total(recv_n));
  char* to = send.data();
  const char* from = recv.data();
  for (int w = 0; w < U; ++w)
    for (const Moved& t : m) {
      const int64_t h = t.group.heads, r0 = at[size_t(w)], rn = at[size_t(w) + 1] - r0;
      to = out ? pack(t.rows, w * h, h, 0, mine, to) : pack(t.group, 0, h, r0, rn, to);
    }
  group.alltoall(send.data(), send_n, recv.data(), recv_n);
  for (int w = 0; w < U; ++w)
    for (const Moved& t : m) {
      const int64_t h = t.group.heads, r0 = at[size_t(w)], rn = at[size_t(w) + 1] - r0;
      from = out ? unpack(from, t.group, 0, h, r0, rn) : unpack(from, t.rows, w * h, h, 0, mine);
    }
  const uint64_t sent = std::accumulate(send_n.begin(), send_n.end(), uint64_t(0)) - send_n[size_t(u)];
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.group_bytes_sent += sent;
  st.bytes_sent += sent;
  st.group_s += s;
  st.exposed_comm_s += s;
  st.total_s += s;
}

// Host tensors of the group's rows, this rank's heads: owned storage and their views.
struct GroupTensors {
  std::vector<std::vector<char>> store;
  TensorView add(DType dtype, int64_t batch, int64_t heads, int64_t rows, int64_t dim) {
    store.emplace_back(std::max<size_t>(1, size_t(batch * heads * rows * dim) * dtype_size(dtype)));
    return bhtd_view(store.back().data(), dtype, batch, heads, rows, dim);
  }
};

// What this rank refuses on its own (its tensors and, for a backward, its dK/dV ring), "" when
// nothing: the shapes and dtypes run_ring_attention and run_attention_backward check, for the
// rows of the hybrid layout.
std::string local_problem(const GlobalProblem& p, const LocalTensors& x, const BackwardTensors* g, int64_t rows,
                          Transport& ring, const Transport* grad_ring) {
  const DType out = p.resolved_out_dtype();
  std::vector<std::tuple<const char*, const TensorView*, int64_t, DType>> views = {
      {"q", &x.q, p.q_heads, p.dtype}, {"k", &x.k, p.kv_heads, p.dtype}, {"v", &x.v, p.kv_heads, p.dtype},
      {"out", &x.out, p.q_heads, out}};
  if (g != nullptr)
    views.insert(views.end(), {{"dout", &g->dout, p.q_heads, out}, {"dq", &g->dq, p.q_heads, DType::F32},
                               {"dk", &g->dk, p.kv_heads, DType::F32}, {"dv", &g->dv, p.kv_heads, DType::F32}});
  for (const auto& [what, v, heads, dtype] : views)
    if (std::string e = check_view(what, *v, p.batch, heads, rows, p.head_dim, dtype); !e.empty()) return e;
  if (g == nullptr) return "";
  if (x.lse == nullptr && rows > 0) return "the backward needs the forward's lse (LocalTensors::lse is null)";
  if (grad_ring->size() != ring.size() || grad_ring->rank() != ring.rank() || (ring.size() > 1 && grad_ring == &ring))
    return fmt::format("the dK/dV ring is rank {} of {}{} but the ring rank {} of {}: pass a second transport over the "
                       "same ranks as the ring", grad_ring->rank(), grad_ring->size(),
                       grad_ring == &ring ? " (the ring itself)" : "", ring.rank(), ring.size());
  return "";
}

// Both agreements, the group's and then the ring's carrying the group's verdict ("in group G,
// rank U: ..."): every ring holds one rank of every group, so a group that stops stops every rank,
// with the same text.
void agree_on_hybrid(const GlobalProblem& p, const std::string& error, bool backward, Transport& group,
                     Transport& ring) {
  constexpr std::string_view kStopped = "ranks stopped before the first hop: ";  // agree_on_run's
  LocalVerdict mine;
  mine.error = error;
  mine.backward = backward;
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

// The checks every hybrid run makes before it moves anything, and where each rank's piece of its
// group's rows begins (at[w], w = 0 .. U; this rank's piece is [at[u], at[u + 1])).
std::vector<int64_t> begin_hybrid(const GlobalProblem& p, const LocalTensors& x, const BackwardTensors* g, Backend& b,
                                  Transport& group, Transport& ring, const Transport* grad_ring,
                                  const RunOptions& opt) {
  const int U = group.size(), u = group.rank();
  if (!p.is_ring())
    fail_arg("hybrid context parallelism runs self-attention (kv_len = q_len, no q_offset); decode runs on the ring's "
             "KV split (run_attention)");
  if (p.q_heads % U != 0 || p.kv_heads % U != 0)
    fail_arg("hybrid context parallelism over groups of {} ranks: q_heads {} and kv_heads {} must both divide by {} "
             "(each rank of a group attends q_heads / {} and kv_heads / {} of them)", U, p.q_heads, p.kv_heads, U, U, U);
  if (b.device_memory())
    fail_arg("hybrid context parallelism moves host memory only for now: a backend with device memory ({}) is "
             "refused; run it on CPU ranks", b.name());
  const int64_t n = group_shard(p, ring.rank(), ring.size()).tokens();
  std::vector<int64_t> at(size_t(U) + 1);
  for (int w = 0; w <= U; ++w) at[size_t(w)] = piece_begin(n, w, U);
  const std::string error = local_problem(p, x, g, at[size_t(u) + 1] - at[size_t(u)], ring, grad_ring);
  if (opt.check_agreement) agree_on_hybrid(p, error, g != nullptr, group, ring);
  else if (!error.empty()) fail_arg("rank {}: {}", group.rank(), error);
  return at;
}

// The first all-to-all's counts (`a`, measured before the ring's stats existed) added to `st`.
void add_group(RankStats& st, const RankStats& a) {
  st.group_bytes_sent += a.group_bytes_sent;
  st.bytes_sent += a.bytes_sent;
  st.group_s += a.group_s;
  st.exposed_comm_s += a.exposed_comm_s;
  st.total_s += a.total_s;
}

// The problem one rank of a group attends after the first all-to-all: its block of heads.
GlobalProblem heads_block(const GlobalProblem& p, int U) {
  GlobalProblem sub = p;
  sub.q_heads = p.q_heads / U;
  sub.kv_heads = p.kv_heads / U;
  return sub;
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

std::vector<HybridBytes> hybrid_bytes(const GlobalProblem& p, int group_size, int world, bool backward) {
  hybrid_layout(p, group_size, 0, world);  // the group size's refusal
  const int U = group_size, G = world / U;
  if (p.q_heads % U != 0 || p.kv_heads % U != 0)
    fail_arg("groups of {} ranks: q_heads {} and kv_heads {} must both divide by {}", U, p.q_heads, p.kv_heads, U);
  const GlobalProblem sub = heads_block(p, U);
  const RingPlan plan = ring_plan(sub, G);
  const uint64_t B = uint64_t(p.batch), D = uint64_t(p.head_dim), hq = uint64_t(sub.q_heads),
                 hk = uint64_t(sub.kv_heads), es = dtype_size(p.dtype), eo = dtype_size(p.resolved_out_dtype());
  // Bytes of one row of every moved tensor toward the group (this rank's heads block of each) and
  // back toward the rows: the tensors exchange() moves in each run.
  const uint64_t to_group = backward ? B * (D * (hq * es + 2 * hk * es + 2 * hq * eo) + hq * 4) : B * D * (hq + 2 * hk) * es;
  const uint64_t to_rows = backward ? B * D * 4 * (hq + 2 * hk) : B * hq * (D * eo + 4);
  std::vector<HybridBytes> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const int g = r / U, u = r % U;
    const int64_t n = group_shard(p, g, G).tokens(), mine = piece_begin(n, u + 1, U) - piece_begin(n, u, U);
    out[size_t(r)].group = uint64_t(U - 1) * uint64_t(mine) * to_group + uint64_t(n - mine) * to_rows;
    out[size_t(r)].ring = backward ? plan.backward_bytes(g) : plan.ring_bytes(g);
  }
  return out;
}

RankStats run_hybrid_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& group,
                               Transport& ring, const RunOptions& opt) {
  const std::vector<int64_t> at = begin_hybrid(p, x, nullptr, b, group, ring, nullptr, opt);
  const GlobalProblem sub = heads_block(p, group.size());
  const int64_t B = p.batch, D = p.head_dim, n = at.back(), hq = sub.q_heads, hk = sub.kv_heads;
  GroupTensors t;
  const TensorView Q = t.add(p.dtype, B, hq, n, D), K = t.add(p.dtype, B, hk, n, D), V = t.add(p.dtype, B, hk, n, D),
                   O = t.add(p.resolved_out_dtype(), B, hq, n, D), L = t.add(DType::F32, B, hq, n, 1);
  RankStats before;
  exchange({{x.q, Q}, {x.k, K}, {x.v, V}}, at, group, Toward::Group, before);
  RankStats st = run_ring_attention(sub, LocalTensors{Q, K, V, O, static_cast<float*>(L.data)}, b, ring, opt);
  add_group(st, before);
  const int64_t mine = x.q.len;
  std::vector<float> lse_rows(x.lse != nullptr ? 0 : std::max<size_t>(1, size_t(B * p.q_heads * mine)));
  const TensorView Lx = bhtd_view(x.lse != nullptr ? x.lse : lse_rows.data(), DType::F32, B, p.q_heads, mine, 1);
  exchange({{x.out, O}, {Lx, L}}, at, group, Toward::Rows, st);
  return st;
}

RankStats run_hybrid_attention_backward(const GlobalProblem& p, const LocalTensors& x, const BackwardTensors& g,
                                        Backend& b, Transport& group, Transport& ring, Transport& grad_ring,
                                        const RunOptions& opt) {
  const std::vector<int64_t> at = begin_hybrid(p, x, &g, b, group, ring, &grad_ring, opt);
  const GlobalProblem sub = heads_block(p, group.size());
  const int64_t B = p.batch, D = p.head_dim, n = at.back(), hq = sub.q_heads, hk = sub.kv_heads;
  const DType out = p.resolved_out_dtype();
  GroupTensors t;
  const TensorView Q = t.add(p.dtype, B, hq, n, D), K = t.add(p.dtype, B, hk, n, D), V = t.add(p.dtype, B, hk, n, D),
                   O = t.add(out, B, hq, n, D), L = t.add(DType::F32, B, hq, n, 1), dO = t.add(out, B, hq, n, D),
                   dQ = t.add(DType::F32, B, hq, n, D), dK = t.add(DType::F32, B, hk, n, D),
                   dV = t.add(DType::F32, B, hk, n, D);
  const TensorView Lx = bhtd_view(x.lse, DType::F32, B, p.q_heads, x.q.len, 1);
  RankStats before;
  exchange({{x.q, Q}, {x.k, K}, {x.v, V}, {x.out, O}, {Lx, L}, {g.dout, dO}}, at, group, Toward::Group, before);
  RankStats st = run_attention_backward(sub, LocalTensors{Q, K, V, O, static_cast<float*>(L.data)},
                                        BackwardTensors{dO, dQ, dK, dV}, b, ring, grad_ring, opt);
  add_group(st, before);
  exchange({{g.dq, dQ}, {g.dk, dK}, {g.dv, dV}}, at, group, Toward::Rows, st);
  return st;
}

}  // namespace ringattn
