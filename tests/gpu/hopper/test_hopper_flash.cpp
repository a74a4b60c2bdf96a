// The Hopper flash forward against the fp64 CPU oracle (cpu::naive_attention) on fresh random
// inputs: bf16/fp16, head dims 64/128, lengths off the 128 tile, GQA 1/4/8, causal with q_offset
// (prefill, chunked prefill, rows that see no key), sliding windows (causal and the lower edge
// alone: key blocks below the window skipped, masked blocks on both edges), Fold into an incoming
// state, [B,T,H,D] views, more tiles than multiprocessors (the persistent schedule), and the
// support check.
// Skips with a message where no sm_90 GPU (or no sm_90a build) is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cuda/flash_dispatch.hpp"
#include "kernels/cuda/hopper/hopper_desc.hpp"
#include "kernels/cuda/hopper/hopper_tiles.hpp"
#include "core/error.hpp"

namespace ringattn::test {
namespace {

#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Device 0 as the dispatch sees it, read once.
const cuda::DeviceCaps& device0() {
  static const cuda::DeviceCaps caps = cuda::query_device(0);
  return caps;
}
// The dispatch with the Hopper kernel required; tile and lazy rescaling from the environment
// (gpu_host.sh runs the binary once per configuration).
// l2_bytes > 0 plans for an L2 of that size instead of the device's (the sections of the tile
// order, hopper_tiles.hpp: a small one makes small shapes take several); a tile name asks for that
// configuration instead of the environment's.
cuda::FlashChoice hopper_choice(const FlashParams& p, int64_t l2_bytes = 0, const std::string& tile = "") {
  cuda::FlashKernelOptions o = cuda::flash_options(settings().kernels());
  o.kernel = cuda::FlashKernel::Hopper;
  if (!tile.empty()) o.hopper_tile = tile;
  cuda::DeviceCaps caps = device0();
  if (l2_bytes > 0) caps.l2_bytes = l2_bytes;
  return cuda::choose_flash_kernel(caps, p, o);
}
bool hopper_takes(const FlashParams& p) { return hopper_choice(p).path == cuda::FlashPath::Hopper; }
// Queues the Hopper kernel on the default stream; throws InvalidArgument when it does not take p.
void hopper_run(const FlashParams& p, int64_t l2_bytes = 0, const std::string& tile = "") {
  validate_flash(p, /*complete=*/false);
  const cuda::FlashChoice c = hopper_choice(p, l2_bytes, tile);
  if (l2_bytes > 0 && c.path == cuda::FlashPath::Hopper) {  // the override took: more than one section
    const auto& hp = c.hopper.params;
    EXPECT_LT(hp.section_heads, hp.batch * hp.q_heads) << "the small L2 left one section";
  }
  cuda::launch_flash(c, p, device0(), nullptr);
}

struct Case {
  DType dtype = DType::BF16;
  int64_t b = 1, hq = 4, hkv = 4, t = 256, s = 256, d = 128;
  bool causal = false;
  int64_t q_offset = 0;
  StateMode mode = StateMode::Write;
  bool bthd = false;
  int64_t window = -1;  // >= 0: the mask's lower edge (MaskSpec::window)
  int64_t l2_bytes = 0;  // > 0: plan the tile order for an L2 of this size (hopper_run)
  bool out = false;      // the final output too (FlashParams::out, in q's layout), checked against the oracle
  std::string tile;      // non-empty: this tile configuration, which the plan must take (else the environment's)
  std::string name() const {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%s b=%lld hq=%lld hkv=%lld t=%lld s=%lld d=%lld %s q_offset=%lld window=%lld %s %s l2=%lld%s%s%s",
                  dtype_name(dtype), (long long)b, (long long)hq, (long long)hkv, (long long)t, (long long)s,
                  (long long)d, causal ? "causal" : "full", (long long)q_offset, (long long)window,
                  mode == StateMode::Fold ? "fold" : "write", bthd ? "bthd" : "bhtd", (long long)l2_bytes,
                  out ? " out" : "", tile.empty() ? "" : " tile=", tile.c_str());
    return buf;
  }
};
// c with the final output written as well (the staged epilogue in Write mode, where the tile
// configuration has room for it).
Case with_out(Case c) {
  c.out = true;
  return c;
}
// c on the tile configuration named (hopper_tile_name), which must take it.
Case on_tile(Case c, const char* tile) {
  c.tile = tile;
  return c;
}
// c planned for an L2 of l2 bytes (sections of the tile order).
Case small_l2(Case c, int64_t l2) {
  c.l2_bytes = l2;
  return c;
}
// c with a sliding window of w keys (the lower edge) on its mask.
Case windowed(Case c, int64_t w) {
  c.window = w;
  return c;
}

class HopperFlash : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      (void)cudaGetLastError();
      GTEST_SKIP() << "no CUDA device visible: Hopper flash test skipped";
    }
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    if (prop.major != 9 || prop.minor != 0)
      GTEST_SKIP() << "device 0 is sm_" << prop.major << prop.minor << ", not sm_90: Hopper flash test skipped";
    ASSERT_EQ(cudaMalloc(&probe_buf_, 4096), cudaSuccess);
    if (!hopper_takes(make_probe()))
      GTEST_SKIP() << "sm_90 GPU present but this build has no sm_90a code: Hopper flash test skipped";
  }
  void TearDown() override {
    if (probe_buf_) cudaFree(probe_buf_);
  }
  // A supported one-row call on a small device buffer (q, k, v and the state share it: only
  // inspected by the support check, never launched).
  FlashParams make_probe() const {
    FlashParams p;
    p.q = bhtd_view(probe_buf_, DType::BF16, 1, 1, 1, 128);
    p.k = p.v = p.q;
    float* f = static_cast<float*>(probe_buf_);
    p.state = contiguous_state(f + 512, f + 768, 1, 1, 1, 128);
    p.scale = 0.1f;
    return p;
  }
  void* probe_buf_ = nullptr;
};

