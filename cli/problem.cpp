#include "cli/problem.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <random>
#include <tuple>
#include <cerrno>
#include <cstring>
#include <limits>

#include "cli/context_parallel.hpp"
#include "core/mask.hpp"
#include "core/error.hpp"
#include "runner/io/npy.hpp"
#include "runner/ring/hybrid.hpp"
#include "runner/ring/ring_plan.hpp"

namespace ringattn::cli {
namespace {

// The layout of the input files: a three-dimensional --q is the packed thd layout (all three
// files in it, with documents, and no --layout, which is about four-dimensional files); else
// --layout.
FileLayout input_layout(const ProblemOptions& o, const NpyHeader& hq, const NpyHeader& hk, const NpyHeader& hv) {
  if (hq.shape.size() != 3) return parse_file_layout(o.layout);
  if (!o.layout.empty())
    fail_arg("--layout {} is about four-dimensional files, but --q {} holds shape {}, the packed layout "
             "[total_tokens, heads, dim], which is read as such: drop --layout", o.layout, o.q_file,
             hq.shape_string());
  for (const auto& [h, flag, path] : {std::tuple{&hk, "--k", &o.k_file}, std::tuple{&hv, "--v", &o.v_file}})
    if (h->shape.size() != 3)
      fail_arg("{} {}: holds shape {}, but --q is three-dimensional (the packed layout [total_tokens, heads, dim]): "
               "give all three files in it", flag, *path, h->shape_string());
  if (o.doc_lens.empty() && o.cu_seqlens_file.empty())
    fail_arg("--q {} is three-dimensional, the packed layout [total_tokens, heads, dim] of documents: give their "
             "boundaries with --cu-seqlens (or their lengths with --doc-lens)", o.q_file);
  return FileLayout::Thd;
}

// What a path that is not a regular file is, in words ("a FIFO").
const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

void expect_regular_file(const char* flag, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail_arg("{}: cannot open '{}' for reading: {}", flag, path, std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    fail_arg("{} '{}' is not a regular file ({}); give a .npy file", flag, path, file_kind(st.st_mode));
}

InputSource::InputSource(const std::string& q, const std::string& k, const std::string& v, FileLayout layout)
    : layout_(layout) {
  readers_.push_back(std::make_unique<NpyReader>(q));
  readers_.push_back(std::make_unique<NpyReader>(k));
  readers_.push_back(std::make_unique<NpyReader>(v));
}

void InputSource::rows(InputTensor which, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t heads, int64_t len,
                       int64_t dim, void* dst, DType dtype) {
  if (from_files()) {
    NpyReader& r = *readers_[size_t(which) - 1];
    if (token_stride(layout_, heads, dim) == dim) {  // bhsd: the rows of one head lie together
      r.read(row_offset(layout_, b, h, t0, heads, len, dim), n * dim, dst, dtype);
      return;
    }
    // bshd, thd: the rows of one head are strided; read spans of whole tokens (all heads) and
    // keep head h (the file is read once per head: fine for the sizes of a check or a shard, not
    // a streaming path).
    const int64_t span = std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(1, heads * dim));
    const size_t es = size_t(dtype_size(dtype));
    std::vector<uint8_t> buf;
    for (int64_t i0 = 0; i0 < n; i0 += span) {
      const int64_t m = std::min(span, n - i0);
      buf.resize(size_t(m * heads * dim) * es);
      r.read(row_offset(layout_, b, 0, t0 + i0, heads, len, dim), m * heads * dim, buf.data(), dtype);
      for (int64_t i = 0; i < m; ++i)
        std::copy_n(buf.data() + size_t((i * heads + h) * dim) * es, size_t(dim) * es,
                    static_cast<uint8_t*>(dst) + size_t((i0 + i) * dim) * es);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < dim; ++d) store_from_float(dst, dtype, i * dim + d, input_value(seed_, which, b, h, t0 + i, d));
}

void InputSource::fill(InputTensor which, const TensorView& x, const ShardLayout& layout, int64_t global_len) {
  for (size_t s = 0; s < layout.segments.size(); ++s) {
    const Segment& seg = layout.segments[s];
    const TensorView part = x.rows(layout.first_row(s), seg.len);
    if (!from_files()) {
      fill_input(part, seed_, which, seg.start, seg.stride);
      continue;
    }
    const int esize = dtype_size(x.dtype);
    std::vector<uint8_t> span;
    for (int64_t b = 0; b < x.batch; ++b)
      for (int64_t h = 0; h < x.heads; ++h) {
        auto* base = static_cast<uint8_t*>(part.data) + part.offset(b, h, 0) * esize;
        if (seg.stride == 1 && part.stride_t == part.dim) {
          rows(which, b, h, seg.start, seg.len, x.heads, global_len, x.dim, base, x.dtype);
          continue;
        }
        // Strided shards: read spans of consecutive global rows and keep every stride-th one.
        const int64_t chunk = std::max<int64_t>(1, 4096 / seg.stride) * seg.stride;
        for (int64_t i0 = 0; i0 < seg.len;) {
          const int64_t take = std::min(seg.len - i0, chunk / seg.stride);
          const int64_t first = seg.position(i0), count = (take - 1) * seg.stride + 1;
          span.resize(size_t(count * x.dim * esize));
          rows(which, b, h, first, count, x.heads, global_len, x.dim, span.data(), x.dtype);
          for (int64_t i = 0; i < take; ++i)
            std::copy_n(span.data() + i * seg.stride * x.dim * esize, x.dim * esize, base + (i0 + i) * part.stride_t * esize);
          i0 += take;
        }
      }
  }
}

DType default_dtype(const ProblemOptions& o) { return o.device == "cuda" ? DType::BF16 : DType::F32; }

Window parse_window(const std::string& text) {
  if (text.empty()) return {};
  const size_t comma = text.find(',');
  int64_t side[2] = {0, 0};
  const std::string parts[2] = {text.substr(0, comma), comma == std::string::npos ? "" : text.substr(comma + 1)};
  for (int i = 0; i < 2; ++i) {
    const std::string& s = parts[i];
    const char* first = s.data();
    const auto [end, ec] = std::from_chars(first, first + s.size(), side[i]);
    if (comma != std::string::npos && ec == std::errc::result_out_of_range && end == first + s.size())
      fail_arg("--window '{}': the {} side {} is out of range: each side is -1 (unbounded) or 0 to {} tokens", text,
               i == 0 ? "left" : "right", s, std::numeric_limits<int64_t>::max());
    if (comma == std::string::npos || s.empty() || ec != std::errc() || end != first + s.size() || side[i] < -1)
      fail_arg("--window '{}' is not understood: give LEFT,RIGHT, each -1 (unbounded) or a number of tokens >= 0 "
               "(e.g. --window 4096,0)", text);
  }
  return {side[0], side[1]};
}

// The document lengths of --doc-lens or --cu-seqlens (empty when neither is given). The sum is
// checked against the sequence by validate_problem.
std::vector<int64_t> parse_doc_lens(const std::string& text) {
  std::vector<int64_t> lens;
  for (size_t at = 0; !text.empty();) {
    const size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || n < 1)
      fail_arg("--doc-lens '{}': document {} is '{}', but every length must be a decimal integer >= 1 (e.g. "
               "--doc-lens 1000,3000,517)", text, lens.size(), item);
    lens.push_back(n);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return lens;
}

std::vector<int64_t> document_lengths(const ProblemOptions& o) {
  std::vector<int64_t> lens;
  if (!o.doc_lens.empty()) {
    lens = parse_doc_lens(o.doc_lens);
  } else if (!o.cu_seqlens_file.empty()) {
    expect_regular_file("--cu-seqlens", o.cu_seqlens_file);
    const std::vector<int64_t> cu = read_npy_int_vector(o.cu_seqlens_file);
    if (cu.size() < 2 || cu[0] != 0)
      fail_arg("--cu-seqlens {}: boundaries must start at 0 and hold at least two values (got {} value(s){})",
               o.cu_seqlens_file, cu.size(), cu.empty() ? "" : fmt::format(", the first {}", cu[0]));
    for (size_t i = 1; i < cu.size(); ++i) {
      if (cu[i] <= cu[i - 1])
        fail_arg("--cu-seqlens {}: boundaries must increase, but value {} is {} after {} (an empty or negative "
                 "document)", o.cu_seqlens_file, i, cu[i], cu[i - 1]);
      lens.push_back(cu[i] - cu[i - 1]);
    }
  }
  return lens;
}

std::vector<int64_t> generate_documents(const std::string& spec, int64_t n, uint64_t seed) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  int64_t len = 0;
  const auto [end, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), len);
  if ((kind != "uniform" && kind != "fixed") || arg.empty() || ec != std::errc() || end != arg.data() + arg.size() ||
      len < 1)
    fail_arg("--docs '{}' is not understood: allowed are uniform:MAX and fixed:L with a decimal length >= 1 (e.g. "
             "--docs uniform:16384)", spec);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + uint64_t(n));
  std::vector<int64_t> lens;
  for (int64_t left = n; left > 0;) {
    const int64_t d = kind == "fixed" ? len : 1 + int64_t(rng() % uint64_t(len));
    lens.push_back(std::min(d, left));
    left -= lens.back();
  }
  return lens;
}

