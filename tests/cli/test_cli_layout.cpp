// The file layouts of `run` (cli/file_layout.hpp): the element map of bhsd, bshd and thd against
// numpy's C order of their shapes, the header validation's messages, and --out/--lse written in
// each layout (write_global_outputs) as the transposes of the runtime's [batch, heads, len, dim].
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <random>

#include "cli/file_layout.hpp"
#include "cli/gather.hpp"
#include "common/test_util.hpp"
#include "core/error.hpp"

namespace ringattn::cli {
namespace {

// The C-order flat index of `idx` in an array of `shape`.
int64_t c_index(const std::vector<int64_t>& shape, const std::vector<int64_t>& idx) {
  int64_t i = 0;
  for (size_t a = 0; a < shape.size(); ++a) i = i * shape[a] + idx[a];
  return i;
}

// Element (b, h, t, d) of each layout's file, as numpy indexes it.
std::vector<int64_t> file_index(FileLayout l, int64_t b, int64_t h, int64_t t, int64_t d) {
  switch (l) {
    case FileLayout::Bhsd: return {b, h, t, d};
    case FileLayout::Bshd: return {b, t, h, d};
    case FileLayout::Thd: return {t, h, d};
  }
  return {};
}

TEST(FileLayout, OffsetsAndOrderAreNumpys) {
  const int64_t H = 3, T = 5, D = 4;
  for (FileLayout l : {FileLayout::Bhsd, FileLayout::Bshd, FileLayout::Thd}) {
    const int64_t B = l == FileLayout::Thd ? 1 : 2;
    const std::vector<int64_t> shape = file_shape(l, B, H, T, D);
    ASSERT_EQ(shape.size(), l == FileLayout::Thd ? 3u : 4u) << file_layout_name(l);
    EXPECT_EQ(file_shape(l, B, H, T), std::vector<int64_t>(shape.begin(), shape.end() - 1)) << "the LSE: no dim axis";
    std::vector<float> x(size_t(B * H * T * D));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);  // element (b, h, t, d) of [B, H, T, D] holds its index
    const std::vector<float> y = to_file_order(l, x.data(), B, H, T, D);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t at = c_index(shape, file_index(l, b, h, t, 0));
          EXPECT_EQ(row_offset(l, b, h, t, H, T, D), at) << file_layout_name(l);
          if (t + 1 < T) EXPECT_EQ(row_offset(l, b, h, t + 1, H, T, D) - at, token_stride(l, H, D));
          for (int64_t d = 0; d < D; ++d) EXPECT_EQ(y[size_t(at + d)], float(((b * H + h) * T + t) * D + d));
        }
  }
}

TEST(FileLayout, ParseNamesTheValueAndTheChoices) {
  EXPECT_EQ(parse_file_layout(""), FileLayout::Bhsd);
  EXPECT_EQ(parse_file_layout("bhsd"), FileLayout::Bhsd);
  EXPECT_EQ(parse_file_layout("bshd"), FileLayout::Bshd);
  for (const char* bad : {"bhsdx", "thd", "BSHD", " bshd"}) {
    try {
      parse_file_layout(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()), "--layout '" + std::string(bad) + "' is not a layout: allowed are bhsd ([batch, "
                "heads, seq, dim], the default) and bshd ([batch, seq, heads, dim])");
    }
  }
}

TEST(FileLayout, DimsOfAHeaderAndItsErrors) {
  NpyHeader h;
  h.shape = {2, 7, 3, 8};
  const auto dims = [&](FileLayout l) {
    const FileDims d = file_dims(h, l, "--q", "q.npy", "heads", "q_len");
    return std::vector<int64_t>{d.batch, d.heads, d.len, d.dim};
  };
  EXPECT_EQ(dims(FileLayout::Bhsd), (std::vector<int64_t>{2, 7, 3, 8}));
  EXPECT_EQ(dims(FileLayout::Bshd), (std::vector<int64_t>{2, 3, 7, 8}));
  auto message = [&](FileLayout l) {
    try {
      dims(l);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(FileLayout::Thd),
            "--q q.npy: expected 3 dimensions [q_len, heads, dim] (the packed thd layout) but the file holds shape "
            "[2, 7, 3, 8]");
  h.shape = {7, 3, 8};
  EXPECT_EQ(dims(FileLayout::Thd), (std::vector<int64_t>{1, 3, 7, 8}));
  EXPECT_EQ(message(FileLayout::Bshd),
            "--q q.npy: expected 4 dimensions [batch, q_len, heads, dim] (--layout bshd) but the file holds shape "
            "[7, 3, 8]");
  h.shape = {2, 0, 3, 8};
  EXPECT_EQ(message(FileLayout::Bshd), "--q q.npy: every dimension must be >= 1, the file holds shape [2, 0, 3, 8]");
}

// --out and --lse of one seeded run, written in each layout by a world of one.
TEST(FileLayout, OutputsAreTheTransposes) {
  GlobalProblem p;
  p.batch = 1;  // thd has no batch axis; bshd also runs at batch 2 below
  p.q_heads = 4;
  p.kv_heads = 2;
  p.q_len = p.kv_len = 37;
  p.head_dim = 8;
  p.causal = true;
  const std::string dir = std::filesystem::temp_directory_path() / ("ringattn_layout_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  for (int64_t batch : {1, 2}) {
    p.batch = batch;
    InputSource src(test::fresh_seed());
    auto b = make_cpu_backend();
    auto t = make_local_transport();
    const RingPlan ring = ring_plan(p, 1, 0);
    LocalProblem local = load_local(p, &ring, src, *b, 0, 1);
    run_forward(p, local, *b, *t, {});
    const HostResult r = copy_result(p, local, *b);
    const int64_t B = p.batch, H = p.q_heads, T = p.q_len, D = p.head_dim;
    for (FileLayout l : {FileLayout::Bhsd, FileLayout::Bshd, FileLayout::Thd}) {
      if (l == FileLayout::Thd && batch != 1) continue;
      const std::string o = dir + "/o.npy", lse = dir + "/l.npy";
      FileSet staged;
      ASSERT_EQ(write_global_outputs(p, local, r, *t, o, lse, l, staged), 0);
      ASSERT_EQ(commit_outputs(staged), 0);
      const NpyArray of = load_npy(o), lf = load_npy(lse);
      EXPECT_EQ(of.header.shape, file_shape(l, B, H, T, D)) << file_layout_name(l);
      EXPECT_EQ(lf.header.shape, file_shape(l, B, H, T)) << file_layout_name(l);
      const std::vector<float> want_o = to_file_order(l, reinterpret_cast<const float*>(r.out.data()), B, H, T, D);
      const std::vector<float> want_l = to_file_order(l, r.lse.data(), B, H, T, 1);
      for (size_t i = 0; i < want_o.size(); ++i) ASSERT_EQ(of.at(int64_t(i)), want_o[i]) << file_layout_name(l) << i;
      for (size_t i = 0; i < want_l.size(); ++i) ASSERT_EQ(lf.at(int64_t(i)), want_l[i]) << file_layout_name(l) << i;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ringattn::cli
