// ringattn_gpu_bench: times the CUDA backend over the peers' shapes (.bench/peers.py syntax
// batch,q_heads,kv_heads,q_len,kv_len,head_dim,causal|full, or causal_w<W>|full_w<W> for a
// sliding window of W keys) and prints CSV rows
//   shape,impl,tflops,ms,kv_gbps
// with the peers' FLOP and byte counts: 4*B*Hq*T*S*D FLOPs (halved for causal self-attention;
// with a window 4*B*Hq*D per visible (query, key) pair) and the K and V bytes read once.
// --backward times Backend::flash_backward instead (Write mode, dq as RINGATTN_BACKWARD_DQ and the
// dispatch pick it; --deterministic for the deterministic dq pass) through the Hopper kernels
// ("bwd_hopper", on sm_90), the mma.sync ones ("bwd_mma") and the SIMT ones ("bwd_simt"; only
// RINGATTN_BACKWARD_KERNEL's row when it is set), the median of --reps calls between CUDA events, at 2.5 x the forward's FLOPs
// (FlashAttention's convention); 3 dq rows per run are checked against the fp64 oracle. "ours" is the complete attention as the peers compute it
// (flash or split-KV decode into the fp32 state, then the cast to the input dtype);
// "ours_state" is the kernel alone, ending at the fp32 (o, lse) state the ring runner carries.
// Inputs are fresh random normals (a new seed every run), rotated over several copies when they
// would fit in L2 (--timer per-call, the default); --timer batch times back-to-back calls on one
// input set, as peers.py times the peers (time_calls below); --timer cold times each call alone after
// a kernel that reads 512 MB, so nothing of its inputs is in L2 (tests/gpu/peers_cold.py times the peers so). --layout bshd holds q, k, v and the
// final output as [batch, seq, heads, dim] (strided views of the same kernels; the fp32 state stays [batch, heads, seq, dim]). A few output rows are checked against the fp64 oracle on every run; a wrong
// result exits non-zero.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/flash_dispatch.hpp"

using namespace ringattn;

namespace {

const char* kDefaultShapes[] = {
    "4,32,8,2048,2048,128,full",   "4,32,8,2048,2048,128,causal",   "1,32,8,8192,8192,128,full",
    "1,32,8,8192,8192,128,causal", "1,32,8,32768,32768,128,causal", "4,32,32,4096,4096,64,causal",
    "8,32,8,1,32768,128,full",     "1,32,8,1,131072,128,full",
};

struct Shape {
  std::string text;
  int64_t b, hq, hkv, t, s, d;
  bool causal;
  int64_t window = -1;  // causal_w<W> / full_w<W>: a sliding window's lower edge (MaskSpec::window)
  MaskSpec mask() const { return MaskSpec{causal, s - t, window}; }
};

Shape parse_shape(const std::string& text) {
  Shape sh{text, 0, 0, 0, 0, 0, 0, false};
  char mask[32] = {0};
  long long v[6], w = -1;
  const std::string bad = "bad --shape '" + text +
                          "': expected batch,q_heads,kv_heads,q_len,kv_len,head_dim,causal|full[_w<window>]";
  if (std::sscanf(text.c_str(), "%lld,%lld,%lld,%lld,%lld,%lld,%31s", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], mask) != 7)
    throw std::invalid_argument(bad);
  sh.b = v[0], sh.hq = v[1], sh.hkv = v[2], sh.t = v[3], sh.s = v[4], sh.d = v[5];
  const std::string m(mask);
  const bool causal = m.rfind("causal", 0) == 0, full = m.rfind("full", 0) == 0;
  const std::string rest = m.substr(causal ? 6 : 4);
  if ((!causal && !full) || (!rest.empty() && (std::sscanf(rest.c_str(), "_w%lld", &w) != 1 || w < 0)))
    throw std::invalid_argument(bad);
  sh.causal = causal && sh.t > 1;  // as peers.py: causal decode is full
  sh.window = w;
  return sh;
}

