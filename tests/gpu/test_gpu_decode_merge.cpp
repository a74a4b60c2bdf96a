// Split-KV decode (== the unsplit flash, == the oracle; sliding windows too), the merge kernel
// (== the CPU merge on empty, one-empty and far-apart states), finalize and fill_empty on the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>

#include "gpu/gpu_test_util.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "core/error.hpp"

namespace ringattn {
namespace {

using test::DeviceState;
using test::DeviceTensor;
using test::HostState;
using test::HostTensor;
class CudaStateOps : public test::GpuTest {};
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct DecodeCase {
  const char* name;
  int64_t batch, kv_heads, group, q_len, kv_len;
  bool causal;
  int64_t q_offset;
  int64_t window = -1;  // >= 0: the mask's lower edge (MaskSpec::window)
};
const DecodeCase kDecodeCases[] = {
    {"gqa4_q1", 2, 2, 4, 1, 3001, false, 0},
    {"gqa8_q3_causal", 1, 1, 8, 3, 2500, true, 2000},  // keys past 2002 are invisible to all rows
    {"gqa8_q5_three_row_blocks", 1, 2, 8, 5, 700, true, 695},
    {"mha_q2", 1, 4, 1, 2, 129, false, 0},
    // 64 packed rows and more: wide row blocks (a warp per 16 rows over all keys of a tile).
    {"gqa4_q16_wide", 2, 2, 4, 16, 3001, true, 2985},
    {"gqa8_q9_wide_two_blocks", 1, 2, 8, 9, 1000, true, 991},  // 72 rows: the second block's 8 rows, 3 warps idle
    {"mha_q70_wide_full", 1, 1, 1, 70, 500, false, 0},
};
// Sliding windows: the splits cover only the band, keys below it are never loaded.
const DecodeCase kWindowDecodeCases[] = {
    {"gqa4_q1_window700", 2, 2, 4, 1, 3001, true, 3000, 700},
    {"gqa8_q3_window0", 1, 1, 8, 3, 500, true, 497, 0},  // one key per row
    {"gqa8_q5_window33_three_row_blocks", 1, 2, 8, 5, 2000, true, 1995, 33},
    {"gqa8_q3_window1_keys_past_end", 1, 1, 8, 3, 2500, true, 2000, 1},
    {"mha_q3_lower_edge_only", 1, 4, 1, 3, 1500, false, 1000, 200},  // rows see keys i + 800 ..
    {"gqa4_q4_lower_edge_rows_without_keys", 1, 1, 4, 4, 300, false, 299, 0},  // rows 1..3 see none
    {"gqa4_q20_window50_wide", 1, 2, 4, 20, 2000, true, 1980, 50},
    {"gqa4_q16_lower_edge_only_wide", 1, 1, 4, 16, 900, false, 800, 100},
};

class DecodeSplits : public test::GpuTestP<std::tuple<DType, int>> {};

// Decode of dp with the final output asked for (FlashParams::out: the split merge casts it in
// the same launch) writes, byte for byte, what the same decode's state then finalize gives, into
// a poisoned output; the state it leaves equals that decode's too. `init`: the incoming state
// (Fold), else none.
void expect_fused_out_equals_cast(Backend& be, DecodeParams dp, const HostState* init) {
  const FlashParams& f = dp.flash;
  const int64_t B = f.q.batch, H = f.q.heads, T = f.q.len, D = f.q.dim;
  const size_t bytes = size_t(B * H * T * D) * size_t(dtype_size(f.q.dtype));
  DeviceState plain(be, B, H, T, D, init), fused(be, B, H, T, D, init);
  DeviceBuffer cast(be, bytes), out(be, bytes);
  const std::vector<uint8_t> poison(bytes, 0xff);  // NaN in every dtype
  be.copy_from_host(cast.get(), poison.data(), bytes);
  be.copy_from_host(out.get(), poison.data(), bytes);
  dp.flash.state = plain.view;
  be.decode(dp);
  be.finalize(FinalizeParams{plain.view, bhtd_view(cast.get(), f.q.dtype, B, H, T, D)});
  dp.flash.state = fused.view;
  dp.flash.out = bhtd_view(out.get(), f.q.dtype, B, H, T, D);
  be.decode(dp);
  std::vector<uint8_t> want(bytes), got(bytes);
  be.synchronize();
  be.copy_to_host(want.data(), cast.get(), bytes);
  be.copy_to_host(got.data(), out.get(), bytes);
  size_t diff = 0;
  for (size_t i = 0; i < bytes; ++i) diff += want[i] != got[i];
  EXPECT_EQ(diff, 0u) << "bytes of the fused output that differ from state + finalize";
  std::vector<float> po, pl, fo, fl;
  plain.read(be, po, pl);
  fused.read(be, fo, fl);
  EXPECT_EQ(0, std::memcmp(po.data(), fo.data(), po.size() * 4)) << "state o";
  EXPECT_EQ(0, std::memcmp(pl.data(), fl.data(), pl.size() * 4)) << "state lse";
  if (init != nullptr || dp.flash.mode != StateMode::Write) return;
  // Without an fp32 o (DecodeParams: the op's decode, which then needs no scratch): the same
  // output bytes and lse, and the o buffer beside it untouched (still NaN).
  DeviceState lse_only(be, B, H, T, D);
  DeviceBuffer out2(be, bytes);
  be.copy_from_host(out2.get(), poison.data(), bytes);
  dp.flash.state = lse_only.view;
  dp.flash.state.o = nullptr;
  dp.flash.out = bhtd_view(out2.get(), f.q.dtype, B, H, T, D);
  be.decode(dp);
  be.synchronize();
  be.copy_to_host(got.data(), out2.get(), bytes);
  diff = 0;
  for (size_t i = 0; i < bytes; ++i) diff += want[i] != got[i];
  EXPECT_EQ(diff, 0u) << "bytes of the output without an fp32 o that differ from state + finalize";
  std::vector<float> no, nl;
  lse_only.read(be, no, nl);
  EXPECT_EQ(0, std::memcmp(pl.data(), nl.data(), pl.size() * 4)) << "lse without an fp32 o";
  EXPECT_EQ(size_t(std::count_if(no.begin(), no.end(), [](float x) { return std::isnan(x); })), no.size())
      << "the o buffer that was not passed was written";
}

// Decode of case c split 1, 3, default and 50 ways against the unsplit flash and the fp64 oracle,
// on fresh random inputs and NaN-poisoned states. At head dim 256 in bf16/fp16 against the oracle
// only: the 16-bit forward there is the Hopper kernel's alone, and this test is about decode.
void check_decode_case(Backend& be, const DecodeCase& c, DType dtype, int dim, std::mt19937_64& rng,
                       uint64_t seed) {
  const bool vs_flash = dtype == DType::F32 || dim <= 128;
  const int64_t hq = c.kv_heads * c.group;
  HostTensor q(dtype, c.batch, hq, c.q_len, dim, rng), k(dtype, c.batch, c.kv_heads, c.kv_len, dim, rng),
      v(dtype, c.batch, c.kv_heads, c.kv_len, dim, rng);
  DeviceTensor dq(be, q), dk(be, k), dv(be, v);
  FlashParams p;
  p.q = dq.view;
  p.k = dk.view;
  p.v = dv.view;
  p.scale = 1.f / std::sqrt(float(dim));
  p.mask = MaskSpec{c.causal, c.q_offset, c.window};
  DeviceState whole(be, c.batch, hq, c.q_len, dim);
  std::vector<float> wo, wl;
  if (vs_flash) {
    p.state = whole.view;
    be.flash(p);
    whole.read(be, wo, wl);
  }
  FlashParams hp = p;
  hp.q = q.view;
  hp.k = k.view;
  hp.v = v.view;
  const cpu::Reference ref = cpu::naive_attention(hp);
  for (int splits : {1, 3, 0, 50}) {
    DeviceState part(be, c.batch, hq, c.q_len, dim);
    DecodeParams dp{p, splits};
    dp.flash.state = part.view;
    be.decode(dp);
    std::vector<float> so, sl;
    part.read(be, so, sl);
    SCOPED_TRACE(::testing::Message() << "case " << c.name << " dtype " << dtype_name(dtype) << " dim " << dim
                                      << " splits " << splits << " seed " << seed);
    std::vector<double> wod(wo.begin(), wo.end()), wld(wl.begin(), wl.end());
    if (dtype == DType::F32) {
      EXPECT_LT(test::rel_error(so, wod), 1e-5);
      EXPECT_LT(test::max_abs_error(sl, wld), 2e-5);
      EXPECT_LT(test::rel_error(so, ref.o), 1e-5);
    } else {
      // Each split rounds its probabilities to bf16/fp16 against its own maximum.
      if (vs_flash) {
        EXPECT_LT(test::rel_error(so, wod), 1e-2);
        EXPECT_LT(test::max_abs_error(sl, wld), 1e-3);
      }
      EXPECT_LT(test::rel_error(so, ref.o), 1e-2);
      const double naive = test::rel_error(test::naive_same_dtype(hp), ref.o);
      EXPECT_LE(test::rel_error(so, ref.o), test::same_dtype_bound(naive)) << "naive same-dtype error " << naive;
    }
    EXPECT_LT(test::max_abs_error(sl, ref.lse), dtype == DType::F32 ? 2e-5 : 1e-3);
    expect_fused_out_equals_cast(be, DecodeParams{p, splits}, nullptr);
  }
}

TEST_P(DecodeSplits, SplitEqualsUnsplitAndOracle) {
  const auto [dtype, dim] = GetParam();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (const DecodeCase& c : kDecodeCases) check_decode_case(*be, c, dtype, dim, rng, seed);
}

TEST_P(DecodeSplits, SlidingWindowSplitEqualsUnsplitAndOracle) {
  const auto [dtype, dim] = GetParam();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (const DecodeCase& c : kWindowDecodeCases) check_decode_case(*be, c, dtype, dim, rng, seed);
}

INSTANTIATE_TEST_SUITE_P(DtypesAndDims, DecodeSplits,
                         ::testing::Combine(::testing::Values(DType::BF16, DType::F16, DType::F32),
                                            ::testing::Values(64, 128, 256)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_d" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The plan takes wide row blocks (64 packed rows a CTA) from 64 packed rows on, at head dims 64 and
// 128 only, and counts its row blocks in those units. 16-row blocks at head dims 64 and 128 cut the
// band into 128-key tiles (the phased kernel), the rest into 64-key tiles.
TEST_F(CudaStateOps, DecodePlanWideRowBlocks) {
  auto plan = [](int64_t heads, int64_t kv_heads, int64_t q_len, int64_t dim) {
    FlashParams f;
    f.q = bhtd_view(nullptr, DType::BF16, 1, heads, q_len, dim);
    f.k = f.v = bhtd_view(nullptr, DType::BF16, 1, kv_heads, 4096, dim);
    return cuda::plan_decode_mma(f, 2, 132);
  };
  const cuda::DecodePlan narrow = plan(32, 8, 15, 128), wide = plan(32, 8, 16, 128), wide2 = plan(32, 8, 17, 64),
                         d256 = plan(32, 8, 16, 256);
  EXPECT_FALSE(narrow.wide);
  EXPECT_EQ(narrow.row_blocks, 4);  // 60 rows in 16s
  EXPECT_TRUE(wide.wide);
  EXPECT_EQ(wide.row_blocks, 1);
  EXPECT_TRUE(wide2.wide);
  EXPECT_EQ(wide2.row_blocks, 2);  // 68 rows in 64s
  EXPECT_FALSE(d256.wide);
  EXPECT_EQ(d256.row_blocks, 4);
  const cuda::DecodePlan narrow64 = plan(32, 8, 1, 64);
  EXPECT_EQ(narrow.tile_keys, 128);
  EXPECT_EQ(narrow.tiles, 32);  // 4096 keys
  EXPECT_EQ(narrow64.tile_keys, 128);
  EXPECT_EQ(wide.tile_keys, 64);
  EXPECT_EQ(wide.tiles, 64);
  EXPECT_EQ(d256.tile_keys, 64);
  // 2 splits asked, tiles dealt round robin: 16 each.
  EXPECT_EQ(narrow.splits, 2);
  // Half-tile buffers: two where they fit more CTAs per SM (head dim 128) and a split keeps 16
  // tiles or more, else three; none outside the phased kernel.
  EXPECT_EQ(narrow.phased_bufs, 2);
  EXPECT_EQ(narrow64.phased_bufs, 3);  // 3 CTAs per SM with either
  EXPECT_EQ(wide.phased_bufs, 0);
  EXPECT_EQ(d256.phased_bufs, 0);
  auto plan_default = [](int64_t kv_len) {
    FlashParams f;
    f.q = bhtd_view(nullptr, DType::BF16, 1, 32, 1, 128);
    f.k = f.v = bhtd_view(nullptr, DType::BF16, 1, 8, kv_len, 128);
    return cuda::plan_decode_mma(f, 0, 132);
  };
  const cuda::DecodePlan short_splits = plan_default(32768), long_splits = plan_default(131072);
  EXPECT_EQ(short_splits.phased_bufs, 3);
  EXPECT_EQ(short_splits.splits, 32);  // one wave of 2 CTAs per SM over 8 KV heads
  EXPECT_EQ(long_splits.phased_bufs, 2);
  EXPECT_EQ(long_splits.splits, 49);  // 3 CTAs per SM: 1024 tiles, 21 a split
}

// Back-to-back decodes with no synchronization between them, with different split counts (each
// grows or reuses the partials' workspace under work still queued), in Write and Fold mode, each
// against the fp64 oracle.
TEST_F(CudaStateOps, BackToBackDecodesWithDifferentSplits) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t B = 2, HKV = 4, G = 4, T = 1, S = 30000, D = 128;
  HostTensor q(DType::BF16, B, HKV * G, T, D, rng), k(DType::BF16, B, HKV, S, D, rng), v(DType::BF16, B, HKV, S, D, rng);
  DeviceTensor dq(*be, q), dk(*be, k), dv(*be, v);
  FlashParams p;
  p.q = dq.view;
  p.k = dk.view;
  p.v = dv.view;
  p.scale = 1.f / std::sqrt(float(D));
  FlashParams hp = p;
  hp.q = q.view;
  hp.k = k.view;
  hp.v = v.view;
  const cpu::Reference ref = cpu::naive_attention(hp);
  // Fold onto the empty state: the same result, through the Fold arithmetic.
  HostState empty(B, HKV * G, T, D);
  std::fill(empty.o.begin(), empty.o.end(), 0.f);
  std::fill(empty.lse.begin(), empty.lse.end(), kNegInf);
  const int splits[] = {5, 90, 63, 1, 90, 40};
  std::vector<std::unique_ptr<DeviceState>> states;
  for (size_t i = 0; i < std::size(splits); ++i) {
    const bool fold = i % 2 == 1;
    states.push_back(std::make_unique<DeviceState>(*be, B, HKV * G, T, D, fold ? &empty : nullptr));
    DecodeParams dp{p, splits[i]};
    dp.flash.mode = fold ? StateMode::Fold : StateMode::Write;
    dp.flash.state = states.back()->view;
    be->decode(dp);
  }
  for (size_t i = 0; i < std::size(splits); ++i) {
    std::vector<float> so, sl;
    states[i]->read(*be, so, sl);
    SCOPED_TRACE(::testing::Message() << "call " << i << ", splits " << splits[i] << ", seed " << seed);
    EXPECT_LT(test::rel_error(so, ref.o), 1e-2);
    EXPECT_LT(test::max_abs_error(sl, ref.lse), 1e-3);
  }
}

// Decode in Fold mode equals flash in Fold mode on the same incoming state.
TEST_F(CudaStateOps, DecodeFoldEqualsFlashFold) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t B = 2, HKV = 2, HQ = 8, T = 1, S = 5000, D = 128;
  HostTensor q(DType::BF16, B, HQ, T, D, rng), k(DType::BF16, B, HKV, S, D, rng), v(DType::BF16, B, HKV, S, D, rng);
  HostState init(B, HQ, T, D);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& x : init.o) x = n(rng);
  for (size_t r = 0; r < init.lse.size(); ++r) init.lse[r] = r % 3 == 0 ? kNegInf : 8.f + n(rng);
  for (size_t r = 0; r < init.lse.size(); r += 3) std::fill(init.o.begin() + long(r * D), init.o.begin() + long((r + 1) * D), 0.f);
  DeviceTensor dq(*be, q), dk(*be, k), dv(*be, v);
  DeviceState a(*be, B, HQ, T, D, &init), b(*be, B, HQ, T, D, &init);
  FlashParams p;
  p.q = dq.view;
  p.k = dk.view;
  p.v = dv.view;
  p.scale = 0.088f;
  p.mode = StateMode::Fold;
  p.state = a.view;
  be->flash(p);
  DecodeParams dp{p, 0};
  dp.flash.state = b.view;
  be->decode(dp);
  std::vector<float> ao, al, bo, bl;
  a.read(*be, ao, al);
  b.read(*be, bo, bl);
  std::vector<double> aod(ao.begin(), ao.end()), ald(al.begin(), al.end());
  EXPECT_LT(test::rel_error(bo, aod), 1e-2) << "seed " << seed;
  EXPECT_LT(test::max_abs_error(bl, ald), 1e-3) << "seed " << seed;
  // The fused output in Fold mode (every third incoming row empty), default and 50 splits.
  for (int splits : {0, 50}) {
    SCOPED_TRACE(::testing::Message() << "fused out, splits " << splits << " seed " << seed);
    expect_fused_out_equals_cast(*be, DecodeParams{p, splits}, &init);
  }
}

// Random states with chosen rows: empty/empty, empty/full, full/empty, far apart both ways.
HostState merge_input(std::mt19937_64& rng, int64_t rows, int64_t d, bool second) {
  HostState s(1, 1, rows, d);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& x : s.o) x = n(rng);
  for (int64_t r = 0; r < rows; ++r) {
    float& l = s.lse[size_t(r)];
    l = 2.f * n(rng);
    const int kind = int(r % 6);
    if (kind == 0 || (kind == 1 && !second) || (kind == 2 && second)) l = kNegInf;
    if (kind == 3) l = second ? 250.f : 0.f;
    if (kind == 4) l = second ? -150.f : 100.f;
    if (l == kNegInf) std::fill(s.o.begin() + r * d, s.o.begin() + (r + 1) * d, 0.f);
  }
  return s;
}

