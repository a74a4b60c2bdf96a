// Pieces of the command line that the end-to-end scenarios cannot pin down exactly: the FLOP
// count's visible pairs, the dtype rules for files, and that a rank's shard read from .npy
// files (bhsd or bshd) equals the same shard made from the seed, for every sharding and rank.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "cli/problem.hpp"
#include "common/test_util.hpp"
#include "kernels/params.hpp"
#include "core/error.hpp"

namespace ringattn::cli {
namespace {

std::string temp_file(const std::string& tag) {
  return (std::filesystem::temp_directory_path() / ("ringattn_cli_" + tag + "_" + std::to_string(getpid()) + ".npy"))
      .string();
}

TEST(CliProblem, VisiblePairsMatchesCounting) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    GlobalProblem p;
    p.q_len = 1 + int64_t(rng() % 70);
    p.kv_len = 1 + int64_t(rng() % 70);
    p.causal = rng() % 4 != 0;
    p.q_offset = int64_t(rng() % 160) - 40;
    double count = 0;  // brute force: key j visible to row i when j <= i + q_offset
    for (int64_t i = 0; i < p.q_len; ++i)
      for (int64_t j = 0; j < p.kv_len; ++j) count += !p.causal || j <= i + p.resolved_q_offset();
    EXPECT_EQ(visible_pairs(p), count) << "seed " << seed << " T=" << p.q_len << " S=" << p.kv_len
                                       << " off=" << p.resolved_q_offset() << " causal=" << p.causal;
  }
  GlobalProblem self;
  self.q_len = self.kv_len = 1000;
  self.causal = true;
  EXPECT_EQ(visible_pairs(self), 1000.0 * 1001 / 2);  // about half of T x S
}

// In either --layout (bshd files hold the same tensors transposed), for every sharding and rank.
TEST(CliProblem, FileShardsEqualSeededShards) {
  const uint64_t seed = test::fresh_seed();
  const int64_t B = 2, H = 4, Hkv = 2, T = 48, D = 16;
  for (const char* layout : {"bhsd", "bshd"}) {
    const FileLayout l = parse_file_layout(layout);
    // Files holding exactly the seeded inputs (fp32).
    const std::string names[3] = {temp_file("q"), temp_file("k"), temp_file("v")};
    for (int t = 0; t < 3; ++t) {
      const int64_t heads = t == 0 ? H : Hkv;
      std::vector<float> x(size_t(B * heads * T * D));
      fill_input(bhtd_view(x.data(), DType::F32, B, heads, T, D), seed, InputTensor(t + 1), 0, 1);
      write_npy(names[t], file_shape(l, B, heads, T, D), DType::F32, to_file_order(l, x.data(), B, heads, T, D).data());
    }
    ProblemOptions o;
    o.q_file = names[0];
    o.k_file = names[1];
    o.v_file = names[2];
    o.layout = layout;
    o.seed = seed;
    o.causal = true;
    for (const char* shard : {"contiguous", "zigzag", "striped"}) {
      o.shard = shard;
      ProblemSetup files = setup_problem(o);
      EXPECT_EQ(files.layout, l);
      EXPECT_EQ(files.problem.batch, B);
      EXPECT_EQ(files.problem.q_heads, H);
      EXPECT_EQ(files.problem.kv_heads, Hkv);
      EXPECT_EQ(files.problem.q_len, T);
      EXPECT_EQ(files.problem.dtype, DType::F32);
      InputSource seeded(seed);
      auto b = make_cpu_backend();
      for (int world : {1, 2, 3, 4})
        for (int rank = 0; rank < world; ++rank) {
          const std::optional<RingPlan> ring = plan_ring(o, files.problem, world, rank);
          LocalProblem a = load_local(files.problem, ring_of(ring), *files.source, *b, rank, world);
          LocalProblem c = load_local(files.problem, ring_of(ring), seeded, *b, rank, world);
          const std::string where = fmt::format("{} {} rank {}/{}", layout, shard, rank, world);
          ASSERT_EQ(a.q.bytes(), c.q.bytes());
          EXPECT_EQ(0, std::memcmp(a.q.get(), c.q.get(), a.q.bytes())) << where;
          EXPECT_EQ(0, std::memcmp(a.k.get(), c.k.get(), a.k.bytes())) << where;
          EXPECT_EQ(0, std::memcmp(a.v.get(), c.v.get(), a.v.bytes())) << where;
          // The output is poisoned before any run.
          EXPECT_TRUE(std::isnan(a.views.lse[0]));
        }
    }
    for (const auto& n : names) std::remove(n.c_str());
  }
}

TEST(CliProblem, HalfFilesRunFp16UnlessTold) {
  const std::string names[3] = {temp_file("hq"), temp_file("hk"), temp_file("hv")};
  std::vector<uint16_t> x(size_t(1 * 2 * 8 * 4), float_to_fp16(0.5f));
  for (const auto& n : names) write_npy(n, {1, 2, 8, 4}, DType::F16, x.data());
  ProblemOptions o;
  o.q_file = names[0];
  o.k_file = names[1];
  o.v_file = names[2];
  EXPECT_EQ(setup_problem(o).problem.dtype, DType::F16);
  o.dtype = "bf16";
  EXPECT_EQ(setup_problem(o).problem.dtype, DType::BF16);
  o.dtype = "";
  o.device = "cuda";
  EXPECT_EQ(setup_problem(o).problem.dtype, DType::F16);
  for (const auto& n : names) std::remove(n.c_str());
}

TEST(CliProblem, FilesOfMixedDtypesNeedDtype) {
  const std::string names[3] = {temp_file("mq"), temp_file("mk"), temp_file("mv")};
  std::vector<uint16_t> h(size_t(1 * 2 * 8 * 4), float_to_fp16(0.5f));
  std::vector<float> f(h.size(), 0.5f);
  write_npy(names[0], {1, 2, 8, 4}, DType::F16, h.data());
  write_npy(names[1], {1, 2, 8, 4}, DType::F32, f.data());
  write_npy(names[2], {1, 2, 8, 4}, DType::F32, f.data());
  ProblemOptions o;
  o.q_file = names[0];
  o.k_file = names[1];
  o.v_file = names[2];
  try {
    setup_problem(o);
    ADD_FAILURE() << "files of mixed dtypes were accepted without --dtype";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("holds fp16, --k " + names[1] + " holds fp32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("give files of one dtype, or --dtype to convert them all"), std::string::npos);
  }
  o.dtype = "fp32";
  EXPECT_EQ(setup_problem(o).problem.dtype, DType::F32);
  for (const auto& n : names) std::remove(n.c_str());
}

}  // namespace
}  // namespace ringattn::cli