// Normal(0, 1) values from a counter-based hash (Box-Muller), written as T.
template <typename T>
__global__ void fill_normal(T* x, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u1 = (float((z >> 40) & 0xFFFFFF) + 1.f) / 16777218.f, u2 = float(z & 0xFFFFFF) / 16777216.f;
    const float g = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    if constexpr (std::is_same_v<T, __half>) x[i] = __float2half_rn(g);
    else x[i] = __float2bfloat16_rn(g);
  }
}

void fill(void* p, DType dt, int64_t n, uint64_t seed) {
  if (dt == DType::F16) fill_normal<__half><<<1024, 256>>>(static_cast<__half*>(p), n, seed);
  else fill_normal<__nv_bfloat16><<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  RA_CHECK_CUDA_LAUNCH("fill_normal");
}

struct Inputs {
  DeviceBuffer q, k, v;
};

struct Result {
  double ms_full, ms_state;
};

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// --timer: how a row's milliseconds per call are measured.
//   per-call (default): each call between two CUDA events, synchronized after each: the host's
//     launch work sits inside every timed interval (the GPU idles while the host launches), and
//     the input sets rotate, so no call finds its inputs in L2 from the previous one.
//   batch: the way shared/bench/peers.py times the peers: 10 untimed calls, then 7 batches of 20
//     back-to-back calls between two events on one input set, the median of the batches over 20;
//     the host enqueues ahead of the GPU, so only launch gaps the GPU sees are counted.
//   cold: each call alone between two events, after a kernel that reads 512 MB (the L2 holds none
//     of the inputs, as in a model where other layers' K/V pass between two calls of one layer);
//     the host enqueues the call while that kernel runs, so no launch gap is counted. Median of 30.
enum class Timer { PerCall, Batch, Cold };
Timer g_timer = Timer::PerCall;

__global__ void read_flush_kernel(const int4* x, size_t n, int* sink) {
  int acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int4 v = x[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *sink = acc;  // never: keeps the loads
}

double time_cold(cudaStream_t stream, const std::function<void()>& run) {
  static int4* buf = nullptr;
  static int* sink = nullptr;
  const size_t bytes = size_t(512) << 20;
  if (buf == nullptr) {
    RA_CHECK_CUDA(cudaMalloc(&buf, bytes));
    RA_CHECK_CUDA(cudaMemset(buf, 1, bytes));
    RA_CHECK_CUDA(cudaMalloc(&sink, 4));
  }
  int device = 0, sms = 0;
  RA_CHECK_CUDA(cudaGetDevice(&device));
  RA_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  std::vector<cudaEvent_t> ev(60);
  for (auto& e : ev) RA_CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < 5; ++i) run();
  for (int c = 0; c < 30; ++c) {
    read_flush_kernel<<<sms * 8, 256, 0, stream>>>(buf, bytes / 16, sink);
    RA_CHECK_CUDA(cudaEventRecord(ev[2 * c], stream));
    run();
    RA_CHECK_CUDA(cudaEventRecord(ev[2 * c + 1], stream));
  }
  RA_CHECK_CUDA(cudaEventSynchronize(ev.back()));
  std::vector<double> times;
  for (int c = 0; c < 30; ++c) {
    float ms = 0;
    RA_CHECK_CUDA(cudaEventElapsedTime(&ms, ev[2 * c], ev[2 * c + 1]));
    times.push_back(ms);
  }
  for (auto& e : ev) RA_CHECK_CUDA(cudaEventDestroy(e));
  return median(times);
}

// Milliseconds per call of run() on stream, by g_timer; set_inputs(i) picks input set i first
// (a host-side change of pointers only).
template <typename SetInputs, typename Run>
double time_calls(cudaStream_t stream, int reps, int sets, SetInputs set_inputs, Run run) {
  if (g_timer == Timer::Cold) {
    set_inputs(0);
    return time_cold(stream, run);
  }
  cudaEvent_t e0, e1;
  RA_CHECK_CUDA(cudaEventCreate(&e0));
  RA_CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<double> times;
  const bool batch = g_timer == Timer::Batch;
  const int warmup = batch ? 10 : 5, rounds = batch ? 7 : reps, calls = batch ? 20 : 1;
  for (int i = 0; i < warmup; ++i) set_inputs(batch ? 0 : i % sets), run();
  for (int r = 0; r < rounds; ++r) {
    if (!batch) set_inputs(r % sets);
    RA_CHECK_CUDA(cudaEventRecord(e0, stream));
    for (int c = 0; c < calls; ++c) run();
    RA_CHECK_CUDA(cudaEventRecord(e1, stream));
    RA_CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    RA_CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(double(ms) / calls);
  }
  RA_CHECK_CUDA(cudaEventDestroy(e0));
  RA_CHECK_CUDA(cudaEventDestroy(e1));
  return median(times);
}

