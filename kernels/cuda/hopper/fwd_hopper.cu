// Host side of the Hopper flash forward that nvcc compiles: the kernel instantiations, their
// launch, and the two device facts the dispatch asks about (is the sm_90a image loaded, how much
// shared memory a configuration takes). The call's checks and tensor maps are hopper_plan.cpp.
#include <cuda_runtime.h>

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/hopper/fwd_hopper_kernel.cuh"
#include "kernels/cuda/hopper/hopper_launch.hpp"
#include "kernels/cuda/hopper/fwd_hopper_redo.cuh"

namespace ringattn::cuda::hopper_detail {
namespace {

using hopper::Config;
using hopper::HopperParams;

// Set to 1 only in the sm_90a image: tells the host whether the kernel it would launch on this
// device is the real one or the trap that other targets compile.
__device__ int g_hopper_has_wgmma = RA_HOPPER_WGMMA;

// Config<head dim, key tile, consumer warpgroups, stages, Q buffers> of each tile configuration.
template <int D, HopperTile kTile>
struct ConfigOf;
template <>
struct ConfigOf<64, HopperTile::M128N128> { using type = Config<64, 128, 2, 2>; };
template <>
struct ConfigOf<64, HopperTile::M192N128> { using type = Config<64, 128, 3, 2>; };
template <>
struct ConfigOf<128, HopperTile::M128N128> { using type = Config<128, 128, 2, 2>; };
template <>
struct ConfigOf<128, HopperTile::M128N176> { using type = Config<128, 176, 2, 2>; };
template <>
struct ConfigOf<128, HopperTile::M128N128Q2> { using type = Config<128, 128, 2, 2, 2>; };
template <>
struct ConfigOf<128, HopperTile::M128N176C2> { using type = Config<128, 176, 2, 2, 1, 2>; };
template <>
struct ConfigOf<128, HopperTile::M128N128C2> { using type = Config<128, 128, 2, 2, 1, 2>; };
// Head dim 256: O takes 128 registers per consumer thread and a 128-row Q tile 64 KB, so the key
// tile is 80 (S: 40 registers; two 40 KB stages each of K and V, 224 KB in all).
template <>
struct ConfigOf<256, HopperTile::M128N80> { using type = Config<256, 80, 2, 2>; };

// Calls f.template operator()<C>() with the Config of (tile, d); the error default names what
// has no instantiation.
template <typename F>
void with_config(HopperTile tile, int d, F&& f) {
  if (d == 64) {
    switch (tile) {
      case HopperTile::M192N128: return f.template operator()<ConfigOf<64, HopperTile::M192N128>::type>();
      case HopperTile::M128N128: return f.template operator()<ConfigOf<64, HopperTile::M128N128>::type>();
      default: fail_no_instance("hopper_flash", "tile (head_dim 64)", int(tile), "128x128 and 192x128");
    }
  }
  if (d == 256) {
    if (tile == HopperTile::M128N80) return f.template operator()<ConfigOf<256, HopperTile::M128N80>::type>();
    fail_no_instance("hopper_flash", "tile (head_dim 256)", int(tile), "128x80");
  }
  if (d != 128) fail_no_instance("hopper_flash", "head_dim", d, "64, 128 and 256");
  switch (tile) {
    case HopperTile::M128N176: return f.template operator()<ConfigOf<128, HopperTile::M128N176>::type>();
    case HopperTile::M128N128Q2: return f.template operator()<ConfigOf<128, HopperTile::M128N128Q2>::type>();
    case HopperTile::M128N128: return f.template operator()<ConfigOf<128, HopperTile::M128N128>::type>();
    case HopperTile::M128N176C2: return f.template operator()<ConfigOf<128, HopperTile::M128N176C2>::type>();
    case HopperTile::M128N128C2: return f.template operator()<ConfigOf<128, HopperTile::M128N128C2>::type>();
    default:
      fail_no_instance("hopper_flash", "tile (head_dim 128)", int(tile),
                       "128x128, 128x176, 128x128q2, 128x176c2 and 128x128c2");
  }
}

// The dynamic schedule's two counters for launches on `stream` of the current device: zeroed
// once here, and by the last CTA of every launch after that (schedule_done), so launches on one
// stream, which run one after another, share them; each stream has its own pair. Kept for the
// life of the process (8 bytes per stream used).
int* tile_counters(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  int device = 0;
  RA_CHECK_CUDA(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  int*& c = counters[{device, stream}];
  if (c == nullptr) {
    int* fresh = nullptr;
    RA_CHECK_CUDA(cudaMalloc(&fresh, 2 * sizeof(int)));
    RA_CHECK_CUDA(cudaMemsetAsync(fresh, 0, 2 * sizeof(int), stream));  // ordered before the stream's launches
    c = fresh;
  }
  return c;
}

// How many clusters of configuration C fit on the current device at once (0 when none: the
// plan then refuses the configuration), asked once per device.
// The slow rows' list of a stream (fwd_hopper_redo.cuh) with room for `entries`: grown in stream
// order (the old one freed after the stream's earlier calls), its two counters zero.
int* redo_list(cudaStream_t stream, int entries) {
  struct List {
    int* buf = nullptr;
    int capacity = 0;
  };
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, List> lists;
  int device = 0;
  RA_CHECK_CUDA(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  List& l = lists[{device, stream}];
  if (l.capacity < entries) {
    int* fresh = nullptr;
    RA_CHECK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&fresh), (4 + 4 * size_t(entries)) * sizeof(int), stream));
    RA_CHECK_CUDA(cudaMemsetAsync(fresh, 0, 4 * sizeof(int), stream));
    if (l.buf != nullptr) RA_CHECK_CUDA(cudaFreeAsync(l.buf, stream));
    l.buf = fresh;
    l.capacity = entries;
  }
  return l.buf;
}

template <typename C>
int active_clusters() {
  static std::mutex mu;
  static std::map<int, int> by_device;
  int device = 0;
  RA_CHECK_CUDA(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  const auto found = by_device.find(device);
  if (found != by_device.end()) return found->second;
  auto kernel = hopper::hopper_flash_kernel<__nv_bfloat16, C>;  // the dtypes' instantiations take the same resources
  static std::atomic<uint64_t> configured{0};
  set_dynamic_smem_once(kernel, C::kSmemBytes, configured);
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim = {unsigned(C::kCluster), 1, 1};
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(C::kCluster));
  config.blockDim = dim3(C::kThreads);
  config.dynamicSmemBytes = size_t(C::kSmemBytes);
  config.attrs = &cluster;
  config.numAttrs = 1;
  int n = 0;
  RA_CHECK_CUDA(cudaOccupancyMaxActiveClusters(&n, kernel, &config));
  by_device[device] = n;
  return n;
}

template <typename T, typename C>
void launch_config(HopperParams hp, int sms, cudaStream_t stream) {
  auto kernel = hopper::hopper_flash_kernel<T, C>;
  static std::atomic<uint64_t> configured{0};
  set_dynamic_smem_once(kernel, C::kSmemBytes, configured);
  hp.tile_counter = tile_counters(stream);
  hp.redo_capacity = hp.num_tiles * C::kConsumers * 4;  // one entry per consumer warp and tile at most
  hp.redo = redo_list(stream, hp.redo_capacity);
  // Programmatic: a CTA's launch and prologue overlap the tail of the kernel ahead (the previous
  // call, whose CTAs free their SMs one by one); the kernel waits for it before touching memory.
  if constexpr (C::kCluster == 1) {
    const int grid = hp.num_tiles < sms ? hp.num_tiles : sms;
    RA_CHECK_CUDA(launch_programmatic(kernel, dim3(unsigned(grid)), dim3(C::kThreads), size_t(C::kSmemBytes), stream,
                                      hp));
  } else {
    // As many clusters as fit at once (a GPC with an odd number of free SMs leaves one idle), each
    // taking pairs of tiles; the plan made num_tiles even.
    const int pairs = hp.num_tiles / C::kCluster, fit = active_clusters<C>();
    const int clusters = pairs < fit ? pairs : fit;
    RA_CHECK_CUDA(launch_programmatic_clusters(kernel, dim3(unsigned(clusters * C::kCluster)), dim3(C::kThreads),
                                               size_t(C::kSmemBytes), stream, unsigned(C::kCluster), hp));
  }
  RA_CHECK_CUDA(launch_programmatic(hopper::hopper_redo_kernel<T, C::kHeadDim>, dim3(unsigned(sms)),
                                    dim3(hopper::kRedoThreads), 0, stream, hp));
}

template <typename T>
struct LaunchAs {
  const HopperLaunch& l;
  int sms;
  cudaStream_t stream;
  template <typename C>
  void operator()() const { launch_config<T, C>(l.params, sms, stream); }
};

struct SmemOf {
  int& bytes;
  template <typename C>
  void operator()() const { bytes = C::kSmemBytes; }
};
struct ClustersOf {
  int& n;
  template <typename C>
  void operator()() const {
    if constexpr (C::kCluster > 1) n = active_clusters<C>();
    else n = 0;
  }
};
struct StagesOutputOf {
  bool& staged;
  template <typename C>
  void operator()() const { staged = C::kStagedOut; }
};

}  // namespace