void* to_device(const void* host, size_t bytes) {
  void* d = nullptr;
  if (cudaMalloc(&d, bytes) != cudaSuccess) return nullptr;
  if (cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
  return d;
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name());
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  HostTensor q(c.dtype, c.b, c.hq, c.t, c.d, rng, c.bthd);
  HostTensor k(c.dtype, c.b, c.hkv, c.s, c.d, rng, c.bthd);
  HostTensor v(c.dtype, c.b, c.hkv, c.s, c.d, rng, c.bthd);
  HostState init(c.b, c.hq, c.t, c.d);  // NaN-poisoned: Write must overwrite every element
  if (c.mode == StateMode::Fold) {
    // A valid incoming state: random o and lse, every fifth row empty.
    std::normal_distribution<float> n(0.f, 1.f);
    for (auto& x : init.o) x = n(rng);
    for (size_t r = 0; r < init.lse.size(); ++r) {
      init.lse[r] = r % 5 == 0 ? kNegInf : 3.f + n(rng);
      if (r % 5 == 0)
        for (int64_t d = 0; d < c.d; ++d) init.o[r * c.d + d] = 0.f;
    }
  }

  FlashParams hp;
  hp.q = q.view;
  hp.k = k.view;
  hp.v = v.view;
  hp.state = init.view;
  hp.scale = 1.f / std::sqrt(float(c.d));
  hp.mask = MaskSpec{c.causal, c.q_offset, c.window};
  hp.mode = c.mode;
  const cpu::Reference ref = cpu::naive_attention(hp);

  // Expected state: the oracle's (Write), or the incoming state folded with it (Fold).
  std::vector<double> want_o = ref.o, want_lse = ref.lse;
  if (c.mode == StateMode::Fold) {
    std::vector<float> o = init.o, lse = init.lse, ob(size_t(c.d));
    for (size_t r = 0; r < lse.size(); ++r) {
      for (int64_t d = 0; d < c.d; ++d) ob[d] = float(ref.o[r * c.d + d]);
      cpu::merge_row(&o[r * c.d], &lse[r], ob.data(), float(ref.lse[r]), c.d);
    }
    want_o.assign(o.begin(), o.end());
    want_lse.assign(lse.begin(), lse.end());
  }

  FlashParams dp = hp;
  dp.q.data = to_device(q.bytes.data(), q.bytes.size());
  dp.k.data = to_device(k.bytes.data(), k.bytes.size());
  dp.v.data = to_device(v.bytes.data(), v.bytes.size());
  float* d_o = static_cast<float*>(to_device(init.o.data(), init.o.size() * 4));
  float* d_lse = static_cast<float*>(to_device(init.lse.data(), init.lse.size() * 4));
  ASSERT_TRUE(dp.q.data && dp.k.data && dp.v.data && d_o && d_lse);
  dp.state = contiguous_state(d_o, d_lse, c.b, c.hq, c.t, c.d);
  // The final output, NaN-poisoned (0xffff is NaN in bf16 and fp16), in q's layout.
  const size_t out_bytes = size_t(c.b * c.hq * c.t * c.d) * dtype_size(c.dtype);
  void* d_out = nullptr;
  if (c.out) {
    const std::vector<uint8_t> poison(out_bytes, 0xff);
    d_out = to_device(poison.data(), out_bytes);
    ASSERT_TRUE(d_out);
    dp.out = c.bthd ? bthd_view(d_out, c.dtype, c.b, c.hq, c.t, c.d) : bhtd_view(d_out, c.dtype, c.b, c.hq, c.t, c.d);
    // Write into the output takes the staged epilogue wherever the configuration has room for it.
    const cuda::FlashChoice choice = hopper_choice(dp, c.l2_bytes, c.tile);
    const std::string tile = choice.hopper_tile;
    const bool room = tile == "128x128" || tile == "192x128" || tile == "128x128c2";
    EXPECT_EQ(choice.hopper.params.staged_out, c.mode == StateMode::Write && room ? 1 : 0) << "tile " << tile;
  }
  ASSERT_TRUE(hopper_takes(dp));
  if (!c.tile.empty()) ASSERT_STREQ(hopper_choice(dp, c.l2_bytes, c.tile).hopper_tile, c.tile.c_str());
  hopper_run(dp, c.l2_bytes, c.tile);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> got_o(init.o.size(), kNaN), got_lse(init.lse.size(), kNaN);
  CK(cudaMemcpy(got_o.data(), d_o, got_o.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(got_lse.data(), d_lse, got_lse.size() * 4, cudaMemcpyDeviceToHost));
  if (c.out) {  // the output replaces the state's o (left as it was): read it, in the state's row order
    std::vector<uint8_t> raw(out_bytes);
    CK(cudaMemcpy(raw.data(), d_out, out_bytes, cudaMemcpyDeviceToHost));
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t h = 0; h < c.hq; ++h)
        for (int64_t t = 0; t < c.t; ++t)
          for (int64_t d = 0; d < c.d; ++d) {
            const int64_t at = c.bthd ? ((b * c.t + t) * c.hq + h) * c.d + d : ((b * c.hq + h) * c.t + t) * c.d + d;
            got_o[size_t(((b * c.hq + h) * c.t + t) * c.d + d)] = load_as_float(raw.data(), c.dtype, at);
          }
    cudaFree(d_out);
  }
  for (void* ptr : {dp.q.data, dp.k.data, dp.v.data, static_cast<void*>(d_o), static_cast<void*>(d_lse)})
    cudaFree(ptr);

  const double err_o = rel_error(got_o, want_o);
  const double err_lse = max_abs_error(got_lse, want_lse);
  EXPECT_LT(err_o, 1e-2) << "relative error of o";
  EXPECT_LT(err_lse, 2e-2) << "max abs error of lse";
  std::printf("[ hopper   ] %s: rel err o %.2e, max abs err lse %.2e\n", c.name().c_str(), err_o, err_lse);
}