// Checks 3 random rows of the finalized output against the fp64 oracle.
// Rows [t0, t0 + n) of head h of batch b of a 16-bit device view, contiguous [n, dim] on the host.
void copy_rows(uint16_t* dst, const TensorView& v, int64_t b, int64_t h, int64_t t0, int64_t n) {
  const auto* src = static_cast<const uint16_t*>(v.data) + v.offset(b, h, t0);
  RA_CHECK_CUDA(cudaMemcpy2D(dst, size_t(v.dim) * 2, src, size_t(v.stride_t) * 2, size_t(v.dim) * 2, size_t(n),
                             cudaMemcpyDeviceToHost));
}

bool check_rows(Backend& be, const Shape& sh, const FlashParams& p, const TensorView& out, std::mt19937_64& rng) {
  const int64_t D = sh.d;
  for (int n = 0; n < 3; ++n) {
    const int64_t b = int64_t(rng() % uint64_t(sh.b)), h = int64_t(rng() % uint64_t(sh.hq)),
                  i = int64_t(rng() % uint64_t(sh.t));
    const int64_t hk = h / (sh.hq / sh.hkv);
    std::vector<uint16_t> qh(static_cast<size_t>(D)), kh(static_cast<size_t>(sh.s * D)), vh(static_cast<size_t>(sh.s * D)),
        oh(static_cast<size_t>(D));
    be.synchronize();
    copy_rows(qh.data(), p.q, b, h, i, 1);
    copy_rows(kh.data(), p.k, b, hk, 0, sh.s);
    copy_rows(vh.data(), p.v, b, hk, 0, sh.s);
    copy_rows(oh.data(), out, b, h, i, 1);
    FlashParams r = p;
    r.q = bhtd_view(qh.data(), p.q.dtype, 1, 1, 1, D);
    r.k = bhtd_view(kh.data(), p.q.dtype, 1, 1, sh.s, D);
    r.v = bhtd_view(vh.data(), p.q.dtype, 1, 1, sh.s, D);
    r.mask.q_offset = p.mask.q_offset + i;
    std::vector<double> ro(static_cast<size_t>(D));
    double rl;
    cpu::naive_row(r, 0, 0, 0, ro.data(), &rl);
    double num = 0, den = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double x = load_as_float(oh.data(), p.q.dtype, d);
      num += (x - ro[size_t(d)]) * (x - ro[size_t(d)]);
      den += ro[size_t(d)] * ro[size_t(d)];
    }
    const double err = std::sqrt(num / std::max(den, 1e-30));
    if (!(err < 2e-2)) {
      std::fprintf(stderr, "CHECK FAILED %s row (%lld,%lld,%lld): rel error %.3e\n", sh.text.c_str(), (long long)b,
                   (long long)h, (long long)i, err);
      return false;
    }
  }
  return true;
}

// --splits N: the decode rows' split count (DecodeParams::splits; 0, the default, lets the plan pick).
int g_decode_splits = 0;