bool image_loaded(int /*device: current*/) {
  int has = 0;
  if (cudaMemcpyFromSymbol(&has, g_hopper_has_wgmma, sizeof(int)) != cudaSuccess) {
    (void)cudaGetLastError();
    has = 0;
  }
  return has == 1;
}

int smem_bytes(HopperTile tile, int d) {
  int bytes = 0;
  with_config(tile, d, SmemOf{bytes});
  return bytes;
}

int cluster_slots(HopperTile tile, int d) {
  int n = 0;
  with_config(tile, d, ClustersOf{n});
  return n;
}

bool stages_output(HopperTile tile, int d) {
  bool staged = false;
  with_config(tile, d, StagesOutputOf{staged});
  return staged;
}

void launch(const HopperLaunch& l, int sms, cudaStream_t stream) {
  if (l.params.num_tiles == 0) return;
  switch (l.dtype) {
    case DType::BF16: return with_config(l.tile, l.head_dim, LaunchAs<__nv_bfloat16>{l, sms, stream});
    case DType::F16: return with_config(l.tile, l.head_dim, LaunchAs<__half>{l, sms, stream});
    default: fail_no_instance("hopper_flash", "dtype", int(l.dtype), "bf16 and fp16");
  }
}

}  // namespace ringattn::cuda::hopper_detail