std::vector<OraclePart> oracle_parts(const GlobalProblem& p) {
  const std::vector<int64_t> bounds = p.doc_bounds();
  if (bounds.size() < 2) return {{0, p.q_len, p.mask()}};
  std::vector<OraclePart> parts;
  for (size_t i = 0; i + 1 < bounds.size(); ++i)
    parts.push_back({bounds[i], bounds[i + 1] - bounds[i], band_mask(p.causal, p.window, 0, 1)});
  return parts;
}

std::optional<RingPlan> plan_ring(const ProblemOptions& o, GlobalProblem& p, int world, int rank) {
  if (!p.is_ring() && o.shard != "auto")
    fail_arg("--shard {}: a decode (q_len {}, kv_len {}, q_offset {}) has no query sharding: every rank holds "
             "every query and a contiguous part of the keys; drop --shard", o.shard, p.q_len, p.kv_len,
             p.resolved_q_offset());
  if (!p.is_ring()) return std::nullopt;
  if (o.shard != "auto") return ring_plan(p, world, rank);
  std::vector<RingPlan> candidates = candidate_plans(p, world, rank);
  const int best = best_of(candidates, !p.window.none());
  p.sharding = kAutoOrder[best];
  return std::move(candidates[size_t(best)]);
}

namespace {

// The problem's shapes and dtype from the headers of --q/--k/--v, read in their layout, and the
// source of their rows. Errors name the files, the axes of the layout and the shapes they hold.
void problem_from_files(const ProblemOptions& o, ProblemSetup& s) {
  expect_regular_file("--q", o.q_file);
  expect_regular_file("--k", o.k_file);
  expect_regular_file("--v", o.v_file);
  const NpyHeader hq = read_npy_header(o.q_file), hk = read_npy_header(o.k_file), hv = read_npy_header(o.v_file);
  const FileLayout l = s.layout = input_layout(o, hq, hk, hv);
  s.source = std::make_unique<InputSource>(o.q_file, o.k_file, o.v_file, l);
  const FileDims q = file_dims(hq, l, "--q", o.q_file, "heads", "q_len");
  const FileDims k = file_dims(hk, l, "--k", o.k_file, "kv_heads", "kv_len");
  file_dims(hv, l, "--v", o.v_file, "kv_heads", "kv_len");
  if (hk.shape != hv.shape)
    fail_arg("--k {} has shape {} but --v {} has shape {}; they must be equal", o.k_file, hk.shape_string(), o.v_file,
             hv.shape_string());
  const std::string read_as = fmt::format("read as {} and {} ({})", file_axes(l, "heads", "q_len"),
                                          file_axes(l, "kv_heads", "kv_len"), layout_phrase(l));
  if (q.batch != k.batch || q.dim != k.dim)
    fail_arg("--q {} has shape {} and --k {} has shape {}, {}: their batch and head dim must be equal", o.q_file,
             hq.shape_string(), o.k_file, hk.shape_string(), read_as);
  if (q.heads % k.heads != 0)
    fail_arg("--q {} has shape {} and --k {} has shape {}, {}: --q has {} heads and --k {}; query heads must be a "
             "multiple of key/value heads", o.q_file, hq.shape_string(), o.k_file, hk.shape_string(), read_as, q.heads,
             k.heads);
  GlobalProblem& p = s.problem;
  std::tie(p.batch, p.q_heads, p.q_len, p.head_dim, p.kv_heads, p.kv_len) =
      std::tuple{q.batch, q.heads, q.len, q.dim, k.heads, k.len};
  // Files of one dtype run in it (<f2: fp16) unless --dtype says otherwise; files of mixed
  // dtypes need --dtype, which names the conversion.
  if (o.dtype.empty() && (hq.dtype != hk.dtype || hq.dtype != hv.dtype))
    fail_arg("--q {} holds {}, --k {} holds {} and --v {} holds {}: give files of one dtype, or --dtype to convert "
             "them all", o.q_file, dtype_name(hq.dtype), o.k_file, dtype_name(hk.dtype), o.v_file,
             dtype_name(hv.dtype));
  const bool all_half = hq.dtype == DType::F16;
  p.dtype = !o.dtype.empty() ? parse_dtype(o.dtype) : all_half ? DType::F16 : default_dtype(o);
}

}  // namespace