Result bench_shape(Backend& be, const Shape& sh, DType dt, bool bshd, int reps, bool& ok, std::mt19937_64& rng) {
  const int64_t q_elems = sh.b * sh.hq * sh.t * sh.d, kv_elems = sh.b * sh.hkv * sh.s * sh.d;
  const size_t in_bytes = size_t(q_elems + 2 * kv_elems) * 2;
  int l2 = 0;
  RA_CHECK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  // Enough input copies that one pass over all of them is 4x the L2: no timed call finds its
  // inputs still cached from the previous one.
  const int sets = int(std::clamp<int64_t>(int64_t(4.0 * l2 / double(in_bytes)) + 1, 1, 8));
  std::vector<Inputs> in(static_cast<size_t>(sets));
  for (auto& x : in) {
    x.q = DeviceBuffer(be, size_t(q_elems) * 2);
    x.k = DeviceBuffer(be, size_t(kv_elems) * 2);
    x.v = DeviceBuffer(be, size_t(kv_elems) * 2);
    fill(x.q.get(), dt, q_elems, rng());
    fill(x.k.get(), dt, kv_elems, rng());
    fill(x.v.get(), dt, kv_elems, rng());
  }
  // The fills ran on the legacy default stream, which the backend's non-blocking stream does
  // not wait for.
  RA_CHECK_CUDA(cudaDeviceSynchronize());
  DeviceBuffer o(be, size_t(q_elems) * 4), lse(be, size_t(sh.b * sh.hq * sh.t) * 4), out(be, size_t(q_elems) * 2);
  FlashParams p;
  p.scale = 1.f / std::sqrt(float(sh.d));
  p.mask = sh.mask();
  p.state = contiguous_state(o.as<float>(), lse.as<float>(), sh.b, sh.hq, sh.t, sh.d);
  const auto view = bshd ? bthd_view : bhtd_view;
  const TensorView out_view = view(out.get(), dt, sh.b, sh.hq, sh.t, sh.d);
  const bool decode = sh.t <= 16;
  auto set_inputs = [&](int i) {
    p.q = view(in[size_t(i)].q.get(), dt, sh.b, sh.hq, sh.t, sh.d);
    p.k = view(in[size_t(i)].k.get(), dt, sh.b, sh.hkv, sh.s, sh.d);
    p.v = view(in[size_t(i)].v.get(), dt, sh.b, sh.hkv, sh.s, sh.d);
  };
  // The complete attention asks for the final output in the call (FlashParams::out: the Hopper
  // kernel writes it from its epilogue, other paths cast the state); "state" stops at the fp32
  // state.
  auto run = [&](bool complete) {
    FlashParams f = p;
    if (complete) f.out = out_view;
    if (decode) be.decode(DecodeParams{f, g_decode_splits});
    else be.flash(f);
  };
  cudaStream_t stream = static_cast<cudaStream_t>(be.stream());
  Result res{};
  for (const bool complete : {true, false})
    (complete ? res.ms_full : res.ms_state) = time_calls(stream, reps, sets, set_inputs, [&] { run(complete); });
  // The check: one more complete run on set 0.
  set_inputs(0);
  run(true);
  be.synchronize();
  ok = check_rows(be, sh, p, out_view, rng) && ok;
  return res;
}

// ---- --backward: Backend::flash_backward through each backward kernel ----