TEST_F(CudaStateOps, MergeEqualsCpuMerge) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  for (int64_t d : {64, 128, 40}) {
    const int64_t rows = 600;
    HostState a = merge_input(rng, rows, d, false), b = merge_input(rng, rows, d, true);
    DeviceState da(*be, 1, 1, rows, d, &a), db(*be, 1, 1, rows, d, &b);
    be->merge(MergeParams{da.view, db.view});
    std::vector<float> go, gl;
    da.read(*be, go, gl);
    cpu::merge_states(MergeParams{a.view, b.view});
    std::vector<double> co(a.o.begin(), a.o.end()), cl(a.lse.begin(), a.lse.end());
    EXPECT_LT(test::max_abs_error(go, co), 1e-5) << "seed " << seed << " d " << d;
    EXPECT_LT(test::max_abs_error(gl, cl), 1e-5) << "seed " << seed << " d " << d;
    for (int64_t r = 0; r < rows; r += 6) EXPECT_EQ(gl[size_t(r)], kNegInf) << "both empty must stay empty";
  }
}

// The ring backward's accumulator kernels: zero a strided fp32 view, add a contiguous one into a
// strided one, exactly (fp32 adds), elements outside the views untouched.
TEST_F(CudaStateOps, ZeroAndAddF32OnStridedViews) {
  std::mt19937_64 rng(test::fresh_seed());
  const int64_t B = 2, H = 3, T = 29, D = 40;
  HostTensor dst(DType::F32, B, H, T, D, rng, true), src(DType::F32, B, H, T, D, rng);  // bthd += bhtd
  DeviceTensor ddst(*be, dst), dsrc(*be, src);
  be->add_f32(ddst.view, dsrc.view);
  std::vector<float> got(dst.bytes.size() / 4);
  be->synchronize();
  be->copy_to_host(got.data(), ddst.buf.get(), dst.bytes.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t od = dst.view.offset(b, h, t) + d, os = src.view.offset(b, h, t) + d;
          const float want = reinterpret_cast<const float*>(dst.bytes.data())[od] +
                             reinterpret_cast<const float*>(src.bytes.data())[os];
          ASSERT_EQ(got[size_t(od)], want) << b << "," << h << "," << t << "," << d;
        }
  TensorView part = ddst.view.rows(5, 11);  // rows 5..15 of every (b, h)
  be->zero_f32(part);
  std::vector<float> after(got.size());
  be->synchronize();
  be->copy_to_host(after.data(), ddst.buf.get(), dst.bytes.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const size_t o = size_t(dst.view.offset(b, h, t) + d);
          ASSERT_EQ(after[o], t >= 5 && t < 16 ? 0.f : got[o]) << b << "," << h << "," << t << "," << d;
        }
  EXPECT_THROW(be->add_f32(ddst.view, part), InvalidArgument);
}

