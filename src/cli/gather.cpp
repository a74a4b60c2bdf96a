#include "cli/gather.hpp"

#include <algorithm>
#include <memory>

#include <spdlog/spdlog.h>

#include "cli/world.hpp"
#include "ringattn/npy.hpp"

namespace ringattn::cli {

int write_global_outputs(const GlobalProblem& p, const LocalProblem& l, const HostResult& r, Transport& t,
                         const std::string& out_file, const std::string& lse_file, bool thd) {
  if (out_file.empty() && lse_file.empty()) return 0;
  const int P = t.size(), me = t.rank();
  const int64_t B = p.batch, H = p.q_heads, T = p.q_len, D = p.head_dim, tq = l.q_layout.tokens();
  std::unique_ptr<NpyWriter> out, lse;
  int code = 0;
  if (me == 0) {
    try {
      const std::vector<int64_t> o_shape = thd ? std::vector<int64_t>{T, H, D} : std::vector<int64_t>{B, H, T, D};
      const std::vector<int64_t> l_shape = thd ? std::vector<int64_t>{T, H} : std::vector<int64_t>{B, H, T};
      if (!out_file.empty()) out = std::make_unique<NpyWriter>(out_file, o_shape, DType::F32);
      if (!lse_file.empty()) lse = std::make_unique<NpyWriter>(lse_file, l_shape, DType::F32);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      code = 1;
    }
  }
  if (agree_exit_code(t, code) != 0) return 1;

  // Decode problems hold every query on every rank already; the ring spreads them by layout.
  const bool spread = p.is_ring() && P > 1;
  std::vector<ShardLayout> layouts(static_cast<size_t>(P));
  for (int q = 0; q < P; ++q) {
    ShardLayout kv;
    layouts_for(p, q, P, layouts[size_t(q)], kv);
  }
  // One (batch, head) at a time: the rows of o and lse of every rank, converted to fp32, each
  // rank's part padded to the largest shard (shards may differ by a token or two): o rows first,
  // then lse.
  int64_t tmax = tq;
  for (const ShardLayout& l : layouts) tmax = std::max(tmax, l.tokens());
  const int64_t per_rank = tmax * D + tmax;
  std::vector<float> mine(static_cast<size_t>(per_rank)), all(spread ? static_cast<size_t>(per_rank * P) : 0),
      o_row(static_cast<size_t>(T * D)), l_row(static_cast<size_t>(T));
  // Only rank 0 writes; a write error stops its writing but not its part in the gathers, so the
  // other ranks never wait for a partner that left.
  auto guarded = [&](auto&& fn) {
    if (code != 0) return;
    try {
      fn();
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      code = 1;
    }
  };
  if (!spread && me != 0) return agree_exit_code(t, code);
  // The packed layout interleaves the heads of a token: rank 0 assembles it whole (batch 1).
  std::vector<float> o_thd(thd && me == 0 && out ? size_t(T * H * D) : 0), l_thd(thd && me == 0 && lse ? size_t(T * H) : 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t o0 = (b * H + h) * tq * D, l0 = (b * H + h) * tq;
      for (int64_t i = 0; i < tq * D; ++i) mine[size_t(i)] = load_as_float(r.out.data(), p.dtype, o0 + i);
      for (int64_t i = 0; i < tq; ++i) mine[size_t(tmax * D + i)] = r.lse[size_t(l0 + i)];
      const float* src = mine.data();
      if (spread) t.allgather(mine.data(), all.data(), size_t(per_rank) * sizeof(float));
      if (me != 0) continue;
      for (int q = 0; q < (spread ? P : 1); ++q) {
        if (spread) src = all.data() + q * per_rank;
        const ShardLayout& lq = layouts[size_t(q)];
        for (int64_t i = 0; i < lq.tokens(); ++i) {
          const int64_t g = lq.global_position(i);
          std::copy_n(src + i * D, D, o_row.data() + g * D);
          l_row[size_t(g)] = src[tmax * D + i];
        }
      }
      if (thd) {
        for (int64_t g = 0; g < T && !o_thd.empty(); ++g) std::copy_n(o_row.data() + g * D, D, o_thd.data() + (g * H + h) * D);
        for (int64_t g = 0; g < T && !l_thd.empty(); ++g) l_thd[size_t(g * H + h)] = l_row[size_t(g)];
        continue;
      }
      guarded([&] {
        if (out) out->write(o_row.data(), T * D);
        if (lse) lse->write(l_row.data(), T);
      });
    }
  if (thd && me == 0)
    guarded([&] {
      if (out) out->write(o_thd.data(), T * H * D);
      if (lse) lse->write(l_thd.data(), T * H);
    });
  // Both files finished before either is moved into place: a failure leaves neither half-made.
  guarded([&] {
    if (out) out->finish();
    if (lse) lse->finish();
    if (out) out->close();
    if (lse) lse->close();
  });
  return agree_exit_code(t, code);
}

std::vector<float> gather_rows(Transport& t, const std::vector<ShardLayout>& layouts, int64_t bh, int64_t len,
                               int64_t width, const float* mine) {
  const int P = t.size(), me = t.rank();
  int64_t tmax = 0;
  for (const ShardLayout& l : layouts) tmax = std::max(tmax, l.tokens());
  const int64_t mt = layouts[size_t(me)].tokens(), per_rank = bh * tmax * width;
  std::vector<float> padded(size_t(std::max<int64_t>(per_rank, 1)), 0.0f);
  for (int64_t i = 0; i < bh; ++i) std::copy_n(mine + i * mt * width, mt * width, padded.data() + i * tmax * width);
  std::vector<float> all;
  if (P > 1) {
    all.resize(size_t(std::max<int64_t>(per_rank, 1)) * size_t(P));
    t.allgather(padded.data(), all.data(), size_t(std::max<int64_t>(per_rank, 1)) * sizeof(float));
  } else {
    all.swap(padded);
  }
  if (me != 0) return {};
  std::vector<float> g(size_t(bh * len * width), 0.0f);
  const size_t stride = size_t(std::max<int64_t>(per_rank, 1));
  for (int q = 0; q < P; ++q) {
    const ShardLayout& lq = layouts[size_t(q)];
    const float* src = all.data() + size_t(q) * stride;
    for (int64_t i = 0; i < bh; ++i)
      for (int64_t r = 0; r < lq.tokens(); ++r)
        std::copy_n(src + (i * tmax + r) * width, width, g.data() + (i * len + lq.global_position(r)) * width);
  }
  return g;
}

std::vector<ShardLayout> all_layouts(const GlobalProblem& p, int world, bool kv) {
  std::vector<ShardLayout> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    ShardLayout q, k;
    layouts_for(p, r, world, q, k);
    out[size_t(r)] = kv ? k : q;
  }
  return out;
}

}  // namespace ringattn::cli