TEST_F(HopperFlash, Bf16Dim128Full) { run_case({DType::BF16, 1, 4, 4, 256, 256, 128}); }
TEST_F(HopperFlash, Fp16Dim128Full) { run_case({DType::F16, 1, 2, 2, 384, 512, 128}); }
TEST_F(HopperFlash, Bf16Dim64TailsGqa4) { run_case({DType::BF16, 1, 8, 2, 200, 333, 64}); }
TEST_F(HopperFlash, Fp16Dim64TailsGqa4) { run_case({DType::F16, 2, 4, 1, 77, 129, 64}); }
TEST_F(HopperFlash, CausalPrefillGqa8) { run_case({DType::BF16, 1, 8, 1, 384, 384, 128, true, 0}); }
TEST_F(HopperFlash, CausalPrefillTailsDim64) { run_case({DType::F16, 1, 4, 4, 300, 300, 64, true, 0}); }
TEST_F(HopperFlash, CausalChunkedPrefill) { run_case({DType::BF16, 1, 4, 2, 130, 700, 128, true, 570}); }
TEST_F(HopperFlash, CausalChunkedPrefillFp16Dim64) { run_case({DType::F16, 1, 8, 8, 64, 520, 64, true, 456}); }
// q_offset < 0: the first 100 rows see no key (Write: o = 0, lse = -inf).
TEST_F(HopperFlash, CausalRowsWithNoKeyWrite) { run_case({DType::BF16, 1, 2, 2, 300, 250, 128, true, -100}); }
// Whole tiles with no visible key are skipped and still written.
TEST_F(HopperFlash, CausalTilesWithNoKeyWrite) { run_case({DType::BF16, 1, 2, 1, 400, 100, 64, true, -250}); }
// A consumer's rows whose keys end inside the first 64 of their last block take 64-key products
// there (consume_per_tile): keys ending exactly at 64 of the block (full, kv_len 320), one past it
// (321: the full products), and a causal diagonal that puts the ends of some consumers' rows
// inside the first half (q_offset 65) and others' past it.
TEST_F(HopperFlash, HalfBlockKvTailAtSixtyFour) { run_case({DType::BF16, 1, 4, 2, 200, 320, 128}); }
TEST_F(HopperFlash, HalfBlockKvTailPastSixtyFour) { run_case({DType::F16, 1, 4, 2, 200, 321, 128}); }
TEST_F(HopperFlash, HalfBlockCausalOffsetDiagonal) { run_case({DType::BF16, 2, 4, 2, 256, 321, 128, true, 65}); }
TEST_F(HopperFlash, FoldFull) { run_case({DType::BF16, 1, 4, 4, 200, 300, 128, false, 0, StateMode::Fold}); }
// Fold with rows that see no key: the state stays as it was.
TEST_F(HopperFlash, FoldCausalRowsWithNoKey) {
  run_case({DType::F16, 1, 4, 2, 260, 260, 64, true, -40, StateMode::Fold});
}
// The causal order's short query block first (query_shift): 450 rows in 192-row tiles start at row
// -126, so the first tile's consumer 0 has no row in range and consumer 1 two (bthd views: the Q
// copy's rows before 0 come from the strided map's zero fill); with a causal offset the rows
// before 0 see keys (computed, not stored), folded into a state. At head dim 128 the shift is a
// multiple of gcd(block_m, block_n): none on the default 128 x 128 tiles, 48 rows under 128x176
// (consumer 0 with 16 rows in range, the half-block products on its diagonal).
TEST_F(HopperFlash, ShiftedCausalFirstTileBthdDim64) {
  run_case({DType::BF16, 2, 4, 2, 450, 450, 64, true, 0, StateMode::Write, true});
}
TEST_F(HopperFlash, ShiftedCausalFirstTileOffsetFold) {
  run_case({DType::F16, 1, 4, 4, 450, 600, 64, true, 150, StateMode::Fold});
}
TEST_F(HopperFlash, ShiftedCausalFirstTileDim128) { run_case({DType::BF16, 1, 4, 2, 200, 200, 128, true, 0}); }
// The final output from the epilogue (FlashParams::out): staged through shared memory and bulk
// tensor stores in Write mode on 128x128 and 192x128 tiles (rows before 0 and past q_len dropped
// by the copy engine; several tiles per CTA reusing each consumer's buffer; [B,T,H,D] views;
// tiles with no key, written from registers beside it), from registers with Fold and elsewhere.
TEST_F(HopperFlash, OutCausalShiftedBthdDim64) {
  run_case(with_out({DType::BF16, 2, 4, 2, 450, 450, 64, true, 0, StateMode::Write, true}));
}
TEST_F(HopperFlash, OutFullTailsGqaDim64) { run_case(with_out({DType::F16, 1, 8, 2, 200, 333, 64})); }
TEST_F(HopperFlash, OutPersistentManyTilesCausal) { run_case(with_out({DType::F16, 2, 8, 8, 1152, 1152, 128, true, 0})); }
TEST_F(HopperFlash, OutCausalChunkedPrefillBthd) {
  run_case(with_out({DType::BF16, 1, 4, 2, 130, 700, 128, true, 570, StateMode::Write, true}));
}
TEST_F(HopperFlash, OutWindowTilesWithNoKey) {
  run_case(with_out(windowed({DType::BF16, 1, 2, 1, 260, 300, 128, false, 200}, 10)));
}
TEST_F(HopperFlash, OutCausalRowsWithNoKeyDim64) { run_case(with_out({DType::BF16, 1, 2, 1, 400, 100, 64, true, -250})); }
TEST_F(HopperFlash, OutFold) { run_case(with_out({DType::BF16, 1, 4, 4, 200, 300, 128, false, 0, StateMode::Fold})); }
TEST_F(HopperFlash, OutDim256) { run_case(with_out({DType::BF16, 1, 8, 2, 200, 333, 256, true, 0})); }
TEST_F(HopperFlash, BthdViewsCausal) { run_case({DType::BF16, 2, 8, 2, 256, 256, 128, true, 0, StateMode::Write, true}); }
// 2 * 8 * 9 = 144 query tiles: more than the 132 multiprocessors, so CTAs take several tiles.
TEST_F(HopperFlash, PersistentManyTilesFull) { run_case({DType::BF16, 2, 8, 2, 1152, 1152, 64}); }
TEST_F(HopperFlash, PersistentManyTilesCausal) { run_case({DType::F16, 2, 8, 8, 1152, 1152, 128, true, 0}); }
// About 3 tiles per CTA with tiles that see no key among them (q_offset < 0), folded into a state:
// the streamed consumer crosses tile boundaries with work in flight.
TEST_F(HopperFlash, PersistentTilesWithEmptyOnesFold) {
  run_case({DType::F16, 1, 32, 8, 1600, 1600, 64, true, -300, StateMode::Fold});
}
TEST_F(HopperFlash, PersistentTilesWithEmptyOnesWriteDim128) {
  run_case({DType::BF16, 1, 32, 4, 1000, 1000, 128, true, -250});
}

// Sliding windows. Key blocks are 128 or 176 keys and query tiles 128 or 192 rows: windows of
// 0 and 1 key, odd sizes inside one block, on block multiples and over several blocks (the
// middle ones unmasked), causal offsets (chunked prefill: whole blocks below every row's window),
// rows and whole tiles that see no key, and the lower edge alone.
TEST_F(HopperFlash, WindowCausalDiagonalOnly) { run_case(windowed({DType::BF16, 1, 4, 4, 300, 300, 128, true, 0}, 0)); }
TEST_F(HopperFlash, WindowCausalOneKeyDim64) { run_case(windowed({DType::F16, 1, 4, 2, 333, 333, 64, true, 0}, 1)); }
TEST_F(HopperFlash, WindowCausalSmall) { run_case(windowed({DType::BF16, 1, 4, 1, 700, 700, 128, true, 0}, 37)); }
TEST_F(HopperFlash, WindowCausalBlockMultipleDim64) {
  run_case(windowed({DType::BF16, 1, 2, 2, 640, 640, 64, true, 0}, 128));
}
TEST_F(HopperFlash, WindowCausalOneUnderBlock) {
  run_case(windowed({DType::F16, 1, 2, 2, 641, 641, 128, true, 0}, 175));
}
TEST_F(HopperFlash, WindowCausalSeveralBlocks) {
  run_case(windowed({DType::BF16, 1, 4, 2, 1000, 1000, 128, true, 0}, 300));
}
TEST_F(HopperFlash, WindowCausalWide) { run_case(windowed({DType::F16, 1, 2, 1, 1300, 1300, 64, true, 0}, 700)); }
TEST_F(HopperFlash, WindowCausalChunkedPrefill) {
  run_case(windowed({DType::BF16, 1, 4, 2, 130, 1500, 128, true, 1370}, 500));
}
TEST_F(HopperFlash, WindowCausalChunkedPrefillDim64) {
  run_case(windowed({DType::F16, 1, 8, 8, 64, 1020, 64, true, 956}, 99));
}
// q_offset < 0: the first 100 rows see no key, the others at most 51.
TEST_F(HopperFlash, WindowCausalRowsWithNoKey) {
  run_case(windowed({DType::BF16, 1, 2, 2, 300, 250, 128, true, -100}, 50));
}
TEST_F(HopperFlash, WindowLowerEdgeOnly) { run_case(windowed({DType::BF16, 1, 4, 2, 300, 500, 128, false, 150}, 200)); }
TEST_F(HopperFlash, WindowLowerEdgeOnlyZeroDim64) {
  run_case(windowed({DType::F16, 1, 2, 2, 211, 301, 64, false, 0}, 0));
}
// The lower edge alone, rows 110.. see no key: the tiles past row 128 have no key block.
TEST_F(HopperFlash, WindowLowerEdgeTilesWithNoKey) {
  run_case(windowed({DType::BF16, 1, 2, 1, 260, 300, 128, false, 200}, 10));
}
TEST_F(HopperFlash, WindowFoldRowsWithNoKey) {
  run_case(windowed({DType::F16, 1, 4, 2, 260, 260, 64, true, -40, StateMode::Fold}, 50));
}
TEST_F(HopperFlash, WindowBthdViews) {
  run_case(windowed({DType::BF16, 2, 8, 2, 256, 256, 128, true, 0, StateMode::Write, true}, 77));
}
// 144 query tiles with their key blocks starting at different blocks: CTAs take several tiles,
// and the streamed consumer crosses tile boundaries with work in flight.
TEST_F(HopperFlash, WindowPersistentManyTiles) {
  run_case(windowed({DType::F16, 2, 8, 8, 1152, 1152, 128, true, 0}, 333));
}
TEST_F(HopperFlash, WindowPersistentTilesWithEmptyOnesFold) {
  run_case(windowed({DType::BF16, 1, 32, 8, 1600, 1600, 64, true, -300, StateMode::Fold}, 250));
}