TEST_F(CudaStateOps, FinalizeCastsEveryElement) {
  std::mt19937_64 rng(test::fresh_seed());
  const int64_t B = 2, H = 3, T = 37, D = 64;
  HostState s(B, H, T, D);
  std::normal_distribution<float> n(0.f, 3.f);
  for (auto& x : s.o) x = n(rng);
  for (auto& x : s.lse) x = n(rng);
  DeviceState ds(*be, B, H, T, D, &s);
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    const size_t bytes = size_t(B * H * T * D * dtype_size(dt));
    std::vector<uint8_t> host(bytes, 0xff);  // poison: NaN in every dtype
    DeviceBuffer out(*be, bytes);
    be->copy_from_host(out.get(), host.data(), bytes);
    const TensorView view = bthd_view(out.get(), dt, B, H, T, D);  // strided output
    be->finalize(FinalizeParams{ds.view, view});
    be->synchronize();
    be->copy_to_host(host.data(), out.get(), bytes);
    const TensorView hv = bthd_view(host.data(), dt, B, H, T, D);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d) {
            const float want = s.o[size_t(((b * H + h) * T + t) * D + d)];
            const float got = load_as_float(host.data(), dt, hv.offset(b, h, t) + d);
            ASSERT_EQ(got, test::round_to(dt, want)) << dtype_name(dt) << " at " << b << "," << h << "," << t << "," << d;
          }
  }
}

TEST_F(CudaStateOps, FillEmptyWritesTheEmptyState) {
  DeviceState ds(*be, 2, 3, 50, 128);  // poisoned with NaN
  be->fill_empty(ds.view);
  std::vector<float> o, l;
  ds.read(*be, o, l);
  for (float x : o) ASSERT_EQ(x, 0.f);
  for (float x : l) ASSERT_EQ(x, kNegInf);
}

TEST_F(CudaStateOps, BackendBasics) {
  EXPECT_EQ(be->name(), "cuda:0");
  EXPECT_TRUE(be->device_memory());
  EXPECT_NE(be->stream(), nullptr);
  std::vector<int> src(1000), back(1000, -1);
  for (size_t i = 0; i < src.size(); ++i) src[i] = int(i * 7 + 3);
  DeviceBuffer a(*be, 4000), b(*be, 4000);
  be->copy_from_host(a.get(), src.data(), 4000);
  be->copy(b.get(), a.get(), 4000);
  be->copy_to_host(back.data(), b.get(), 4000);
  EXPECT_EQ(back, src);
  EXPECT_THROW(make_cuda_backend(1000), RuntimeError);
}

}  // namespace
}  // namespace ringattn
