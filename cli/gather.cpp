#include "cli/gather.hpp"

#include <algorithm>
#include <memory>
#include <utility>

#include <spdlog/spdlog.h>

#include "cli/world.hpp"
#include "runner/io/npy.hpp"

namespace ringattn::cli {

namespace {

// Rank 0's --out and --lse files, in `layout`: they take the rows of one (batch, head) at a time
// in global token order. bhsd writes them at once; bshd and thd interleave the heads of a token,
// so a batch is assembled in memory ([len, heads, dim]) and written when its last head is in.
class OutputFiles {
 public:
  OutputFiles(FileLayout l, int64_t H, int64_t T, int64_t D) : l_(l), H_(H), T_(T), D_(D) {}

  // Throws on a file that cannot be created.
  void open(const std::string& out_file, const std::string& lse_file, int64_t B) {
    if (!out_file.empty()) out_ = std::make_unique<NpyWriter>(out_file, file_shape(l_, B, H_, T_, D_), DType::F32);
    if (!lse_file.empty()) lse_ = std::make_unique<NpyWriter>(lse_file, file_shape(l_, B, H_, T_), DType::F32);
    if (l_ == FileLayout::Bhsd) return;
    if (out_) o_batch_.resize(size_t(T_ * H_ * D_));
    if (lse_) l_batch_.resize(size_t(T_ * H_));
  }

  // Head h of the current batch: o [T, D], lse [T].
  void add(int64_t h, const float* o, const float* lse) {
    if (l_ == FileLayout::Bhsd) {
      if (out_) out_->write(o, T_ * D_);
      if (lse_) lse_->write(lse, T_);
      return;
    }
    for (int64_t t = 0; t < T_ && out_; ++t)
      std::copy_n(o + t * D_, D_, o_batch_.data() + row_offset(l_, 0, h, t, H_, T_, D_));
    for (int64_t t = 0; t < T_ && lse_; ++t) l_batch_[size_t(row_offset(l_, 0, h, t, H_, T_, 1))] = lse[t];
    if (h + 1 < H_) return;
    if (out_) out_->write(o_batch_.data(), T_ * H_ * D_);
    if (lse_) lse_->write(l_batch_.data(), T_ * H_);
  }

  // Both files finished and handed to `staged`, which moves them into place with the run's other
  // outputs: a failure leaves none half-made.
  void finish(FileSet& staged) {
    if (out_) staged.add(out_->release_finished());
    if (lse_) staged.add(lse_->release_finished());
  }

 private:
  FileLayout l_;
  int64_t H_, T_, D_;
  std::unique_ptr<NpyWriter> out_, lse_;
  std::vector<float> o_batch_, l_batch_;
};

// The rows of o and lse of (b, h) on every rank, in global token order on rank 0 (o_row [T, D],
// l_row [T]). Each rank's part, converted to fp32 and padded to the largest shard (shards may
// differ by a token or two), travels in one allgather when the queries are spread (`all`: its
// buffer); a decode holds every query on every rank already.
struct HeadGather {
  const GlobalProblem& p;
  std::vector<ShardLayout> layouts;  // every rank's query rows
  int64_t tmax;
  bool spread;
  std::vector<float> mine, all, o_row, l_row;

  HeadGather(const GlobalProblem& p_, std::vector<ShardLayout> ls, int64_t tq, bool spread_)
      : p(p_), layouts(std::move(ls)), tmax(tq), spread(spread_) {
    for (const ShardLayout& l : layouts) tmax = std::max(tmax, l.tokens());
    const int64_t per_rank = tmax * p.head_dim + tmax;
    mine.resize(size_t(per_rank));
    all.resize(spread ? size_t(per_rank) * layouts.size() : 0);
    o_row.resize(size_t(p.q_len * p.head_dim));
    l_row.resize(size_t(p.q_len));
  }

  void gather(Transport& t, const HostResult& r, int64_t b, int64_t h, int64_t tq) {
    const int64_t D = p.head_dim, o0 = (b * p.q_heads + h) * tq * D, l0 = (b * p.q_heads + h) * tq;
    for (int64_t i = 0; i < tq * D; ++i) mine[size_t(i)] = load_as_float(r.out.data(), p.dtype, o0 + i);
    for (int64_t i = 0; i < tq; ++i) mine[size_t(tmax * D + i)] = r.lse[size_t(l0 + i)];
    if (spread) t.allgather(mine.data(), all.data(), mine.size() * sizeof(float));
    if (t.rank() != 0) return;
    for (size_t q = 0; q < (spread ? layouts.size() : 1); ++q) {
      const float* src = spread ? all.data() + q * mine.size() : mine.data();
      const ShardLayout& lq = layouts[q];
      for (int64_t i = 0; i < lq.tokens(); ++i) {
        const int64_t g = lq.global_position(i);
        std::copy_n(src + i * D, D, o_row.data() + g * D);
        l_row[size_t(g)] = src[tmax * D + i];
      }
    }
  }
};

}  // namespace

int write_global_outputs(const GlobalProblem& p, const LocalProblem& l, const HostResult& r, Transport& t,
                         const std::string& out_file, const std::string& lse_file, FileLayout layout,
                         FileSet& staged) {
  if (out_file.empty() && lse_file.empty()) return 0;
  const int P = t.size(), me = t.rank();
  OutputFiles files(layout, p.q_heads, p.q_len, p.head_dim);
  int code = 0;
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
  if (me == 0) guarded([&] { files.open(out_file, lse_file, p.batch); });
  if (agree_exit_code(t, code) != 0) return 1;

  const bool spread = p.is_ring() && P > 1;
  if (!spread && me != 0) return agree_exit_code(t, code);
  HeadGather hg(p, all_layouts(p, l.ring, P, false, l.cp_group), l.q_layout.tokens(), spread);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h) {
      hg.gather(t, r, b, h, l.q_layout.tokens());
      if (me == 0) guarded([&] { files.add(h, hg.o_row.data(), hg.l_row.data()); });
    }
  if (me == 0) guarded([&] { files.finish(staged); });
  return agree_exit_code(t, code);
}

int commit_outputs(FileSet& staged) {
  try {
    staged.commit();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
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

std::vector<ShardLayout> all_layouts(const GlobalProblem& p, const RingPlan* ring, int world, bool kv,
                                     int cp_group) {
  if (p.is_ring() && ring != nullptr && cp_group <= 1) return ring->layouts();
  std::vector<ShardLayout> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    ShardLayout q, k;
    layouts_for(p, ring, r, world, q, k, cp_group);
    out[size_t(r)] = kv ? k : q;
  }
  return out;
}

}  // namespace ringattn::cli