// Head dim 256 (the 128x80 configuration): lengths off the 80-key tile, GQA, causal prefill and
// chunked prefill, rows and tiles that see no key, Fold, [B,T,H,D] views, more tiles than
// multiprocessors, and windows (several 80-key blocks, the lower edge alone).
TEST_F(HopperFlash, Dim256FullTailsGqa4) { run_case({DType::BF16, 1, 8, 2, 200, 333, 256}); }
TEST_F(HopperFlash, Dim256Fp16Full) { run_case({DType::F16, 1, 2, 2, 384, 161, 256}); }
TEST_F(HopperFlash, Dim256CausalPrefillGqa8) { run_case({DType::BF16, 1, 8, 1, 384, 384, 256, true, 0}); }
TEST_F(HopperFlash, Dim256CausalChunkedPrefill) { run_case({DType::F16, 1, 4, 2, 130, 700, 256, true, 570}); }
TEST_F(HopperFlash, Dim256CausalTilesWithNoKeyWrite) { run_case({DType::BF16, 1, 2, 1, 400, 100, 256, true, -250}); }
TEST_F(HopperFlash, Dim256FoldCausalRowsWithNoKey) {
  run_case({DType::BF16, 1, 4, 2, 260, 260, 256, true, -40, StateMode::Fold});
}
TEST_F(HopperFlash, Dim256BthdViewsCausal) {
  run_case({DType::BF16, 2, 8, 2, 256, 256, 256, true, 0, StateMode::Write, true});
}
TEST_F(HopperFlash, Dim256PersistentManyTilesCausal) { run_case({DType::F16, 2, 8, 8, 1152, 1152, 256, true, 0}); }
TEST_F(HopperFlash, Dim256WindowCausalSeveralBlocks) {
  run_case(windowed({DType::BF16, 1, 4, 2, 1000, 1000, 256, true, 0}, 300));
}
TEST_F(HopperFlash, Dim256WindowLowerEdgeOnly) {
  run_case(windowed({DType::F16, 1, 4, 2, 300, 500, 256, false, 150}, 79));
}

