// How a shard's K/V rows become a ring block (runner/ring/ring_buffers.hpp): pack_block copies the
// rows a block ships into the layout the ring's blocks travel in, whatever the rows' own strides.
// A part of a [B, T, H, D] shard with B > 1 is not dense in [B, T, H, D] (its batch stride is the
// whole shard's), and it used to be packed as [B, H, T, D] while the receiver read it as
// [B, T, H, D]: wrong keys on every other rank (found by the distributed PyTorch op).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "runner/ring/ring_buffers.hpp"

namespace ringattn {
namespace {

struct Shard {
  std::vector<float> data;
  TensorView view;
};

Shard random_shard(BlockLayout l, int64_t B, int64_t H, int64_t T, int64_t D, std::mt19937& rng) {
  Shard s;
  s.data.resize(size_t(B * H * T * D));
  std::normal_distribution<float> n;
  for (float& x : s.data) x = n(rng);
  s.view = l == BlockLayout::Bthd ? bthd_view(s.data.data(), DType::F32, B, H, T, D)
                                  : bhtd_view(s.data.data(), DType::F32, B, H, T, D);
  return s;
}

float at(const TensorView& x, int64_t b, int64_t h, int64_t t, int64_t d) {
  return static_cast<const float*>(x.data)[x.offset(b, h, t) + d];
}

TEST(RingBuffers, PackBlockKeepsTheRingsLayoutForAPartOfTheRows) {
  std::mt19937 rng(std::random_device{}());
  const auto cpu = make_cpu_backend();
  for (BlockLayout l : {BlockLayout::Bthd, BlockLayout::Bhtd})
    for (int64_t B : {1, 2, 3})
      for (int64_t H : {1, 2, 4})
        for (auto [first, rows] : {std::pair<int64_t, int64_t>{0, 7}, {2, 3}, {6, 1}, {0, 1}, {3, 4}}) {
          const Shard s = random_shard(l, B, H, 7, 5, rng);
          ASSERT_EQ(layout_of(s.view), H == 1 ? BlockLayout::Bhtd : l);
          const TensorView part = s.view.rows(first, rows);
          std::vector<float> block(size_t(B * H * rows * 5), std::nanf(""));  // poisoned
          pack_block(*cpu, block.data(), part, layout_of(s.view));
          const TensorView got = block_view(block.data(), part, layout_of(s.view));
          for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t t = 0; t < rows; ++t)
                for (int64_t d = 0; d < 5; ++d)
                  ASSERT_EQ(at(got, b, h, t, d), at(part, b, h, t, d))
                      << "layout " << int(l) << " B " << B << " H " << H << " rows [" << first << ", " << first + rows
                      << ") at " << b << "," << h << "," << t << "," << d;
        }
}

TEST(RingBuffers, PackBlockOfAStridedViewReadsBackInTheBlockLayout) {
  std::mt19937 rng(std::random_device{}());
  const auto cpu = make_cpu_backend();
  // Every other token of a [2, 8, 3, 4] tensor: strided, packed into [B, H, T, D] (Strided's block).
  Shard s = random_shard(BlockLayout::Bthd, 2, 3, 8, 4, rng);
  TensorView x = s.view;
  x.len = 4;
  x.stride_t *= 2;
  ASSERT_EQ(layout_of(x), BlockLayout::Strided);
  std::vector<float> block(size_t(2 * 3 * 4 * 4), std::nanf(""));
  pack_block(*cpu, block.data(), x, BlockLayout::Strided);
  const TensorView got = block_view(block.data(), x, BlockLayout::Strided);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t t = 0; t < 4; ++t)
        for (int64_t d = 0; d < 4; ++d) ASSERT_EQ(at(got, b, h, t, d), at(x, b, h, t, d));
}

}  // namespace
}  // namespace ringattn
