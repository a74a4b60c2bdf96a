// Host side of the Hopper flash forward that nvcc compiles: tensor maps, the device check and the
// launch. The public entry points and their errors live in hopper_flash.cpp (fmt stays out of nvcc).
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/cuda/hopper/hopper_flash_kernel.cuh"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/hopper/hopper_launch.hpp"

namespace ringattn::cuda {
namespace {

using hopper::HopperParams;

// Set to 1 only in the sm_90a image: tells the host whether the kernel it would launch on this
// device is the real one or the trap that other targets compile.
__device__ int g_hopper_has_wgmma = RA_HOPPER_WGMMA;

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver through the runtime, so nothing links libcuda.
EncodeTiledFn encode_fn() {
  static EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q);
    return (err == cudaSuccess && q == cudaDriverEntryPointSuccess) ? reinterpret_cast<EncodeTiledFn>(ptr) : nullptr;
  }();
  return fn;
}

struct DeviceInfo {
  bool hopper = false;  // sm_90 and the sm_90a kernel image is loaded
  int sms = 0;
};

DeviceInfo device_info(int device) {
  static std::mutex mu;
  static DeviceInfo cache[64];
  static bool known[64] = {};
  if (device < 0 || device >= 64) return {};
  std::lock_guard<std::mutex> lock(mu);
  if (!known[device]) {
    DeviceInfo info;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
        minor == 0) {
      int prev = 0, has = 0;
      RA_HOPPER_CHECK(cudaGetDevice(&prev));
      RA_HOPPER_CHECK(cudaSetDevice(device));
      if (cudaMemcpyFromSymbol(&has, g_hopper_has_wgmma, sizeof(int)) != cudaSuccess) {
        (void)cudaGetLastError();
        has = 0;
      }
      RA_HOPPER_CHECK(cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, device));
      RA_HOPPER_CHECK(cudaSetDevice(prev));
      info.hopper = has == 1;
    }
    cache[device] = info;
    known[device] = true;
  }
  return cache[device];
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