// The dynamic tile schedule keeps a pair of counters per stream, reset by each launch's last CTA:
// four launches of one problem alternate between two non-blocking streams, so launches on both
// streams overlap, then one more on the first stream. Every output must equal the oracle's: a
// counter shared between the streams, or one left unreset, would hand out tiles twice or never
// (the outputs are NaN-poisoned). tile: a configuration to require ("": the default).
void schedule_on_concurrent_streams(int64_t b, bool causal, const std::string& tile, int64_t d = 128) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t hq = 16, hkv = 4, t = 2048;
  HostTensor q(DType::BF16, b, hq, t, d, rng), k(DType::BF16, b, hkv, t, d, rng), v(DType::BF16, b, hkv, t, d, rng);
  HostState poison(b, hq, t, d);
  FlashParams hp;
  hp.q = q.view;
  hp.k = k.view;
  hp.v = v.view;
  hp.state = poison.view;
  hp.scale = 1.f / std::sqrt(float(d));
  hp.mask = MaskSpec{causal, 0, -1};
  const cpu::Reference ref = cpu::naive_attention(hp);
  FlashParams dp = hp;
  dp.q.data = to_device(q.bytes.data(), q.bytes.size());
  dp.k.data = to_device(k.bytes.data(), k.bytes.size());
  dp.v.data = to_device(v.bytes.data(), v.bytes.size());
  ASSERT_TRUE(dp.q.data && dp.k.data && dp.v.data);
  cudaStream_t streams[2];
  for (auto& s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr int kLaunches = 5;
  std::vector<float*> o(kLaunches), lse(kLaunches);
  for (int i = 0; i < kLaunches; ++i) {
    o[i] = static_cast<float*>(to_device(poison.o.data(), poison.o.size() * 4));
    lse[i] = static_cast<float*>(to_device(poison.lse.data(), poison.lse.size() * 4));
    ASSERT_TRUE(o[i] && lse[i]);
  }
  for (int i = 0; i < kLaunches; ++i) {
    FlashParams li = dp;
    li.state = contiguous_state(o[i], lse[i], b, hq, t, d);
    const cuda::FlashChoice c = hopper_choice(li, 0, tile);
    ASSERT_EQ(c.path, cuda::FlashPath::Hopper);
    if (!tile.empty()) ASSERT_STREQ(c.hopper_tile, tile.c_str());
    validate_flash(li, /*complete=*/false);
    cuda::launch_flash(c, li, device0(), streams[i < 4 ? i % 2 : 0]);
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < kLaunches; ++i) {
    std::vector<float> got_o(poison.o.size(), kNaN), got_lse(poison.lse.size(), kNaN);
    CK(cudaMemcpy(got_o.data(), o[i], got_o.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(got_lse.data(), lse[i], got_lse.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_LT(rel_error(got_o, ref.o), 1e-2) << "launch " << i;
    EXPECT_LT(max_abs_error(got_lse, ref.lse), 2e-2) << "launch " << i;
    cudaFree(o[i]);
    cudaFree(lse[i]);
  }
  for (auto& s : streams) CK(cudaStreamDestroy(s));
  for (void* ptr : {dp.q.data, dp.k.data, dp.v.data}) cudaFree(ptr);
}
// 1024 causal tiles of uneven length; 512 full tiles in 256 cluster pairs (rank 0 of each
// cluster fetches for both CTAs, and the last one resets the counters).
TEST_F(HopperFlash, DynamicScheduleOnConcurrentStreams) { schedule_on_concurrent_streams(4, true, ""); }
TEST_F(HopperFlash, DynamicScheduleOnConcurrentStreamsClusterPairs) {
  schedule_on_concurrent_streams(2, false, "128x176c2");
}
TEST_F(HopperFlash, DynamicScheduleOnConcurrentStreamsClusterPairsCausal) {
  schedule_on_concurrent_streams(4, true, "128x128c2");
}
// Head dim 256 keeps the static round robin (hopper/PERF.md, 2026-12-02): five launches on two
// streams as well.
TEST_F(HopperFlash, StaticScheduleOnConcurrentStreamsDim256) { schedule_on_concurrent_streams(2, true, "", 256); }

// The clusters of two CTAs (128x176c2): two query blocks of one (batch, head) per cluster, each
// CTA loading half of every K and V stage into both CTAs' shared memory. Full masks with an even
// number of query blocks: kv tails (a last key block of at most 64 keys, the half-block products,
// and one of more), GQA, fp16, Fold, the final output in bthd views, and more pairs than clusters
// (the paired dynamic schedule).
TEST_F(HopperFlash, ClusterPairFull) { run_case(on_tile({DType::BF16, 1, 4, 4, 256, 256, 128}, "128x176c2")); }
TEST_F(HopperFlash, ClusterPairKvTailHalfBlockGqa4) {
  run_case(on_tile({DType::BF16, 1, 8, 2, 200, 200, 128}, "128x176c2"));
}
TEST_F(HopperFlash, ClusterPairKvTailFp16) { run_case(on_tile({DType::F16, 2, 4, 2, 512, 333, 128}, "128x176c2")); }
TEST_F(HopperFlash, ClusterPairFold) {
  run_case(on_tile({DType::BF16, 1, 4, 4, 200, 300, 128, false, 0, StateMode::Fold}, "128x176c2"));
}
TEST_F(HopperFlash, ClusterPairOutBthd) {
  run_case(on_tile(with_out({DType::BF16, 2, 8, 2, 256, 500, 128, false, 0, StateMode::Write, true}), "128x176c2"));
}
TEST_F(HopperFlash, ClusterPairPersistentManyTiles) {
  run_case(on_tile({DType::BF16, 2, 8, 2, 2048, 700, 128}, "128x176c2"));
}
// The causal and windowed orders pair q heads 2j and 2j + 1 of one KV head on the same query
// block (an even group): causal GQA, a shifted first query block (q_len off 128 x 176 tiles),
// tiles that see no key, Fold with an offset, the staged final output (128x128c2) in bthd views,
// a window, and sections of the tile order.
TEST_F(HopperFlash, ClusterPairCausalGqa) { run_case(on_tile({DType::BF16, 1, 8, 2, 384, 384, 128, true, 0}, "128x128c2")); }
TEST_F(HopperFlash, ClusterPairCausalShiftedFirstTile) {
  run_case(on_tile({DType::F16, 1, 8, 2, 300, 300, 128, true, 0}, "128x176c2"));
}
TEST_F(HopperFlash, ClusterPairCausalTilesWithNoKey) {
  run_case(on_tile({DType::BF16, 1, 4, 2, 400, 100, 128, true, -250}, "128x128c2"));
}
TEST_F(HopperFlash, ClusterPairCausalFoldOffset) {
  run_case(on_tile({DType::BF16, 1, 8, 4, 260, 390, 128, true, 130, StateMode::Fold}, "128x176c2"));
}
TEST_F(HopperFlash, ClusterPairOutCausalBthd) {
  run_case(on_tile(with_out({DType::BF16, 2, 8, 4, 256, 256, 128, true, 0, StateMode::Write, true}), "128x128c2"));
}
TEST_F(HopperFlash, ClusterPairOutFull) { run_case(on_tile(with_out({DType::F16, 1, 4, 4, 256, 300, 128}), "128x128c2")); }
TEST_F(HopperFlash, ClusterPairWindowCausal) {
  run_case(on_tile(windowed({DType::BF16, 1, 8, 4, 700, 700, 128, true, 0}, 37), "128x128c2"));
}
TEST_F(HopperFlash, ClusterPairSectionsCausal) {
  run_case(on_tile(small_l2({DType::BF16, 2, 8, 2, 300, 300, 128, true, 0}, 400000), "128x128c2"));
}
// Where the tiles do not pair (a causal edge or a window with an odd group, an odd number of
// query blocks under a full mask, another head dim), the c2 configurations are not taken and the
// default runs. (Planned only: the views are larger than the buffer under them and never
// launched.)
TEST_F(HopperFlash, ClusterPairsOnlyWhereTilesPair) {
  FlashParams p = make_probe();
  float* f = static_cast<float*>(probe_buf_);
  const auto with_len = [&](int64_t len, int64_t d, int64_t kv_heads = 4) {
    p.q = bhtd_view(probe_buf_, DType::BF16, 1, 4, len, d);
    p.k = p.v = bhtd_view(probe_buf_, DType::BF16, 1, kv_heads, len, d);
    p.state = contiguous_state(f, f, 1, 4, len, d);
  };
  with_len(256, 128);
  EXPECT_STREQ(hopper_choice(p, 0, "128x176c2").hopper_tile, "128x176c2");
  p.mask = MaskSpec{true, 0, -1};
  EXPECT_STREQ(hopper_choice(p, 0, "128x176c2").hopper_tile, "128x128");
  p.mask = MaskSpec{false, 0, 100};
  EXPECT_STREQ(hopper_choice(p, 0, "128x176c2").hopper_tile, "128x128");
  p.mask = MaskSpec{};
  with_len(384, 128);  // three query blocks
  EXPECT_STREQ(hopper_choice(p, 0, "128x176c2").hopper_tile, "128x128");
  with_len(256, 64);
  EXPECT_STREQ(hopper_choice(p, 0, "128x176c2").hopper_tile, "192x128");
  // group 4 (4 q heads over 1 KV head): causal and windowed tiles pair across heads
  with_len(384, 128, 1);
  p.mask = MaskSpec{true, 0, -1};
  EXPECT_STREQ(hopper_choice(p, 0, "128x128c2").hopper_tile, "128x128c2");
  p.mask = MaskSpec{false, 0, 100};
  EXPECT_STREQ(hopper_choice(p, 0, "128x128c2").hopper_tile, "128x128c2");
  with_len(384, 128, 4);  // group 1
  EXPECT_STREQ(hopper_choice(p, 0, "128x128c2").hopper_tile, "128x128");
  // The default: 128x176c2 on long rows where the tiles pair, 128x176 where they do not.
  p.mask = MaskSpec{};
  with_len(8192, 128);
  EXPECT_STREQ(hopper_choice(p, 0, "auto").hopper_tile, "128x176c2");
  with_len(8192 + 128, 128);  // 65 query blocks
  EXPECT_STREQ(hopper_choice(p, 0, "auto").hopper_tile, "128x176");
  p.mask = MaskSpec{true, 0, -1};
  with_len(16384, 128, 1);
  EXPECT_STREQ(hopper_choice(p, 0, "auto").hopper_tile, "128x176c2");
  with_len(16384, 128, 4);
  EXPECT_STREQ(hopper_choice(p, 0, "auto").hopper_tile, "128x176");
}

// The causal and windowed tile orders in several sections (an L2 planned small: each section's
// K and V take at most half of it): sections of whole KV heads (GQA), sections that do not divide
// the heads (MHA, 6 heads in 2 x 3), more tiles than CTAs across sections, head dim 64's
// 192-row tiles, a window with and without the causal edge, and Fold. (Sections only form when
// all K and V are more than the L2: each planned L2 is under the case's K and V.)
TEST_F(HopperFlash, SectionsCausalGqa) {  // K + V of a KV head 154 KB: one KV head (4 q heads) per section
  run_case(small_l2({DType::BF16, 2, 8, 2, 300, 300, 128, true, 0}, 400000));
}
TEST_F(HopperFlash, SectionsCausalUnevenMha) {  // 3 KV heads fit half the L2, 7 heads: sections of 3, 3, 1
  run_case(small_l2({DType::F16, 1, 7, 7, 520, 520, 64, true, 0}, 13 * 520 * 64 * 4 / 2));
}
TEST_F(HopperFlash, SectionsCausalManyTiles) {
  run_case(small_l2({DType::BF16, 2, 8, 8, 1152, 1152, 128, true, 0}, 3 * 1152 * 128 * 4 * 2));
}
TEST_F(HopperFlash, SectionsWindowCausal) {
  run_case(small_l2(windowed({DType::BF16, 1, 8, 2, 700, 700, 128, true, 0}, 37), 150000));
}
TEST_F(HopperFlash, SectionsWindowLowerEdgeOnly) {
  run_case(small_l2(windowed({DType::F16, 2, 4, 2, 300, 500, 64, false, 150}, 200), 150000));
}
TEST_F(HopperFlash, SectionsFoldCausal) {
  run_case(small_l2({DType::BF16, 1, 8, 4, 260, 390, 128, true, 130, StateMode::Fold}, 300000));
}

// Head dim 256 runs on the Hopper kernel only: with the portable kernel required, the call is
// refused naming the head dim and what the portable kernels allow.
TEST_F(HopperFlash, Dim256RefusedOnThePortableKernel) {
  FlashParams p = make_probe();
  p.q = bhtd_view(probe_buf_, DType::BF16, 1, 1, 1, 256);
  p.k = p.v = p.q;
  float* f = static_cast<float*>(probe_buf_);
  p.state = contiguous_state(f + 256, f + 768, 1, 1, 1, 256);
  EXPECT_TRUE(hopper_takes(p));
  EXPECT_STREQ(hopper_choice(p).hopper_tile, "128x80");
  cuda::FlashKernelOptions o;
  o.kernel = cuda::FlashKernel::Portable;
  const cuda::FlashChoice c = cuda::choose_flash_kernel(device0(), p, o);
  EXPECT_EQ(c.path, cuda::FlashPath::None);
  EXPECT_EQ(c.reason,
            "head_dim=256 runs only on the Hopper flash kernel, and RINGATTN_FLASH_KERNEL=portable excludes it; the "
            "portable CUDA bf16 kernels allow head_dim 64 and 128");
}

TEST_F(HopperFlash, UnsupportedCallsAreRefused) {
  FlashParams p = make_probe();
  EXPECT_TRUE(hopper_takes(p));
  FlashParams f32 = p;
  f32.q.dtype = f32.k.dtype = f32.v.dtype = DType::F32;
  EXPECT_FALSE(hopper_takes(f32));
  FlashParams d96 = p;
  d96.q.dim = d96.k.dim = d96.v.dim = d96.state.dim = 96;
  EXPECT_FALSE(hopper_takes(d96));
  FlashParams odd_stride = p;  // rows of 68 bf16 values: 136 bytes, not a multiple of 16
  odd_stride.k = bhtd_view(odd_stride.k.data, DType::BF16, 1, 1, 4, 128);
  odd_stride.k.stride_t = 68 * 2 + 4;
  odd_stride.v = odd_stride.k;
  EXPECT_FALSE(hopper_takes(odd_stride));
  FlashParams misaligned = p;
  misaligned.q.data = static_cast<uint8_t*>(misaligned.q.data) + 8;
  EXPECT_FALSE(hopper_takes(misaligned));
  try {
    hopper_run(misaligned);
    ADD_FAILURE() << "a misaligned q was launched";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("q data at"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is not 16-byte aligned"), std::string::npos) << e.what();
  }
  // Required but refused for a reason of its own: the message names the call and the reason.
  FlashParams no_scale = p;
  no_scale.scale = 0.f;
  try {
    hopper_run(no_scale);
    ADD_FAILURE() << "a call with scale 0 was launched on the Hopper kernel";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RINGATTN_FLASH_KERNEL=hopper, but the Hopper kernel does not take this call"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("it needs a positive softmax scale"), std::string::npos) << e.what();
  }
}

// The tile order on the host (no GPU): over every launch shape below, each (batch, head, query
// block) comes exactly once and each row of [0, q_len) lies in exactly one tile; a causal order's
// short query block is its first; a section holds whole KV heads; the causal order is longest
// first within each section, and a window without the causal edge goes first query block first.
cuda::hopper::HopperParams order_params(int batch, int q_heads, int group, int q_len, int kv_len, int block_m, int block_n,
                                  MaskSpec mask, int section) {
  cuda::hopper::HopperParams p{};
  p.batch = batch;
  p.q_heads = q_heads;
  p.kv_heads = q_heads / group;
  p.group = group;
  p.q_len = q_len;
  p.kv_len = kv_len;
  p.mask = clamp_offset(mask, q_len, kv_len);
  p.block_m = block_m;
  p.block_n = block_n;
  p.m_blocks = (q_len + block_m - 1) / block_m;
  p.num_tiles = p.m_blocks * batch * q_heads;
  p.m_shift = cuda::hopper::query_shift(p.mask, q_len, block_m, block_n);
  p.section_heads = section;
  return p;
}

// The consumers advance each k-step's wgmma descriptor from the first one's (desc_advance) instead
// of rebuilding it (smem_desc_sw128). Brute force: for every 16-byte-aligned address and every
// offset up to 64 KB (the largest k-step offset is 48 KB: head dim 256's Q) whose sum stays below
// the descriptor's address limit, the two agree, for a K-major operand (every address) and an
// N-major one (every 1 KB swizzle atom); at the limit they do not, so the limit is real; every
// shared-memory plan lies below it.
TEST(HopperDescriptor, AdvanceEqualsRebuildBelowTheAddressLimit) {
  using cuda::hopper::desc_advance;
  using cuda::hopper::kDescAddressLimit;
  using cuda::hopper::smem_desc_sw128;
  static_assert(kDescAddressLimit >= 227u * 1024u, "a CTA's shared memory on sm_90");
  long long checked = 0, differ = 0;
  const auto sweep = [&](uint32_t addr_step, uint32_t lead) {
    for (uint32_t addr = 0; addr < kDescAddressLimit; addr += addr_step) {
      const uint64_t d0 = smem_desc_sw128(addr, lead, 1024);
      for (uint32_t off = 0; off <= 65536 && addr + off < kDescAddressLimit; off += 16, ++checked)
        differ += desc_advance(d0, off) != smem_desc_sw128(addr + off, lead, 1024);
    }
  };
  sweep(16, 16);           // K-major: the leading offset is unused
  sweep(1024, 176 * 128);  // N-major V of a 128x176 tile: the leading offset steps between column blocks
  EXPECT_EQ(differ, 0) << "of " << checked << " (address, offset) pairs";
  EXPECT_GT(checked, 50000000);
  EXPECT_NE(desc_advance(smem_desc_sw128(kDescAddressLimit - 16, 16, 1024), 16), smem_desc_sw128(kDescAddressLimit, 16, 1024));
}

TEST(HopperTileOrder, EveryTileOnceSectionByLongestFirst) {
  struct Shape {
    int batch, q_heads, group, q_len, kv_len, block_m, block_n;
    MaskSpec mask;
  };
  const Shape shapes[] = {
      {4, 32, 4, 2048, 2048, 128, 128, {true, 0, -1}},   {4, 32, 1, 4096, 4096, 192, 128, {true, 0, -1}},
      {1, 32, 4, 8192, 8192, 128, 176, {true, 0, -1}},   {2, 6, 1, 520, 520, 192, 128, {true, 0, -1}},
      {1, 8, 2, 700, 700, 128, 128, {true, 0, 37}},      {2, 4, 2, 300, 500, 192, 128, {false, 150, 200}},
      {1, 4, 2, 130, 700, 128, 128, {true, 570, -1}},    {3, 8, 8, 300, 250, 128, 128, {true, -100, -1}},
      {2, 8, 2, 1000, 1000, 128, 128, {false, 0, -1}},  {1, 5, 1, 300, 300, 128, 128, {true, 0, -1}},
  };
  for (const Shape& sh : shapes) {
    const int bh = sh.batch * sh.q_heads;
    for (int section : {sh.group, 2 * sh.group, 3 * sh.group, bh}) {
      if (section > bh) continue;
      const cuda::hopper::HopperParams p =
          order_params(sh.batch, sh.q_heads, sh.group, sh.q_len, sh.kv_len, sh.block_m, sh.block_n, sh.mask, section);
      SCOPED_TRACE("batch " + std::to_string(sh.batch) + " heads " + std::to_string(sh.q_heads) + " q_len " +
                   std::to_string(sh.q_len) + " section " + std::to_string(section));
      std::vector<int> seen(size_t(p.num_tiles), 0), rows(size_t(bh * sh.q_len), 0);
      int prev_section = -1, prev_mb = -1, prev_blocks = 0;
      for (int t = 0; t < p.num_tiles; ++t) {
        const cuda::hopper::Tile tile = cuda::hopper::decode_tile(p, t);
        ASSERT_GE(tile.b, 0);
        ASSERT_LT(tile.b, sh.batch);
        ASSERT_GE(tile.h, 0);
        ASSERT_LT(tile.h, sh.q_heads);
        ASSERT_EQ((tile.m0 + p.m_shift) % sh.block_m, 0);
        const int mb = (tile.m0 + p.m_shift) / sh.block_m, slot = tile.b * sh.q_heads + tile.h;
        ASSERT_LT(mb, p.m_blocks);
        ++seen[size_t(slot * p.m_blocks + mb)];
        for (int r = std::max(tile.m0, 0); r < std::min(tile.m0 + sh.block_m, sh.q_len); ++r)
          ++rows[size_t(slot * sh.q_len + r)];
        // The causal order's short block (q_len off the tile) is the head's first, up to the rows
        // under gcd(block_m, block_n) that stay past the end (query_shift); others start at 0.
        EXPECT_EQ(tile.m0, mb * sh.block_m - p.m_shift) << "tile " << t;
        if (sh.mask.causal) {
          const int g = std::gcd(sh.block_m, sh.block_n), past_end = p.m_blocks * sh.block_m - p.m_shift - sh.q_len;
          EXPECT_EQ(p.m_shift % g, 0);
          EXPECT_GE(past_end, 0);
          EXPECT_LT(past_end, g);
        } else {
          EXPECT_EQ(p.m_shift, 0);
        }
        if (!sh.mask.causal && !sh.mask.windowed()) continue;  // head by head: no sections
        const int sec = slot / section;
        if (sec != prev_section) {
          EXPECT_EQ(sec, prev_section + 1) << "tile " << t << ": sections in order";
          prev_section = sec, prev_mb = -1, prev_blocks = 0;
        } else if (sh.mask.causal) {
          EXPECT_LE(mb, prev_mb) << "tile " << t << ": the last query blocks first";
          EXPECT_LE(tile.n_blocks, prev_blocks) << "tile " << t << ": longest first within a section";
        } else {
          EXPECT_GE(mb, prev_mb) << "tile " << t << ": the first query blocks first";
        }
        prev_mb = mb;
        prev_blocks = tile.n_blocks;
      }
      for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "tile slot " << i;
      for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], 1) << "row " << i % sh.q_len << " of slot " << i / sh.q_len;
    }
  }
}

// The causal order's short query block goes first (query_shift): the key blocks that the tiles
// visit, summed over a head, never exceed those of the unshifted order, nor do the blocks that need
// the element mask; at batch 4 x 4k at head dim 64 (192-row tiles: 4096 = 21 x 192 + 64) the last
// tile's 32 blocks for 64 rows become a first tile of 1 block: 363 blocks per head instead of 384
// (5.8% fewer). The shift is a multiple of gcd(block_m, block_n): none on 128 x 128 tiles. Other
// masks take no shift.
TEST(HopperTileOrder, ShortCausalBlockFirst) {
  struct Sums {
    long long blocks = 0, masked = 0;
  };
  auto sums = [](const cuda::hopper::HopperParams& p) {
    Sums s;
    for (int t = 0; t < p.num_tiles; ++t) {
      const cuda::hopper::Tile tile = cuda::hopper::decode_tile(p, t);
      s.blocks += tile.n_blocks;
      for (int i = 0; i < tile.n_blocks; ++i) {
        const int nb = tile.block(i);
        s.masked += nb * p.block_n < tile.full_begin || (nb + 1) * p.block_n > tile.full_end;
      }
    }
    return s;
  };
  for (int q_len : {1, 64, 191, 192, 193, 300, 450, 1000, 4096, 6000, 8192})
    for (int block_m : {128, 192})
      for (int block_n : {80, 128, 176})
        for (int64_t q_offset : {0, 37, 500}) {
          cuda::hopper::HopperParams p =
              order_params(1, 2, 1, q_len, q_len + int(q_offset), block_m, block_n, MaskSpec{true, q_offset, -1}, 2);
          SCOPED_TRACE("q_len " + std::to_string(q_len) + " tile " + std::to_string(block_m) + "x" +
                       std::to_string(block_n) + " q_offset " + std::to_string(q_offset));
          const int g = std::gcd(block_m, block_n);
          EXPECT_EQ(p.m_shift, (block_m - q_len % block_m) % block_m / g * g);
          cuda::hopper::HopperParams unshifted = p;
          unshifted.m_shift = 0;
          const Sums a = sums(p), b = sums(unshifted);
          EXPECT_LE(a.blocks, b.blocks);
          EXPECT_LE(a.masked, b.masked);
        }
  cuda::hopper::HopperParams p = order_params(1, 1, 1, 4096, 4096, 192, 128, MaskSpec{true, 0, -1}, 1);
  EXPECT_EQ(p.m_shift, 128);
  cuda::hopper::HopperParams unshifted = p;
  unshifted.m_shift = 0;
  EXPECT_EQ(sums(unshifted).blocks, 384);  // tile m (rows 192m..): ceil(min(192m + 192, 4096) / 128) blocks
  EXPECT_EQ(sums(p).blocks, 363);          // tile m (rows 192m - 128..): ceil((192m + 64) / 128) blocks
  EXPECT_EQ(cuda::hopper::query_shift(MaskSpec{true, 0, -1}, 6000, 128, 128), 0);   // 16 short rows: under 128
  EXPECT_EQ(cuda::hopper::query_shift(MaskSpec{true, 0, -1}, 6000, 128, 176), 16);  // gcd 16
  EXPECT_EQ(cuda::hopper::query_shift(MaskSpec{true, 0, -1}, 8192, 192, 128), 64);
  EXPECT_EQ(cuda::hopper::query_shift(MaskSpec{false, 0, -1}, 300, 128, 128), 0);
  EXPECT_EQ(cuda::hopper::query_shift(MaskSpec{false, 0, 50}, 300, 192, 128), 0);
  EXPECT_EQ(cuda::hopper::query_shift(MaskSpec{true, 0, 50}, 300, 192, 128), 64);
}

// Where tiles_pair says the tiles pair, tiles 2i and 2i + 1 of every order read one KV head of one
// batch and visit the same key blocks with the same bounds, and the rows' visible ends at each
// tile's last row agree (the consumers' half-block choice): full, causal (with offsets, shifted
// first blocks, rows that see no key), windowed with and without the causal edge, GQA groups 2 to
// 8, one section or several, both c2 tile shapes. Where it says no (an odd number of query blocks
// under a full mask, an odd group otherwise), some pair of that order does not.
TEST(HopperTileOrder, ClusterPairsShareAKvHeadAndKeyBlocks) {
  struct Shape {
    int batch, q_heads, group, q_len, kv_len;
    MaskSpec mask;
  };
  const Shape shapes[] = {
      {2, 4, 2, 1024, 1024, {}},          {1, 8, 4, 1000, 700, {}},           {1, 2, 1, 512, 333, {}},
      {1, 4, 1, 384, 384, {}},            {2, 8, 4, 1000, 1000, {true, 0, -1}}, {1, 8, 8, 300, 900, {true, 600, -1}},
      {1, 4, 2, 400, 100, {true, -250, -1}}, {2, 6, 2, 700, 700, {true, 0, 37}}, {1, 4, 2, 500, 800, {false, 150, 200}},
      {1, 6, 3, 600, 600, {true, 0, -1}}, {2, 4, 1, 256, 256, {true, 0, 64}},
  };
  int pairs_checked = 0, refused_with_a_bad_pair = 0;
  for (const Shape& sh : shapes)
    for (const auto [block_m, block_n] : {std::pair{128, 176}, std::pair{128, 128}}) {
      const int bh = sh.batch * sh.q_heads;
      for (const int section : {bh, sh.group, 2 * sh.group}) {
        if (section > bh || section % sh.group != 0) continue;
        const cuda::hopper::HopperParams p =
            order_params(sh.batch, sh.q_heads, sh.group, sh.q_len, sh.kv_len, block_m, block_n, sh.mask, section);
        SCOPED_TRACE("batch " + std::to_string(sh.batch) + " heads " + std::to_string(sh.q_heads) + " group " +
                     std::to_string(sh.group) + " q_len " + std::to_string(sh.q_len) + " tile " +
                     std::to_string(block_m) + "x" + std::to_string(block_n) + " section " + std::to_string(section));
        const bool pair = cuda::hopper::tiles_pair(p.mask, sh.group, p.m_blocks, 2);
        bool all_share = p.num_tiles % 2 == 0;
        for (int t = 0; t + 1 < p.num_tiles; t += 2) {
          const cuda::hopper::Tile a = cuda::hopper::decode_tile(p, t), b = cuda::hopper::decode_tile(p, t + 1);
          const auto last_end = [&](const cuda::hopper::Tile& x) {
            return visible_range(p.mask, std::min(x.m0 + block_m, p.q_len) - 1, p.kv_len).end;
          };
          const bool share = a.b == b.b && a.h / sh.group == b.h / sh.group && a.n_begin == b.n_begin &&
                             a.n_blocks == b.n_blocks && a.full_begin == b.full_begin && a.full_end == b.full_end &&
                             last_end(a) == last_end(b);
          all_share = all_share && share;
          if (pair) {
            EXPECT_TRUE(share) << "tiles " << t << " and " << t + 1;
            ++pairs_checked;
          }
        }
        if (!pair && !all_share) ++refused_with_a_bad_pair;
        if (!pair) EXPECT_FALSE(all_share) << "tiles_pair refused an order whose pairs all share";
      }
    }
  EXPECT_GT(pairs_checked, 1000);
  EXPECT_GT(refused_with_a_bad_pair, 4);
}

// Sections of whole KV heads, as even as they go, K and V of one section within half the L2 (one
// KV head when even that is too much; every head in one section when all K and V fit the L2).
TEST(HopperTileOrder, SectionHeads) {
  const int64_t l2 = 60ll << 20;  // the H200's
  // batch 4 x 4k, head dim 64, 32/32 heads: 30 KV heads of 1 MB fit; 128 slots in 5 sections of 26.
  EXPECT_EQ(cuda::hopper::section_heads(128, 1, 4096, 64, 2, l2), 26);
  // batch 4 x 2k, head dim 128, 32/8 heads: all K and V (32 MB) within the L2, one section.
  EXPECT_EQ(cuda::hopper::section_heads(128, 4, 2048, 128, 2, l2), 128);
  // 8k, 32/8 heads: 32 MB, one section; at 16k (64 MB) 3 KV heads of 8 MB fit: 32 in 3 of 12.
  EXPECT_EQ(cuda::hopper::section_heads(32, 4, 8192, 128, 2, l2), 32);
  EXPECT_EQ(cuda::hopper::section_heads(32, 4, 16384, 128, 2, l2), 12);
  // 32k: one 16 MB KV head (4 slots) per section.
  EXPECT_EQ(cuda::hopper::section_heads(32, 4, 32768, 128, 2, l2), 4);
  // 128k: a KV head (64 MB) is over the budget; still one per section.
  EXPECT_EQ(cuda::hopper::section_heads(32, 4, 131072, 128, 2, l2), 4);
  // Head dim 256, batch 4 x 2k, 16/8 heads: 15 KV heads of 2 MB (30 slots); 64 in 3 of 22.
  EXPECT_EQ(cuda::hopper::section_heads(64, 2, 2048, 256, 2, l2), 22);
  // 5 KV heads of 4 q heads, 2 KV heads (15 MB each) fit: 3 sections, 7 slots rounded up to 8.
  EXPECT_EQ(cuda::hopper::section_heads(20, 4, 30720, 128, 2, l2), 8);
  // Everything fits: one section; just over the L2: sections.
  EXPECT_EQ(cuda::hopper::section_heads(32, 4, 1024, 128, 2, l2), 32);
  EXPECT_EQ(cuda::hopper::section_heads(16, 1, 7680, 128, 2, l2), 16);  // 16 x 3.75 MB = 60 MB
  EXPECT_EQ(cuda::hopper::section_heads(16, 1, 7681, 128, 2, l2), 6);  // 7 KV heads fit half: 3 of 6
  // An L2 size of 0 (unknown): one KV head per section.
  EXPECT_EQ(cuda::hopper::section_heads(16, 2, 1024, 128, 2, 0), 2);
  for (int bh : {1, 7, 64, 130})
    for (int group : {1, 2, 8})
      for (int64_t keys : {1, 300, 100000}) {
        const int s = cuda::hopper::section_heads(bh * group, group, keys, 128, 2, l2);
        EXPECT_GE(s, group);
        EXPECT_LE(s, bh * group);
        EXPECT_EQ(s % group, 0);
      }
}

}  // namespace
}  // namespace ringattn::test