// The dq of query row i of head h of batch b against the fp64 oracle (cpu::naive_backward on that
// one row and its kv head's keys); false (with a message) when the relative error exceeds 2e-2.
bool check_dq_row(const Shape& sh, const BackwardParams& p, int64_t b, int64_t h, int64_t i, const char* impl) {
  const int64_t D = sh.d, hk = h / (sh.hq / sh.hkv);
  const size_t row = static_cast<size_t>(D), rows = static_cast<size_t>(sh.s * D);
  std::vector<uint16_t> qh(row), oh(row), doh(row), kh(rows), vh(rows);
  std::vector<float> dq(row), lse(1), dk(rows), dv(rows);
  copy_rows(qh.data(), p.q, b, h, i, 1);
  copy_rows(oh.data(), p.o, b, h, i, 1);
  copy_rows(doh.data(), p.dout, b, h, i, 1);
  copy_rows(kh.data(), p.k, b, hk, 0, sh.s);
  copy_rows(vh.data(), p.v, b, hk, 0, sh.s);
  RA_CHECK_CUDA(cudaMemcpy(dq.data(), static_cast<const float*>(p.dq.data) + p.dq.offset(b, h, i), size_t(D) * 4,
                           cudaMemcpyDeviceToHost));
  RA_CHECK_CUDA(cudaMemcpy(lse.data(), p.lse.row(b, h) + i, 4, cudaMemcpyDeviceToHost));
  BackwardParams r = p;
  r.q = bhtd_view(qh.data(), p.q.dtype, 1, 1, 1, D);
  r.o = bhtd_view(oh.data(), p.q.dtype, 1, 1, 1, D);
  r.dout = bhtd_view(doh.data(), p.q.dtype, 1, 1, 1, D);
  r.k = bhtd_view(kh.data(), p.q.dtype, 1, 1, sh.s, D);
  r.v = bhtd_view(vh.data(), p.q.dtype, 1, 1, sh.s, D);
  r.lse = contiguous_lse(lse.data(), 1, 1, 1);
  r.dq = bhtd_view(dq.data(), DType::F32, 1, 1, 1, D);
  r.dk = bhtd_view(dk.data(), DType::F32, 1, 1, sh.s, D);
  r.dv = bhtd_view(dv.data(), DType::F32, 1, 1, sh.s, D);
  r.mask.q_offset = p.mask.q_offset + i;
  const cpu::GradReference ref = cpu::naive_backward(r);
  double num = 0, den = 0;
  for (int64_t d = 0; d < D; ++d) {
    const double x = dq[size_t(d)], y = ref.dq[size_t(d)];
    num += (x - y) * (x - y);
    den += y * y;
  }
  const double err = std::sqrt(num / std::max(den, 1e-30));
  if (err < 2e-2) return true;
  std::fprintf(stderr, "CHECK FAILED %s %s dq row (%lld,%lld,%lld): rel error %.3e\n", sh.text.c_str(), impl,
               (long long)b, (long long)h, (long long)i, err);
  return false;
}

