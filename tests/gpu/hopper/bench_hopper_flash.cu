// Throughput of the Hopper flash forward over the peers' shapes (.bench/peers.py syntax:
// batch,q_heads,kv_heads,q_len,kv_len,head_dim,causal|full, or causal_w<W>|full_w<W> for a sliding
// window of W keys, the lower edge). Random non-zero inputs made on the device, warm-up, then the
// median of many CUDA-event-timed launches. Prints CSV `shape,peer,tflops,ms` with
// peer = ours_<tile configuration>[_lazy]; TFLOP/s counts 4*B*Hq*T*S*D, halved for causal
// self-attention (T == S), as the peers do; with a window, 4*B*Hq*D per visible (query, key) pair.
// Exits non-zero on any CUDA error or a NaN in the output.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "kernels/cuda/flash_dispatch.hpp"

namespace {

#define BENCH_CHECK(call)                                                                    \
  do {                                                                                       \
    const cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "CUDA error %s in %s at %s:%d\n", cudaGetErrorString(e_), #call, __FILE__, __LINE__); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

// Normal-ish values from a hash of the index (sum of 4 uniforms, centred): cheap and non-zero.
__global__ void fill_random(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    float acc = 0.f;
    for (int k = 0; k < 4; ++k) {
      h ^= h >> 16;
      h *= 0x7feb352du;
      h ^= h >> 15;
      h *= 0x846ca68bu;
      h ^= h >> 16;
      acc += float(h & 0xffffff) / float(0x1000000);
    }
    x[i] = __float2bfloat16((acc - 2.f) * 1.7320508f);
  }
}

// The dispatch with the Hopper kernel required; tile and lazy rescaling from the environment.
const ringattn::cuda::DeviceCaps& device0() {
  static const ringattn::cuda::DeviceCaps dev = ringattn::cuda::query_device(0);
  return dev;
}
ringattn::cuda::FlashChoice hopper_choice(const ringattn::FlashParams& p) {
  using namespace ringattn::cuda;
  FlashKernelOptions o = flash_options(ringattn::settings().kernels());
  o.kernel = FlashKernel::Hopper;
  return choose_flash_kernel(device0(), p, o);
}
// One call as the backend makes it: the decision (tensor maps encoded) and the launch.
void hopper_run(const ringattn::FlashParams& p) { ringattn::cuda::launch_flash(hopper_choice(p), p, device0(), nullptr); }

struct Shape {
  int64_t b, hq, hkv, t, s, d;
  bool causal;
  std::string text;
  long long window = -1;  // causal_w<W> / full_w<W>: the mask's lower edge
};

bool parse_shape(const std::string& text, Shape& sh) {
  char mask[32] = {};
  long long b, hq, hkv, t, s, d, w = -1;
  if (std::sscanf(text.c_str(), "%lld,%lld,%lld,%lld,%lld,%lld,%31s", &b, &hq, &hkv, &t, &s, &d, mask) != 7) return false;
  const bool causal = std::strncmp(mask, "causal", 6) == 0, full = std::strncmp(mask, "full", 4) == 0;
  const char* rest = mask + (causal ? 6 : 4);
  if (*rest != '\0' && (std::sscanf(rest, "_w%lld", &w) != 1 || w < 0)) return false;
  sh = {b, hq, hkv, t, s, d, causal, text, w};
  return causal || full;
}

void bench(const Shape& sh) {
  using namespace ringattn;
  const size_t nq = size_t(sh.b * sh.hq * sh.t * sh.d), nkv = size_t(sh.b * sh.hkv * sh.s * sh.d);
  const size_t nrows = size_t(sh.b * sh.hq * sh.t);
  __nv_bfloat16 *q, *k, *v;
  float *o, *lse;
  BENCH_CHECK(cudaMalloc(&q, nq * 2));
  BENCH_CHECK(cudaMalloc(&k, nkv * 2));
  BENCH_CHECK(cudaMalloc(&v, nkv * 2));
  BENCH_CHECK(cudaMalloc(&o, nq * 4));
  BENCH_CHECK(cudaMalloc(&lse, nrows * 4));
  fill_random<<<1024, 256>>>(q, nq, 1u);
  fill_random<<<1024, 256>>>(k, nkv, 2u);
  fill_random<<<1024, 256>>>(v, nkv, 3u);
  BENCH_CHECK(cudaMemset(lse, 0xff, nrows * 4));  // NaN until written
  FlashParams p;
  p.q = bhtd_view(q, DType::BF16, sh.b, sh.hq, sh.t, sh.d);
  p.k = bhtd_view(k, DType::BF16, sh.b, sh.hkv, sh.s, sh.d);
  p.v = bhtd_view(v, DType::BF16, sh.b, sh.hkv, sh.s, sh.d);
  p.state = contiguous_state(o, lse, sh.b, sh.hq, sh.t, sh.d);
  p.scale = 1.f / std::sqrt(float(sh.d));
  p.mask = MaskSpec{sh.causal && sh.t > 1, sh.s - sh.t, sh.window};
  // Under RINGATTN_HOPPER_TILE, shapes whose head dim lacks that configuration are skipped
  // (they would run the default one).
  const char* want = std::getenv("RINGATTN_HOPPER_TILE");
  const char* lazy = std::getenv("RINGATTN_HOPPER_LAZY");
  // The default configuration is "ours_hopper"; forced ones are named after the configuration.
  const cuda::FlashChoice choice = hopper_choice(p);
  const char* tile = choice.hopper_tile != nullptr ? choice.hopper_tile : "none";
  const std::string label = want == nullptr && lazy == nullptr
                                ? std::string("ours_hopper")
                                : std::string("ours_") + tile +
                                      (lazy != nullptr && lazy[0] == '1' ? "_lazy" : "");
  if (want != nullptr && std::strcmp(want, tile) != 0) {
    // not this configuration's shape
  } else if (choice.path != cuda::FlashPath::Hopper) {
    std::printf("%s,%s,unsupported,\n", sh.text.c_str(), label.c_str());
  } else {
    cudaEvent_t e0, e1;
    BENCH_CHECK(cudaEventCreate(&e0));
    BENCH_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; ++i) hopper_run(p);
    BENCH_CHECK(cudaDeviceSynchronize());
    BENCH_CHECK(cudaEventRecord(e0));
    hopper_run(p);
    BENCH_CHECK(cudaEventRecord(e1));
    BENCH_CHECK(cudaEventSynchronize(e1));
    float first = 0.f;
    BENCH_CHECK(cudaEventElapsedTime(&first, e0, e1));
    const int reps = std::max(10, std::min(200, int(400.f / std::max(first, 0.01f))));
    std::vector<float> ms(static_cast<size_t>(reps), 0.f);
    for (int r = 0; r < reps; ++r) {
      BENCH_CHECK(cudaEventRecord(e0));
      hopper_run(p);
      BENCH_CHECK(cudaEventRecord(e1));
      BENCH_CHECK(cudaEventSynchronize(e1));
      BENCH_CHECK(cudaEventElapsedTime(&ms[size_t(r)], e0, e1));
    }
    BENCH_CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    double flops = 4.0 * double(sh.b * sh.hq) * double(sh.t) * double(sh.s) * double(sh.d);
    if (p.mask.causal && sh.t == sh.s) flops /= 2;
    if (p.mask.windowed()) flops = 4.0 * double(sh.b * sh.hq) * double(sh.d) * count_visible<double>(p.mask, 0, sh.t, sh.s);
    std::vector<float> l(nrows);
    BENCH_CHECK(cudaMemcpy(l.data(), lse, nrows * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (float x : l) bad += std::isnan(x) ? 1 : 0;
    std::printf("%s,%s,%.1f,%.3f\n", sh.text.c_str(), label.c_str(), flops / med / 1e9, med);
    if (bad) {
      std::fprintf(stderr, "%s: %zu NaN lse values\n", sh.text.c_str(), bad);
      std::exit(1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  cudaFree(q);
  cudaFree(k);
  cudaFree(v);
  cudaFree(o);
  cudaFree(lse);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
      Shape sh;
      if (!parse_shape(argv[++i], sh)) {
        std::fprintf(stderr, "bad shape '%s': want batch,q_heads,kv_heads,q_len,kv_len,head_dim,causal|full[_w<W>]\n",
                     argv[i]);
        return 2;
      }
      shapes.push_back(sh);
    } else {
      std::fprintf(stderr, "usage: %s --shape B,Hq,Hkv,T,S,D,causal|full [--shape ...]\n", argv[0]);
      return 2;
    }
  }
  if (shapes.empty()) {
    for (const char* s : {"1,32,8,8192,8192,128,full", "1,32,8,8192,8192,128,causal"}) {
      Shape sh;
      parse_shape(s, sh);
      shapes.push_back(sh);
    }
  }
  std::printf("shape,peer,tflops,ms\n");
  try {
    for (const Shape& sh : shapes) bench(sh);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
