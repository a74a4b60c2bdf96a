// Host side of the Hopper flash forward that needs no device code: the tile configuration, the
// checks of a call against what the kernel needs, and the tensor maps. The dispatch calls plan
// once per call; fwd_hopper.cu launches what it built.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/hopper/hopper_launch.hpp"
#include "kernels/cuda/hopper/hopper_tiles.hpp"
#include "core/error.hpp"

namespace ringattn::cuda::hopper_detail {
namespace {

using hopper::HopperParams;

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

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

static_assert(dtype_info(DType::F32).tensor_map_type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 &&
                  dtype_info(DType::F16).tensor_map_type == CU_TENSOR_MAP_DATA_TYPE_FLOAT16 &&
                  dtype_info(DType::BF16).tensor_map_type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
              "the dtype table's tensor-map types are cuda.h's");

// A 4-d map over (dim, len, heads, batch) in v's dtype (the table's tensor-map type and size), with
// box_cols x box_rows boxes and the 128-byte swizzle. A dimension of extent 1 is never stepped, so
// its stride is replaced by a legal one.
bool encode_view(CUtensorMap* map, const TensorView& v, int box_rows, int box_cols = 64) {
  EncodeTiledFn fn = encode_fn();
  if (fn == nullptr) return false;
  const DTypeInfo& dt = dtype_info(v.dtype);
  const cuuint64_t es = cuuint64_t(dt.bytes);
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
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  return fn(map, CUtensorMapDataType(dt.tensor_map_type), 4, v.data, dims, strides, box, estr,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The fp32 dq as the target of the fused dq's reduce-adds: boxes of 32 columns x 64 rows (128
// bytes wide).
bool encode_f32_view(CUtensorMap* map, const TensorView& v) {
  return v.dtype == DType::F32 && aligned(v.data, 16) && encode_view(map, v, 64, 32);
}

struct TileInfo {
  HopperTile tile;
  int block_m, block_n;
  bool dim64, dim128, dim256;  // head dims it is instantiated for (shared memory / registers decide)
  int cluster;                 // CTAs per cluster (Config::kCluster)
  bool has(int64_t d) const { return d == 64 ? dim64 : d == 128 ? dim128 : d == 256 && dim256; }
  // Whether its clusters can pair p's tiles (hopper_tiles.hpp, tiles_pair).
  bool takes(const FlashParams& p) const {
    if (cluster == 1) return true;
    if (p.k.heads < 1 || p.q.heads % p.k.heads != 0 || p.q.len > INT32_MAX) return false;  // layout_problem refuses these
    return hopper::tiles_pair(p.mask, int(p.q.heads / p.k.heads), int((p.q.len + block_m - 1) / block_m), cluster);
  }
};
constexpr TileInfo kTiles[] = {
    {HopperTile::M128N128, 128, 128, true, true, false, 1},
    {HopperTile::M128N176, 128, 176, false, true, false, 1},
    {HopperTile::M192N128, 192, 128, true, false, false, 1},
    {HopperTile::M128N128Q2, 128, 128, false, true, false, 1},
    {HopperTile::M128N80, 128, 80, false, false, true, 1},
    {HopperTile::M128N176C2, 128, 176, false, true, false, 2},
    {HopperTile::M128N128C2, 128, 128, false, true, false, 2},
};

const TileInfo& tile_info(HopperTile t) {
  for (const TileInfo& ti : kTiles)
    if (ti.tile == t) return ti;
  fail_no_instance("hopper_flash", "tile", int(t),
                   "128x128, 128x176, 192x128, 128x128q2, 128x80, 128x176c2 and 128x128c2");
}

// Shapes, dtypes and alignment: what the kernel and the bulk copy engine need of the views.
const char* layout_problem(const FlashParams& p, int block_m) {
  const TensorView &q = p.q, &k = p.k, &v = p.v;
  if (q.dtype != DType::BF16 && q.dtype != DType::F16) return "it needs bf16 or fp16";
  if (k.dtype != q.dtype || v.dtype != q.dtype) return "it needs q, k and v in one dtype";
  if (q.dim != 64 && q.dim != 128 && q.dim != 256) return "it needs head_dim 64, 128 or 256";
  if (k.dim != q.dim || v.dim != q.dim) return "it needs one head_dim for q, k and v";
  if (!(p.scale > 0.f) || !std::isfinite(p.scale)) return "it needs a positive softmax scale";
  if (k.heads < 1 || q.heads % k.heads != 0) return "it needs q_heads a multiple of kv_heads";
  // Tile indices and TMA coordinates are 32-bit.
  if (q.len > INT32_MAX || k.len > INT32_MAX) return "it needs q_len and kv_len below 2^31";
  if ((q.len + block_m - 1) / block_m * q.heads * q.batch > INT32_MAX / 2) return "it needs fewer than 2^30 query tiles";
  if (!aligned(q.data, 16) || !aligned(k.data, 16) || !aligned(v.data, 16))
    return "it needs q, k and v base addresses 16-byte aligned";
  const StateView& s = p.state;
  if (!aligned(s.o, 8) || (s.o_stride_t % 2) || (s.o_stride_h % 2) || (s.o_stride_b % 2))
    return "it needs the state's o 8-byte aligned with even strides";
  // The final output straight from the epilogue: the input dtype, 4-byte aligned column pairs.
  const TensorView& o = p.out;
  if (o.data != nullptr && o.dtype != q.dtype) return "it needs the output in the input dtype";
  if (o.data != nullptr && (!aligned(o.data, 4) || (o.stride_t % 2) || (o.stride_h % 2) || (o.stride_b % 2)))
    return "it needs the output 4-byte aligned with even strides";
  return nullptr;
}

HopperParams kernel_params(const FlashParams& p, const TileInfo& ti, bool lazy, int64_t l2_bytes) {
  const TensorView &q = p.q, &o = p.out;
  HopperParams hp{};
  hp.state = p.state;
  hp.q = p.q;
  hp.k = p.k;
  hp.v = p.v;
  hp.out = o.data;
  hp.out_stride_b = o.stride_b;
  hp.out_stride_h = o.stride_h;
  hp.out_stride_t = o.stride_t;
  hp.batch = int(q.batch);
  hp.q_heads = int(q.heads);
  hp.kv_heads = int(p.k.heads);
  hp.group = int(q.heads / p.k.heads);
  hp.q_len = int(q.len);
  hp.kv_len = int(p.k.len);
  hp.mask = p.mask;
  hp.scale = p.scale;
  hp.scale_log2 = p.scale * kLog2e;
  hp.fold = p.mode == StateMode::Fold ? 1 : 0;
  hp.lazy_rescale = lazy ? 1 : 0;
  hp.block_m = ti.block_m;
  hp.block_n = ti.block_n;
  hp.m_blocks = int((q.len + ti.block_m - 1) / ti.block_m);
  hp.num_tiles = hp.m_blocks * hp.batch * hp.q_heads;
  hp.m_shift = hopper::query_shift(p.mask, hp.q_len, ti.block_m, ti.block_n);
  // A window's tiles read a band of about window + block_m keys each; other causal tiles up to kv_len.
  const int64_t band = p.mask.windowed() ? p.mask.window + 1 + ti.block_m : p.k.len;
  hp.section_heads = hopper::section_heads(hp.batch * hp.q_heads, hp.group, band < p.k.len ? band : p.k.len,
                                           int(q.dim), int(dtype_size(q.dtype)), l2_bytes);
  return hp;
}

}  // namespace

// The default per head dim and mask, from the H200 measurements in PERF.md: hd64 gains from a
// third consumer warpgroup (its softmax is twice as heavy relative to the matrix work); hd128
// from the 176-key tile on long rows (8k full, 32k causal), while shorter rows prefer 128 keys
// (fewer partial and masked key tiles). A window of w keys makes every row at most w + 1 keys
// long: such rows are measured like full rows of that length.
HopperTile pick_tile(const FlashParams& p, const HopperOptions& opt) {
  const bool d64 = p.q.dim == 64;
  const bool windowed = p.mask.windowed() && p.mask.window < p.k.len;
  const int64_t row_keys = windowed ? p.mask.window + 1 : p.k.len;
  const bool long_rows = row_keys >= (p.mask.causal && !windowed ? 16384 : 8192);
  HopperTile pick = d64 ? HopperTile::M192N128 : (long_rows ? HopperTile::M128N176 : HopperTile::M128N128);
  // Long rows in clusters of two where the tiles pair up (K and V leave the L2 once per pair):
  // +1-3% at 16k-32k, full and causal, +0.4% at 8k full (hopper/PERF.md, 2026-12-02). Not on
  // 128 x 128 tiles: on the short rows they serve the two CTAs, which wait for each other's
  // release of every stage, lost 3-13%.
  if (pick == HopperTile::M128N176 && tile_info(HopperTile::M128N176C2).takes(p)) pick = HopperTile::M128N176C2;
  if (p.q.dim == 256) pick = HopperTile::M128N80;  // the one configuration whose registers and shared memory fit
  for (const TileInfo& ti : kTiles)
    if (opt.tile == hopper_tile_name(ti.tile) && ti.has(p.q.dim) && ti.takes(p)) pick = ti.tile;
  return pick;
}

const char* plan(const FlashParams& p, const HopperOptions& opt, int smem_optin, int64_t l2_bytes,
                 HopperLaunch* out) {
  const TileInfo& ti = tile_info(pick_tile(p, opt));
  if (const char* why = layout_problem(p, ti.block_m)) return why;
  if (smem_bytes(ti.tile, int(p.q.dim)) > smem_optin) return "it needs more shared memory per block than the device offers";
  if (ti.cluster > 1 && cluster_slots(ti.tile, int(p.q.dim)) < 1)
    return "it needs clusters of two co-resident CTAs, and none fits on this device";
  HopperLaunch l;
  l.tile = ti.tile;
  l.head_dim = int(p.q.dim);
  l.dtype = p.q.dtype;
  l.params = kernel_params(p, ti, opt.lazy, l2_bytes);
  // In a cluster each CTA loads its part of every key block (Config::kKVPartRows).
  if (!encode_view(&l.params.tm_q, p.q, ti.block_m) || !encode_view(&l.params.tm_k, p.k, ti.block_n / ti.cluster) ||
      !encode_view(&l.params.tm_v, p.v, ti.block_n / ti.cluster))
    return "it needs q, k and v strides that are multiples of 8 elements (16 bytes) that the bulk copy engine can "
           "encode";
  // The output through shared memory and bulk stores where the configuration has room for it and
  // the output's view can be encoded (16-byte aligned, strides of whole 16 bytes); otherwise the
  // epilogue stores from registers, with the same result.
  l.params.staged_out = p.out.data != nullptr && p.mode != StateMode::Fold && stages_output(ti.tile, int(p.q.dim)) &&
                                aligned(p.out.data, 16) && encode_view(&l.params.tm_out, p.out, 64)
                            ? 1
                            : 0;
  *out = l;
  return nullptr;
}

// The backward: 128-key blocks (key kernel) and 128-row query blocks (query kernel), 64-row boxes
// for every input.
const char* plan_backward(const BackwardParams& p, int smem_optin, bool fused_dq, HopperBwdLaunch* out) {
  const TensorView &q = p.q, &k = p.k, &v = p.v, &dout = p.dout;
  if (q.dtype != DType::BF16 && q.dtype != DType::F16) return "it needs bf16 or fp16";
  if (k.dtype != q.dtype || v.dtype != q.dtype || dout.dtype != q.dtype) return "it needs q, k, v and dout in one dtype";
  if (q.dim != 64 && q.dim != 128) return "it needs head_dim 64 or 128";
  if (k.dim != q.dim || v.dim != q.dim || dout.dim != q.dim) return "it needs one head_dim for q, k, v and dout";
  if (k.heads < 1 || q.heads % k.heads != 0) return "it needs q_heads a multiple of kv_heads";
  constexpr int kBlock = 128;
  if (q.len > INT32_MAX / 2 || k.len > INT32_MAX / 2) return "it needs q_len and kv_len below 2^30";
  if ((k.len + kBlock - 1) / kBlock * k.heads * k.batch > INT32_MAX ||
      (q.len + kBlock - 1) / kBlock * q.heads * q.batch > INT32_MAX)
    return "it needs fewer than 2^31 key blocks and query blocks";
  if (!aligned(q.data, 16) || !aligned(k.data, 16) || !aligned(v.data, 16) || !aligned(dout.data, 16))
    return "it needs q, k, v and dout base addresses 16-byte aligned";
  if (backward_smem_bytes(int(q.dim)) > smem_optin) return "it needs more shared memory per block than the device offers";
  HopperBwdLaunch l;
  l.head_dim = int(q.dim);
  l.dtype = q.dtype;
  hopper::HopperBwdParams& hp = l.params;
  hp.lse = p.lse;
  hp.delta = nullptr;
  hp.dq = p.dq;
  hp.dk = p.dk;
  hp.dv = p.dv;
  hp.accumulate = p.mode == GradMode::Accumulate ? 1 : 0;
  hp.batch = int(q.batch);
  hp.q_heads = int(q.heads);
  hp.kv_heads = int(k.heads);
  hp.group = int(q.heads / k.heads);
  hp.q_len = int(q.len);
  hp.kv_len = int(k.len);
  hp.mask = p.mask;
  hp.scale = p.scale;
  hp.scale_log2 = p.scale * kLog2e;
  hp.key_blocks = int((k.len + kBlock - 1) / kBlock);
  hp.q_blocks = int((q.len + kBlock - 1) / kBlock);
  if (!encode_view(&hp.tm_q, q, 64) || !encode_view(&hp.tm_k, k, 64) || !encode_view(&hp.tm_v, v, 64) ||
      !encode_view(&hp.tm_do, dout, 64))
    return "it needs q, k, v and dout strides that are multiples of 8 elements (16 bytes) that the bulk copy engine "
           "can encode";
  // The fused dq where it can run (a dq the reduce-adds can address); the query kernel
  // otherwise, which is also what deterministic mode runs.
  hp.fused_dq = fused_dq && !p.deterministic && encode_f32_view(&hp.tm_dq, p.dq) ? 1 : 0;
  *out = l;
  return nullptr;
}

}  // namespace ringattn::cuda::hopper_detail

namespace ringattn::cuda {
const char* hopper_tile_name(HopperTile t) {
  switch (t) {
    case HopperTile::M128N128: return "128x128";
    case HopperTile::M128N176: return "128x176";
    case HopperTile::M192N128: return "192x128";
    case HopperTile::M128N128Q2: return "128x128q2";
    case HopperTile::M128N80: return "128x80";
    case HopperTile::M128N176C2: return "128x176c2";
    case HopperTile::M128N128C2: return "128x128c2";
  }
  return "?";
}
}  // namespace ringattn::cuda