// The median time of Backend::flash_backward (Write mode; dq as the options pick it, or the
// deterministic pass) on fresh random q, k, v, dout, with o and lse from our forward; then 3 dq rows checked.
double bench_backward(Backend& be, const Shape& sh, DType dt, bool deterministic, int reps, bool& ok,
                      std::mt19937_64& rng, const char* impl) {
  const int64_t q_elems = sh.b * sh.hq * sh.t * sh.d, kv_elems = sh.b * sh.hkv * sh.s * sh.d;
  DeviceBuffer q(be, size_t(q_elems) * 2), k(be, size_t(kv_elems) * 2), v(be, size_t(kv_elems) * 2),
      dout(be, size_t(q_elems) * 2), o(be, size_t(q_elems) * 2), state_o(be, size_t(q_elems) * 4),
      lse(be, size_t(sh.b * sh.hq * sh.t) * 4), dq(be, size_t(q_elems) * 4), dk(be, size_t(kv_elems) * 4),
      dv(be, size_t(kv_elems) * 4);
  fill(q.get(), dt, q_elems, rng());
  fill(k.get(), dt, kv_elems, rng());
  fill(v.get(), dt, kv_elems, rng());
  fill(dout.get(), dt, q_elems, rng());
  RA_CHECK_CUDA(cudaDeviceSynchronize());  // the fills ran on the legacy default stream
  FlashParams f;
  f.q = bhtd_view(q.get(), dt, sh.b, sh.hq, sh.t, sh.d);
  f.k = bhtd_view(k.get(), dt, sh.b, sh.hkv, sh.s, sh.d);
  f.v = bhtd_view(v.get(), dt, sh.b, sh.hkv, sh.s, sh.d);
  f.scale = 1.f / std::sqrt(float(sh.d));
  f.mask = sh.mask();
  f.state = contiguous_state(state_o.as<float>(), lse.as<float>(), sh.b, sh.hq, sh.t, sh.d);
  f.out = bhtd_view(o.get(), dt, sh.b, sh.hq, sh.t, sh.d);
  be.flash(f);
  BackwardParams p;
  p.q = f.q, p.k = f.k, p.v = f.v, p.o = f.out;
  p.dout = bhtd_view(dout.get(), dt, sh.b, sh.hq, sh.t, sh.d);
  p.lse = contiguous_lse(lse.as<float>(), sh.b, sh.hq, sh.t);
  p.dq = bhtd_view(dq.get(), DType::F32, sh.b, sh.hq, sh.t, sh.d);
  p.dk = bhtd_view(dk.get(), DType::F32, sh.b, sh.hkv, sh.s, sh.d);
  p.dv = bhtd_view(dv.get(), DType::F32, sh.b, sh.hkv, sh.s, sh.d);
  p.scale = f.scale;
  p.mask = f.mask;
  p.deterministic = deterministic;
  const double ms = time_calls(static_cast<cudaStream_t>(be.stream()), reps, 1, [](int) {},
                               [&] { be.flash_backward(p); });
  be.synchronize();
  for (int n = 0; n < 3; ++n) {
    const int64_t b = int64_t(rng() % uint64_t(sh.b)), h = int64_t(rng() % uint64_t(sh.hq)),
                  i = int64_t(rng() % uint64_t(sh.t));
    ok = check_dq_row(sh, p, b, h, i, impl) && ok;
  }
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> shapes;
  DType dt = DType::BF16;
  int reps = 30, variants_flag = 0, backward = 0, deterministic = 0;
  std::string json, layout = "bhsd", timer;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--shape" && i + 1 < argc) shapes.push_back(argv[++i]);
    else if (a == "--dtype" && i + 1 < argc) dt = parse_dtype(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::max(3, std::atoi(argv[++i]));
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else if (a == "--variants") variants_flag = 1;
    else if (a == "--backward") backward = 1;
    else if (a == "--deterministic") deterministic = 1;
    else if (a == "--splits" && i + 1 < argc) g_decode_splits = std::max(0, std::atoi(argv[++i]));
    else if (a == "--timer" && i + 1 < argc && (timer = argv[++i], timer == "per-call" || timer == "batch" || timer == "cold"))
      g_timer = timer == "batch" ? Timer::Batch : timer == "cold" ? Timer::Cold : Timer::PerCall;
    else if (a == "--layout" && i + 1 < argc && (layout = argv[++i], layout == "bhsd" || layout == "bshd" || layout == "both")) {}
    else {
      std::fprintf(stderr,
                   "usage: %s [--shape b,hq,hkv,t,s,d,causal|full]... [--dtype bf16|fp16] [--reps N] [--json FILE] "
                   "[--variants] [--layout bhsd|bshd|both] [--backward [--deterministic]] [--splits N] "
                   "[--timer per-call|batch|cold]\n",
                   argv[0]);
      return 2;
    }
  }
  if (dt == DType::F32) {
    std::fprintf(stderr, "--dtype fp32 is the accuracy path and is not benchmarked: use bf16 or fp16\n");
    return 2;
  }
  if (shapes.empty()) shapes.assign(std::begin(kDefaultShapes), std::end(kDefaultShapes));
  if (!cuda_available()) {
    std::fprintf(stderr, "no CUDA device visible\n");
    return 2;
  }
  bool ok = true;
  try {
    // The options from the environment, read once; the variant and portable rows change one field.
    const cuda::FlashKernelOptions env_options = cuda::flash_options(settings().kernels());
    auto be = make_cuda_backend(0, env_options);
    std::mt19937_64 rng(uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count()));
    std::FILE* js = json.empty() ? nullptr : std::fopen(json.c_str(), "w");
    if (js) std::fprintf(js, "{\"dtype\": \"%s\", \"rows\": [\n", dtype_name(dt));
    bool first = true;
    std::printf("shape,impl,tflops,ms,kv_gbps\n");
    for (const std::string& text : shapes) {
      const Shape sh = parse_shape(text);
      double flops = 4.0 * double(sh.b * sh.hq) * double(sh.t) * double(sh.s) * double(sh.d);
      if (sh.causal && sh.t == sh.s) flops /= 2;
      // A window: the visible (query, key) pairs.
      if (sh.window >= 0) flops = 4.0 * double(sh.b * sh.hq) * double(sh.d) * count_visible<double>(sh.mask(), 0, sh.t, sh.s);
      if (backward) flops *= 2.5;  // FlashAttention's count for the backward
      const double kv_bytes = 2.0 * double(sh.b * sh.hkv * sh.s * sh.d) * 2;
      auto emit = [&](const char* impl, double ms) {
        std::printf("%s,%s,%.1f,%.3f,%.0f\n", text.c_str(), impl, flops / ms / 1e9, ms, kv_bytes / ms / 1e6);
        std::fflush(stdout);
        if (js)
          std::fprintf(js, "%s {\"shape\": \"%s\", \"impl\": \"%s\", \"tflops\": %.2f, \"ms\": %.4f, \"kv_gbps\": %.1f}",
                       first ? "" : ",\n", text.c_str(), impl, flops / ms / 1e9, ms, kv_bytes / ms / 1e6);
        first = false;
      };
      // --backward: the backward through each kernel instead of the forward rows.
      if (backward) {
        static const bool hopper = cuda::query_device(0).hopper_image;
        for (const cuda::BackwardKernel k :
             {cuda::BackwardKernel::Hopper, cuda::BackwardKernel::Mma, cuda::BackwardKernel::Simt}) {
          if (k == cuda::BackwardKernel::Hopper && !hopper) continue;
          // RINGATTN_BACKWARD_KERNEL set: that kernel's row alone.
          if (env_options.backward_kernel != cuda::BackwardKernel::Auto && k != env_options.backward_kernel) continue;
          // The SIMT kernel takes seconds per call past 8k x 8k: timed up to there only.
          if (k == cuda::BackwardKernel::Simt && sh.t * sh.s > int64_t(8192) * 8192) continue;
          cuda::FlashKernelOptions o = env_options;
          o.backward_kernel = k;
          const std::string impl = std::string("bwd_") + cuda::backward_kernel_name(k) + (deterministic ? "_det" : "");
          emit(impl.c_str(), bench_backward(*make_cuda_backend(0, o), sh, dt, deterministic, reps, ok, rng, impl.c_str()));
        }
        continue;
      }
      // --variants: also each portable kernel configuration (cuda::MmaVariant; the Hopper kernel
      // still takes the calls it takes, as under the default options).
      std::vector<int> variants = {0};
      if (variants_flag && sh.t > 16) variants = {0, 1, 2, 3};
      for (int v : variants) {
        cuda::FlashKernelOptions o = env_options;
        o.mma_variant = v;
        const std::unique_ptr<Backend> vb = v == 0 ? nullptr : make_cuda_backend(0, o);
        if (v == 0) {
          // Rows "ours"/"ours_state" in the --layout (bshd alone keeps those names); with
          // "both", the bshd rows follow as "ours_bshd"/"ours_state_bshd".
          for (const bool bshd : {false, true}) {
            if ((bshd && layout == "bhsd") || (!bshd && layout == "bshd")) continue;
            const Result r = bench_shape(*be, sh, dt, bshd, reps, ok, rng);
            const bool suffix = bshd && layout == "both";
            emit(suffix ? "ours_bshd" : "ours", r.ms_full);
            emit(suffix ? "ours_state_bshd" : "ours_state", r.ms_state);
          }
        } else {
          const Result r = bench_shape(*vb, sh, dt, layout == "bshd", reps, ok, rng);
          emit(("ours_state_v" + std::to_string(v)).c_str(), r.ms_state);
        }
      }
      // The dispatch default above picks the Hopper kernel where it applies; the portable
      // mma.sync kernel beside it, same inputs and timing (at the head dims it takes).
      if (sh.t > 16 && cuda::mma_head_dim_supported(sh.d)) {
        cuda::FlashKernelOptions o = env_options;
        o.kernel = cuda::FlashKernel::Portable;
        const Result r = bench_shape(*make_cuda_backend(0, o), sh, dt, layout == "bshd", reps, ok, rng);
        emit("ours_portable_state", r.ms_state);
      }
    }
    if (js) {
      std::fprintf(js, "\n]}\n");
      std::fclose(js);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringattn_gpu_bench: %s\n", e.what());
    return 1;
  }
  return ok ? 0 : 1;
}