ProblemSetup setup_problem(const ProblemOptions& o) {
  ProblemSetup s;
  GlobalProblem& p = s.problem;
  p.causal = o.causal;
  p.sharding = o.shard == "auto" ? Sharding::Zigzag : parse_sharding(o.shard);  // auto: plan_ring
  if (!o.from_files()) {
    p.batch = o.batch;
    p.q_heads = o.heads;
    p.kv_heads = o.kv_heads;
    p.q_len = o.seq;
    p.kv_len = o.kv_seq.value_or(o.seq);
    p.head_dim = o.dim;
    p.dtype = o.dtype.empty() ? default_dtype(o) : parse_dtype(o.dtype);
    s.source = std::make_unique<InputSource>(o.seed);
    s.layout = parse_file_layout(o.layout);  // of --out/--lse and the backward's files
  } else {
    problem_from_files(o, s);
  }
  if (o.q_offset) p.q_offset = *o.q_offset;
  p.doc_lens = document_lengths(o);
  p.window = parse_window(o.window);
  return s;
}

void layouts_for(const GlobalProblem& p, const RingPlan* ring, int rank, int world, ShardLayout& q_layout,
                 ShardLayout& kv_layout, int cp_group) {
  if (cp_group > 1) {
    q_layout = kv_layout = hybrid_layout(p, cp_group, rank, world);
  } else if (p.is_ring()) {
    if (ring == nullptr || ring->world() != world)
      fail_arg("the rows of rank {} of a ring problem over {} ranks come from its ring plan (none was made for {} "
               "ranks)", rank, world, world);
    q_layout = kv_layout = ring->layout(rank);
  } else {
    q_layout.segments = {Segment{0, p.q_len, 1}};
    kv_layout.segments = {kv_shard(p.kv_len, rank, world)};
  }
}

