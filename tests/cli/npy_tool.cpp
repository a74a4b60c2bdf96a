// A small helper for the command-line tests (no numpy on the CI machine): writes random or
// deliberately broken .npy inputs, compares two .npy files, and checks a run's --out/--lse
// files against the fp64 oracle computed here from the same input files.
//
//   npy_tool random FILE fp32|fp16 B H T D SEED [STD]   N(0, STD^2), STD 1 by default
//   npy_tool random3 FILE fp32|fp16 T H D SEED          three-dimensional (the packed THD layout)
//   npy_tool corrupt FILE badmagic|truncated|shapelie|descr|fortran
//   npy_tool poison FILE INDEX nan|inf             element INDEX (flat, C order) becomes NaN or +Inf
//   npy_tool compare A B ATOL                     exit 1 when shapes differ or max|A-B| > ATOL
//   npy_tool reference Q K V OUT LSE causal|full ATOL
//   npy_tool ints FILE i4|i8|f4 V0 V1 ...           a one-dimensional array of these values
//   npy_tool swap12 IN OUT                        axes 1 and 2 exchanged ([B, H, T, D] <-> [B, T, H, D],
//                                                 [B, H, T] <-> [B, T, H]), in IN's dtype
//   npy_tool reshape IN OUT D0 D1 ...             the same elements (C order) under another shape
//   npy_tool nonfinite FILE                       prints "nonfinite tokens: A-B,C" (the tokens, axis 2
//                                                 of [B, H, T, D] or axis 2 of [B, H, T], whose row
//                                                 holds a NaN or Inf in some batch and head; "none")
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "runner/io/npy.hpp"

using namespace ringattn;

