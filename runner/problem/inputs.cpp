#include "runner/problem/inputs.hpp"

#include <cmath>

namespace ringattn {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

float input_value(uint64_t seed, InputTensor which, int64_t b, int64_t h, int64_t global_t, int64_t d) {
  uint64_t x = mix(seed ^ (uint64_t(which) << 56));
  x = mix(x ^ uint64_t(b));
  x = mix(x ^ uint64_t(h));
  x = mix(x ^ uint64_t(global_t));
  x = mix(x ^ uint64_t(d));
  // Two uniforms from the 64 bits, then Box-Muller.
  const double u1 = (double((x >> 11) & ((1ull << 26) - 1)) + 0.5) / double(1ull << 26);
  const double u2 = double(x & ((1ull << 11) - 1)) / double(1ull << 11) + double((x >> 37) & 0x3ff) / double(1ull << 21);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void fill_input(const TensorView& x, uint64_t seed, InputTensor which, int64_t first, int64_t stride) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < x.batch; ++b)
    for (int64_t h = 0; h < x.heads; ++h)
      for (int64_t i = 0; i < x.len; ++i) {
        const int64_t off = x.offset(b, h, i);
        for (int64_t d = 0; d < x.dim; ++d)
          store_from_float(x.data, x.dtype, off + d, input_value(seed, which, b, h, first + i * stride, d));
      }
}

}  // namespace ringattn