// A 4-d map over (dim, len, heads, batch) with 64 x 128 boxes and the 128-byte swizzle. A
// dimension of extent 1 is never stepped, so its stride is replaced by a legal one.
bool encode_view(CUtensorMap* map, const TensorView& v, int box_rows) {
  EncodeTiledFn fn = encode_fn();
  if (fn == nullptr) return false;
  const cuuint64_t es = 2;
  const cuuint64_t dims[4] = {cuuint64_t(v.dim), cuuint64_t(v.len), cuuint64_t(v.heads), cuuint64_t(v.batch)};
  const int64_t raw[3] = {v.stride_t, v.stride_h, v.stride_b};
  const int64_t ext[3] = {v.len, v.heads, v.batch};
  cuuint64_t strides[3];
  for (int i = 0; i < 3; ++i) {
    if (ext[i] == 1) {
      strides[i] = cuuint64_t(v.dim) * es;
    } else {
      if (raw[i] <= 0) return false;
      strides[i] = cuuint64_t(raw[i]) * es;
    }
    if (strides[i] % 16 != 0 || strides[i] >= (cuuint64_t(1) << 40)) return false;
  }
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUtensorMapDataType ty =
      v.dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return fn(map, ty, 4, v.data, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Lazy rescaling of the running max (softmax_step): on by default (1-3% on the H200, PERF.md);
// RINGATTN_HOPPER_LAZY=0/1 overrides it for benchmarking both.
bool lazy_rescale_enabled() {
  const char* env = std::getenv("RINGATTN_HOPPER_LAZY");
  if (env != nullptr && (env[0] == '0' || env[0] == '1')) return env[0] == '1';
  return true;
}

// Everything but the device: shapes, dtypes, alignment, and that the three maps encode (with
// tiles of block_m query rows and block_n keys).
bool params_fit(const FlashParams& p, int block_m, int block_n, HopperParams* out) {
  const TensorView &q = p.q, &k = p.k, &v = p.v;
  if (q.dtype != DType::BF16 && q.dtype != DType::F16) return false;
  if (k.dtype != q.dtype || v.dtype != q.dtype) return false;
  if (q.dim != 64 && q.dim != 128) return false;
  if (k.dim != q.dim || v.dim != q.dim) return false;
  if (!(p.scale > 0.f) || !std::isfinite(p.scale)) return false;
  if (k.heads < 1 || q.heads % k.heads != 0) return false;
  // Tile indices and TMA coordinates are 32-bit.
  if (q.len > INT32_MAX || k.len > INT32_MAX) return false;
  if ((q.len + block_m - 1) / block_m * q.heads * q.batch > INT32_MAX / 2) return false;
  if (!aligned(q.data, 16) || !aligned(k.data, 16) || !aligned(v.data, 16)) return false;
  const StateView& s = p.state;
  if (!aligned(s.o, 8) || (s.o_stride_t % 2) || (s.o_stride_h % 2) || (s.o_stride_b % 2)) return false;
  // The final output straight from the epilogue: the input dtype, 4-byte aligned column pairs.
  const TensorView& o = p.out;
  if (o.data != nullptr) {
    if (o.dtype != q.dtype || !aligned(o.data, 4) || (o.stride_t % 2) || (o.stride_h % 2) || (o.stride_b % 2))
      return false;
  }
  HopperParams hp{};
  if (!encode_view(&hp.tm_q, q, block_m) || !encode_view(&hp.tm_k, k, block_n) || !encode_view(&hp.tm_v, v, block_n))
    return false;
  if (out != nullptr) {
    hp.state = s;
    hp.out = o.data;
    hp.out_stride_b = o.stride_b;
    hp.out_stride_h = o.stride_h;
    hp.out_stride_t = o.stride_t;
    hp.batch = int(q.batch);
    hp.q_heads = int(q.heads);
    hp.kv_heads = int(k.heads);
    hp.group = int(q.heads / k.heads);
    hp.q_len = int(q.len);
    hp.kv_len = int(k.len);
    hp.mask = p.mask;
    hp.scale = p.scale;
    hp.scale_log2 = p.scale * kLog2e;
    hp.fold = p.mode == StateMode::Fold ? 1 : 0;
    hp.lazy_rescale = lazy_rescale_enabled() ? 1 : 0;
    hp.block_m = block_m;
    hp.block_n = block_n;
    hp.m_blocks = int((q.len + block_m - 1) / block_m);
    hp.num_tiles = hp.m_blocks * hp.batch * hp.q_heads;
    *out = hp;
  }
  return true;
}

// Tile configurations: Config<head dim, key tile, consumer warpgroups, stages, Q buffers>.
enum class Variant { M128N128, M128N176, M192N128, M128N128Q2 };

struct VariantInfo {
  Variant v;
  const char* name;
  int block_m, block_n;
  bool dim64, dim128;  // head dims it is instantiated for (shared memory / registers decide)
};
constexpr VariantInfo kVariants[] = {
    {Variant::M128N128, "128x128", 128, 128, true, true},
    {Variant::M128N176, "128x176", 128, 176, false, true},
    {Variant::M192N128, "192x128", 192, 128, true, false},
    {Variant::M128N128Q2, "128x128q2", 128, 128, false, true},
};

// The default per head dim and mask, from the H200 measurements in PERF.md: hd64 gains from a
// third consumer warpgroup (its softmax is twice as heavy relative to the matrix work); hd128
// from the 176-key tile on long rows (8k full, 32k causal), while shorter rows prefer 128 keys
// (fewer partial and masked key tiles). RINGATTN_HOPPER_TILE=<name> overrides it where the
// configuration exists for the head dim (for benchmarking the alternatives on one build).
const VariantInfo& pick_variant(const FlashParams& p) {
  const bool d64 = p.q.dim == 64;
  const bool long_rows = p.k.len >= (p.mask.causal ? 16384 : 8192);
  const VariantInfo* pick = d64 ? &kVariants[2] : (long_rows ? &kVariants[1] : &kVariants[0]);
  if (const char* env = std::getenv("RINGATTN_HOPPER_TILE")) {
    for (const VariantInfo& vi : kVariants)
      if (std::strcmp(env, vi.name) == 0 && (d64 ? vi.dim64 : vi.dim128)) pick = &vi;
  }
  return *pick;
}

template <typename T, typename C>
void launch(const HopperParams& hp, int sms, cudaStream_t stream) {
  auto kernel = hopper::hopper_flash_kernel<T, C>;
  static std::atomic<uint64_t> configured{0};
  set_dynamic_smem_once(kernel, C::kSmemBytes, configured);
  const int grid = hp.num_tiles < sms ? hp.num_tiles : sms;
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(hp);
  RA_HOPPER_CHECK(cudaGetLastError());
}

template <typename T>
void launch_variant(Variant v, int d, const HopperParams& hp, int sms, cudaStream_t stream) {
  using hopper::Config;
  if (d == 64) {
    switch (v) {
      case Variant::M192N128: return launch<T, Config<64, 128, 3, 2>>(hp, sms, stream);
      case Variant::M128N128: return launch<T, Config<64, 128, 2, 2>>(hp, sms, stream);
      default: fail_no_instance("hopper_flash", "tile variant (head_dim 64)", int(v), "128x128 and 192x128");
    }
  }
  if (d != 128) fail_no_instance("hopper_flash", "head_dim", d, "64 and 128");
  switch (v) {
    case Variant::M128N176: return launch<T, Config<128, 176, 2, 2>>(hp, sms, stream);
    case Variant::M128N128Q2: return launch<T, Config<128, 128, 2, 2, 2>>(hp, sms, stream);
    case Variant::M128N128: return launch<T, Config<128, 128, 2, 2>>(hp, sms, stream);
    default: fail_no_instance("hopper_flash", "tile variant (head_dim 128)", int(v), "128x128, 128x176 and 128x128q2");
  }
}

}  // namespace

namespace hopper_detail {

bool device_ready(int device, int* sms) {
  const DeviceInfo info = device_info(device);
  if (sms != nullptr) *sms = info.sms;
  return info.hopper;
}

bool fits(const FlashParams& p) {
  const VariantInfo& vi = pick_variant(p);
  return params_fit(p, vi.block_m, vi.block_n, nullptr);
}

const char* config_name(const FlashParams& p) { return pick_variant(p).name; }

bool try_launch(const FlashParams& p, int sms, cudaStream_t stream) {
  const VariantInfo& vi = pick_variant(p);
  HopperParams hp;
  if (!params_fit(p, vi.block_m, vi.block_n, &hp)) return false;
  if (hp.num_tiles == 0) return true;
  switch (p.q.dtype) {
    case DType::BF16: launch_variant<__nv_bfloat16>(vi.v, int(p.q.dim), hp, sms, stream); break;
    case DType::F16: launch_variant<__half>(vi.v, int(p.q.dim), hp, sms, stream); break;
    default: fail_no_instance("hopper_flash", "dtype", int(p.q.dtype), "bf16 and fp16");
  }
  return true;
}

}  // namespace hopper_detail
}  // namespace ringattn::cuda