namespace {

int usage() {
  std::fprintf(stderr, "usage: npy_tool random|corrupt|compare|reference|swap12|reshape ... (see the file's header)\n");
  return 2;
}

int cmd_random(char** a, int dims = 4) {
  const DType dt = std::string(a[1]) == "fp16" ? DType::F16 : DType::F32;
  std::vector<int64_t> shape;
  for (int i = 0; i < dims; ++i) shape.push_back(std::stoll(a[2 + i]));
  std::mt19937_64 rng(std::stoull(a[2 + dims]));
  std::normal_distribution<float> nd(0.f, dims == 4 && a[7] != nullptr ? std::stof(a[7]) : 1.f);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<uint8_t> data(size_t(n * dtype_size(dt)));
  for (int64_t i = 0; i < n; ++i) store_from_float(data.data(), dt, i, nd(rng));
  write_npy(a[0], shape, dt, data.data());
  return 0;
}

int cmd_corrupt(char** a) {
  const std::string path = a[0], kind = a[1];
  std::vector<uint8_t> b;
  {
    std::ifstream f(path, std::ios::binary);
    b.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s(b.begin(), b.end());
    const auto i = s.find(from);
    if (i == std::string::npos) return false;
    s.replace(i, from.size(), to);
    b.assign(s.begin(), s.end());
    return true;
  };
  bool ok = true;
  if (kind == "badmagic") b[1] = 'X';
  else if (kind == "truncated") {
    if (b.size() < 7) return usage();
    b.resize(b.size() - 7);
  }
  else if (kind == "shapelie") {  // first dimension one larger than the data holds
    std::string s(b.begin(), b.end());
    const auto i = s.find("'shape': (") + 10;
    const auto j = s.find(',', i);
    ok = replace(s.substr(i - 10, j - i + 10), "'shape': (" + std::to_string(std::stoll(s.substr(i, j - i)) + 1));
  } else if (kind == "descr") ok = replace("'<f4'", "'<i4'") || replace("'<f2'", "'<i2'");
  else if (kind == "fortran") ok = replace("False", "True ");
  else return usage();
  if (!ok) return usage();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  return 0;
}

int cmd_poison(char** a) {
  NpyArray x = load_npy(a[0]);
  const int64_t i = std::stoll(a[1]);
  if (i < 0 || i >= x.header.numel()) return usage();
  store_from_float(x.bytes.data(), x.header.dtype, i,
                   std::string(a[2]) == "inf" ? INFINITY : std::numeric_limits<float>::quiet_NaN());
  write_npy(a[0], x.header.shape, x.header.dtype, x.bytes.data());
  return 0;
}

double max_diff(const NpyArray& x, const NpyArray& y) {
  double m = 0;
  for (int64_t i = 0; i < x.header.numel(); ++i) {
    const double d = std::abs(double(x.at(i)) - double(y.at(i)));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

int cmd_compare(char** a) {
  const NpyArray x = load_npy(a[0]), y = load_npy(a[1]);
  if (x.header.shape != y.header.shape) {
    std::printf("shape %s != %s\n", x.header.shape_string().c_str(), y.header.shape_string().c_str());
    return 1;
  }
  const double d = max_diff(x, y), tol = std::stod(a[2]);
  std::printf("max |a - b| = %.3e over %lld elements (tolerance %.1e)\n", d, (long long)x.header.numel(), tol);
  return d <= tol ? 0 : 1;
}

int cmd_nonfinite(char** a) {
  const NpyArray x = load_npy(a[0]);
  const auto& sh = x.header.shape;
  if (sh.size() != 3 && sh.size() != 4) return usage();
  const int64_t T = sh[2], D = sh.size() == 4 ? sh[3] : 1;
  std::vector<char> bad(size_t(T), 0);
  for (int64_t i = 0; i < x.header.numel(); ++i)
    if (!std::isfinite(x.at(i))) bad[size_t(i / D % T)] = 1;
  std::string out;
  for (int64_t t = 0; t < T;) {
    if (!bad[size_t(t)]) {
      ++t;
      continue;
    }
    int64_t e = t;
    while (e + 1 < T && bad[size_t(e + 1)]) ++e;
    out += (out.empty() ? "" : ",") + std::to_string(t) + (e > t ? "-" + std::to_string(e) : "");
    t = e + 1;
  }
  std::printf("nonfinite tokens: %s\n", out.empty() ? "none" : out.c_str());
  return 0;
}

int cmd_reference(char** a) {
  NpyArray q = load_npy(a[0]), k = load_npy(a[1]), v = load_npy(a[2]);
  const NpyArray out = load_npy(a[3]), lse = load_npy(a[4]);
  const auto& qs = q.header.shape;
  const auto& ks = k.header.shape;
  FlashParams p;
  p.q = bhtd_view(q.bytes.data(), q.header.dtype, qs[0], qs[1], qs[2], qs[3]);
  p.k = bhtd_view(k.bytes.data(), k.header.dtype, ks[0], ks[1], ks[2], ks[3]);
  p.v = bhtd_view(v.bytes.data(), v.header.dtype, ks[0], ks[1], ks[2], ks[3]);
  p.scale = float(1.0 / std::sqrt(double(qs[3])));
  p.mask = MaskSpec{std::string(a[5]) == "causal", ks[2] - qs[2]};
  const cpu::Reference ref = cpu::naive_attention(p);
  if (out.header.shape != qs || lse.header.shape != std::vector<int64_t>{qs[0], qs[1], qs[2]}) {
    std::printf("out %s / lse %s do not match q %s\n", out.header.shape_string().c_str(),
                lse.header.shape_string().c_str(), q.header.shape_string().c_str());
    return 1;
  }
  double mo = 0, ml = 0;
  for (size_t i = 0; i < ref.o.size(); ++i) mo = std::max(mo, std::abs(double(out.at(int64_t(i))) - ref.o[i]));
  for (size_t i = 0; i < ref.lse.size(); ++i) ml = std::max(ml, std::abs(double(lse.at(int64_t(i))) - ref.lse[i]));
  if (std::isnan(mo) || std::isnan(ml)) mo = INFINITY;
  const double tol = std::stod(a[6]);
  std::printf("vs fp64 reference: max |out - ref| = %.3e, max |lse - ref| = %.3e (tolerance %.1e)\n", mo, ml, tol);
  return mo <= tol && ml <= tol ? 0 : 1;
}

// Exchanges axes 1 and 2 of a 3- or 4-dimensional array: the bhsd <-> bshd transpose of the tests.
int cmd_swap12(char** a) {
  const NpyArray x = load_npy(a[0]);
  std::vector<int64_t> s = x.header.shape;
  if (s.size() != 3 && s.size() != 4) return usage();
  const int64_t B = s[0], H = s[1], T = s[2], W = s.size() == 4 ? s[3] : 1, es = dtype_size(x.header.dtype);
  std::vector<uint8_t> y(x.bytes.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        std::copy_n(x.bytes.data() + ((b * H + h) * T + t) * W * es, W * es, y.data() + ((b * T + t) * H + h) * W * es);
  std::swap(s[1], s[2]);
  write_npy(a[1], s, x.header.dtype, y.data());
  return 0;
}

int cmd_reshape(int n, char** a) {
  const NpyArray x = load_npy(a[0]);
  std::vector<int64_t> s;
  int64_t count = 1;
  for (int i = 2; i < n; ++i) count *= s.emplace_back(std::stoll(a[i]));
  if (count != x.header.numel()) return usage();
  write_npy(a[1], s, x.header.dtype, x.bytes.data());
  return 0;
}

// A one-dimensional .npy of integers (or, for tests of the dtype check, floats), written by hand.
int cmd_ints(int n, char** a) {
  const std::string kind = a[1];
  const std::string descr = kind == "i4" ? "<i4" : kind == "i8" ? "<i8" : "<f4";
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(n - 2) + ",), }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::ofstream f(a[0], std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = uint16_t(dict.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f << dict;
  for (int i = 2; i < n; ++i) {
    const long long v = std::stoll(a[i]);
    if (kind == "i4") {
      const int32_t x = int32_t(v);
      f.write(reinterpret_cast<const char*>(&x), 4);
    } else if (kind == "i8") {
      const int64_t x = v;
      f.write(reinterpret_cast<const char*>(&x), 8);
    } else {
      const float x = float(v);
      f.write(reinterpret_cast<const char*>(&x), 4);
    }
  }
  return f ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  try {
    if (cmd == "random" && (argc == 9 || argc == 10)) return cmd_random(argv + 2);
    if (cmd == "random3" && argc == 8) return cmd_random(argv + 2, 3);
    if (cmd == "corrupt" && argc == 4) return cmd_corrupt(argv + 2);
    if (cmd == "poison" && argc == 5) return cmd_poison(argv + 2);
    if (cmd == "compare" && argc == 5) return cmd_compare(argv + 2);
    if (cmd == "reference" && argc == 9) return cmd_reference(argv + 2);
    if (cmd == "ints" && argc >= 4) return cmd_ints(argc - 2, argv + 2);
    if (cmd == "swap12" && argc == 4) return cmd_swap12(argv + 2);
    if (cmd == "nonfinite" && argc == 3) return cmd_nonfinite(argv + 2);
    if (cmd == "reshape" && argc >= 5) return cmd_reshape(argc - 2, argv + 2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "npy_tool: %s\n", e.what());
    return 1;
  }
  return usage();
}