LocalProblem load_local(const GlobalProblem& p, const RingPlan* ring, InputSource& src, Backend& b, int rank,
                        int world, int cp_group) {
  LocalProblem l;
  layouts_for(p, ring, rank, world, l.q_layout, l.kv_layout, cp_group);
  l.ring = p.is_ring() && cp_group <= 1 ? ring : nullptr;
  l.cp_group = cp_group;
  const int64_t tq = l.q_layout.tokens(), tk = l.kv_layout.tokens();
  const int es = dtype_size(p.dtype);
  const size_t qn = size_t(p.batch * p.q_heads * tq * p.head_dim), kn = size_t(p.batch * p.kv_heads * tk * p.head_dim);
  l.q = DeviceBuffer(b, qn * es);
  l.k = DeviceBuffer(b, kn * es);
  l.v = DeviceBuffer(b, kn * es);
  l.out = DeviceBuffer(b, qn * es);
  l.lse = DeviceBuffer(b, size_t(p.batch * p.q_heads * tq) * sizeof(float));
  auto& x = l.views;
  x.q = bhtd_view(l.q.get(), p.dtype, p.batch, p.q_heads, tq, p.head_dim);
  x.k = bhtd_view(l.k.get(), p.dtype, p.batch, p.kv_heads, tk, p.head_dim);
  x.v = bhtd_view(l.v.get(), p.dtype, p.batch, p.kv_heads, tk, p.head_dim);
  x.out = bhtd_view(l.out.get(), p.dtype, p.batch, p.q_heads, tq, p.head_dim);
  x.lse = l.lse.as<float>();

  // Fill on the host; the CPU backend's buffers are host memory already.
  const bool staged = b.device_memory();
  std::vector<uint8_t> host;
  auto fill_one = [&](InputTensor which, const TensorView& dev, const ShardLayout& layout, int64_t len, size_t bytes) {
    TensorView hv = dev;
    if (staged) {
      host.resize(bytes);
      hv.data = host.data();
    }
    src.fill(which, hv, layout, len);
    if (staged) b.copy_from_host(dev.data, host.data(), bytes);
  };
  fill_one(InputTensor::Q, x.q, l.q_layout, p.q_len, qn * es);
  fill_one(InputTensor::K, x.k, l.kv_layout, p.kv_len, kn * es);
  fill_one(InputTensor::V, x.v, l.kv_layout, p.kv_len, kn * es);

  // NaN poison in the output dtype (0xFF bytes are NaN in fp32, fp16 and bf16 alike).
  std::vector<uint8_t> poison(std::max(qn * es, l.lse.bytes()), 0xFF);
  b.copy_from_host(l.out.get(), poison.data(), qn * es);
  b.copy_from_host(l.lse.get(), poison.data(), l.lse.bytes());
  b.synchronize();
  return l;
}

double visible_pairs(const GlobalProblem& p) {
  const int64_t T = p.q_len, S = p.kv_len;
  const std::vector<int64_t> bounds = p.doc_bounds();
  if (!bounds.empty()) return count_document_pairs<double>(documents_of(bounds), p.causal, p.window);
  return count_visible<double>(p.mask(), 0, T, S);
}

RankStats run_forward(const GlobalProblem& p, const LocalProblem& local, Backend& b, Transport& t,
                      const ringattn::RunOptions& ro) {
  if (local.cp_group > 1) {
    if (local.cp == nullptr) fail_arg("--cp groups of {} ranks: their transports are not split", local.cp_group);
    return run_hybrid_attention(p, local.views, b, *local.cp->group, *local.cp->ring, ro);
  }
  return local.ring ? run_ring_attention(p, *local.ring, local.views, b, t, ro)
                    : run_distributed_decode(p, local.views, b, t, ro);
}

double attention_flops(const GlobalProblem& p) {
  return 4.0 * double(p.batch) * double(p.q_heads) * double(p.head_dim) * visible_pairs(p);
}

}  // namespace ringattn::cli
