// The CUDA backend behind the Backend interface: device buffers (its own caching cudaMalloc, the
// caller's allocator, or the driver's stream-ordered pool), one compute stream (its own or the
// caller's) on which every operation is queued asynchronously, and the one place where each
// operation is validated and dispatched to a kernel (cuda_kernels.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <map>
#include <mutex>
#include <unordered_map>
#include <cstdlib>
#include <string>
#include <cstdint>
#include <utility>
#include <memory>

#include "kernels/backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/flash_dispatch.hpp"
#include "core/error.hpp"
#include "core/settings.hpp"

namespace ringattn {
namespace {

void check_same_shape(const char* what, const StateView& a, const StateView& b) {
  if (a.batch != b.batch || a.heads != b.heads || a.len != b.len || a.dim != b.dim)
    fail_arg("{} of states with different shapes: [{}, {}, {}, {}] and [{}, {}, {}, {}]", what, a.batch, a.heads,
             a.len, a.dim, b.batch, b.heads, b.len, b.dim);
}

void check_grid(const char* what, int64_t n) {
  if (n > 65535) fail_arg("{} = {} exceeds the CUDA grid limit of 65535 for one launch", what, n);
}

// The facts of `device` (cuda::query_device), read once per device and process: a backend made
// per call (the C ABI's) pays no device queries. Throws RuntimeError for a device that does not exist.
cuda::DeviceCaps device_caps(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    fail_runtime("no CUDA device is available ({}); use the CPU backend", cudaGetErrorString(err));
  }
  if (device < 0 || device >= count)
    fail_runtime("CUDA device {} does not exist: {} device(s) visible (0..{})", device, count, count - 1);
  static std::mutex mu;
  static std::map<int, cuda::DeviceCaps> known;
  const std::lock_guard<std::mutex> lock(mu);
  if (const auto it = known.find(device); it != known.end()) return it->second;
  return known[device] = cuda::query_device(device);
}

// Where the backend's buffers come from (CudaBackendConfig).
enum class Memory : uint8_t {
  Caching,  // its own cudaMalloc, freed buffers kept per size (its own stream)
  Caller,   // the caller's DeviceAllocator, in stream order
  Pool,     // cudaMallocAsync / cudaFreeAsync on the caller's stream
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const CudaBackendConfig& config, cuda::FlashKernelOptions options)
      : device_(config.device), options_(std::move(options)), caps_(device_caps(config.device)),
        own_stream_(!config.caller_stream), alloc_(config.allocator),
        memory_(config.allocator.allocate ? Memory::Caller : config.caller_stream ? Memory::Pool : Memory::Caching) {
    if (own_stream_) {
      use_device();
      RA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    } else {
      stream_ = static_cast<cudaStream_t>(config.stream);
    }
  }
  ~CudaBackend() override {
    // Destructors must not throw: errors here are dropped. A caller's stream is neither drained
    // nor destroyed: buffers still live go back in stream order.
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    if (own_stream_) cudaStreamSynchronize(stream_);
    for (auto& [bytes, p] : cached_) cudaFree(p);
    for (auto& [p, bytes] : live_) give_back(p, bytes);
    if (own_stream_) cudaStreamDestroy(stream_);
    if (previous >= 0 && previous != device_) cudaSetDevice(previous);
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  bool device_memory() const override { return true; }
  void* stream() const override { return stream_; }
  int device() const override { return device_; }

  // Memory::Caching: freed buffers are kept per size and handed out again, so that a call that
  // allocates its buffers each time (the ring runner) pays no cudaMalloc/cudaFree (which
  // synchronizes the device) after the first. Every operation runs on the one stream, so a
  // reused buffer is only touched after the work queued on it before it was freed. The other two
  // are stream-ordered by their allocator.
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    use_device();
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (memory_ != Memory::Caching) {
      void* p = nullptr;
      if (memory_ == Memory::Caller) {
        p = alloc_.allocate(alloc_.ctx, rounded, stream_);
        if (p == nullptr)
          fail_runtime("the caller's allocator returned no memory for {} bytes on GPU {}", rounded, device_);
      } else if (const cudaError_t e = cudaMallocAsync(&p, rounded, stream_); e != cudaSuccess) {
        (void)cudaGetLastError();
        fail_runtime("cudaMallocAsync of {} bytes on GPU {} failed: {} ({})", rounded, device_, cudaGetErrorString(e),
                     cudaGetErrorName(e));
      }
      live_[p] = rounded;
      return p;
    }
    if (auto it = cached_.find(rounded); it != cached_.end()) {
      void* p = it->second;
      cached_.erase(it);
      live_[p] = rounded;
      return p;
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, rounded);
    if (e == cudaErrorMemoryAllocation && !cached_.empty()) {
      cudaGetLastError();  // clear the sticky-free error, give the cache back, try once more
      release_cache();
      e = cudaMalloc(&p, rounded);
    }
    if (e != cudaSuccess)
      fail_runtime("cudaMalloc of {} bytes on GPU {} failed: {} ({})", rounded, device_, cudaGetErrorString(e),
                   cudaGetErrorName(e));
    live_[p] = rounded;
    return p;
  }
  void deallocate(void* p) override {
    if (p == nullptr) return;
    const auto it = live_.find(p);
    if (it == live_.end()) {  // not ours: free it directly (never throw here: destructors call this)
      cudaFree(p);
      return;
    }
    if (memory_ == Memory::Caching)
      cached_.emplace(it->second, p);
    else
      give_back(p, it->second);
    live_.erase(it);
  }
  // A buffer back to where it came from, after the work queued on the stream so far (noexcept).
  void give_back(void* p, size_t bytes) noexcept {
    if (memory_ == Memory::Caller) {
      if (alloc_.deallocate) alloc_.deallocate(alloc_.ctx, p, bytes, stream_);
    } else if (memory_ == Memory::Pool) {
      if (cudaFreeAsync(p, stream_) != cudaSuccess) (void)cudaGetLastError();
    } else {
      cudaFree(p);
    }
  }
  void release_cache() {
    use_device();
    RA_CHECK_CUDA(cudaStreamSynchronize(stream_));
    for (auto& [bytes, p] : cached_) RA_CHECK_CUDA(cudaFree(p));
    cached_.clear();
  }
  // Host copies complete before returning: the caller may reuse or free its host buffer.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    use_device();
    RA_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    RA_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    use_device();
    RA_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    RA_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }
  // Page-locked: the staging copies then run at the PCIe/C2C rate, without the driver's
  // pageable bounce buffer.
  void* allocate_host(size_t bytes) override {
    use_device();
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes > 0 ? bytes : 1);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail_runtime("cudaMallocHost of {} bytes (pinned staging memory for GPU {}) failed: {} ({})", bytes, device_,
                   cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return p;
  }
  void free_host(void* p) noexcept override {
    if (p != nullptr) cudaFreeHost(p);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    use_device();
    RA_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  // Validated once; the dispatch decides (and, for the Hopper kernel, encodes its tensor maps)
  // once; the launch uses what it built.
  void flash(const FlashParams& params) override {
    validate_flash(params, /*complete=*/false);
    FlashParams p = params;
    p.mask = clamp_offset(p.mask, p.q.len, p.k.len);  // the kernels' row + offset sums cannot overflow
    const cuda::FlashChoice c = cuda::choose_flash_kernel(caps_, p, options_);
    use_device();
    cuda::launch_flash(c, p, caps_, stream_);
  }

  // Validated, then the dispatch decides; the per-row D lives in a cached buffer for the call
  // (freed to the cache at once: only work queued later on the one stream can reuse it).
  void flash_backward(const BackwardParams& params) override {
    validate_backward(params);
    BackwardParams p = params;
    p.mask = clamp_offset(p.mask, p.q.len, p.k.len);  // the kernels' row + offset sums cannot overflow
    const cuda::BackwardChoice c = cuda::choose_backward_kernel(caps_, p, options_);
    if (c.path == cuda::BackwardPath::None) fail_arg("{}", c.reason);
    use_device();
    const size_t rows = size_t(p.q.batch * p.q.heads * p.q.len);
    DeviceBuffer delta(*this, rows * sizeof(float) + sizeof(int));  // D, then the non-finite flag
    cuda::launch_backward(c, p, delta.as<float>(), reinterpret_cast<int*>(delta.as<float>() + rows), stream_);
  }

  void decode(const DecodeParams& params) override {
    validate_flash(params.flash, /*complete=*/false, /*o_optional=*/true);  // the merge writes out alone then
    DecodeParams dp = params;
    dp.flash.mask = clamp_offset(dp.flash.mask, dp.flash.q.len, dp.flash.k.len);  // no offset overflow
    const FlashParams& f = dp.flash;
    if (const std::string why = cuda::cuda_layout_problem(f); !why.empty()) fail_arg("{}", why);
    if (dp.splits < 0) fail_arg("splits must be >= 1, or 0 for the default (got {})", dp.splits);
    use_device();
    const int64_t rows = f.q.batch * f.q.heads * f.q.len;
    if (f.q.dtype != DType::F32) {
      const cuda::DecodePlan plan = cuda::plan_decode_mma(f, dp.splits, caps_.sms);
      check_grid("batch * kv_heads", f.q.batch * f.k.heads);
      check_grid("packed query row blocks", plan.row_blocks);
      DeviceBuffer scratch;
      const cuda::SplitPartials parts = partials(scratch, plan.parts, rows, f.q.dim);
      cuda::launch_decode_mma(f, plan, parts, stream_);
      merge_splits({parts, f.state, f.mode, f.out});
      return;
    }
    // fp32: each key chunk through the SIMT flash kernel into its own partial, then one merge.
    // Only the keys that some row sees are split (a window's lower edge, the causal end); with
    // none, one chunk of one key that the mask hides from every row.
    const KeyRange visible = visible_range_of_rows(f.mask, 0, f.q.len, f.k.len);
    const int64_t key0 = visible.empty() ? 0 : visible.begin, keys = visible.empty() ? 1 : visible.size();
    const int64_t want = dp.splits > 0 ? dp.splits : 16;
    const int64_t chunk = (keys + want - 1) / want;
    const int64_t n = (keys + chunk - 1) / chunk;
    DeviceBuffer scratch;
    const cuda::SplitPartials parts = partials(scratch, n, rows, f.q.dim);
    for (int64_t c = 0; c < n; ++c) {
      const int64_t c0 = key0 + c * chunk, len = std::min(chunk, key0 + keys - c0);
      FlashParams sub = f;
      sub.k = f.k.rows(c0, len);
      sub.v = f.v.rows(c0, len);
      // The chunk's keys start at position c0: both edges move with the offset (the window is a
      // distance from the upper edge); clamped again for the chunk's length.
      sub.mask.q_offset = f.mask.q_offset - c0;
      sub.mask = clamp_offset(sub.mask, f.q.len, len);
      sub.mode = StateMode::Write;
      sub.state = contiguous_state(parts.o + c * rows * f.q.dim, parts.lse + c * rows, f.q.batch, f.q.heads, f.q.len,
                                   f.q.dim);
      sub.out = TensorView{};
      cuda::launch_flash_simt(sub, stream_);
    }
    merge_splits({parts, f.state, f.mode, f.out});
  }
  // The split merge, with the final cast fused when the call asks for the output (its shape is
  // checked as finalize checks it).
  void merge_splits(const cuda::MergeSplitsParams& p) {
    if (p.out.data != nullptr) check_out_shape(p.out, p.state);
    cuda::launch_merge_splits(p, stream_);
  }
  static void check_out_shape(const TensorView& out, const StateView& s) {
    if (out.batch != s.batch || out.heads != s.heads || out.len != s.len || out.dim != s.dim)
      fail_arg("output shape [{}, {}, {}, {}] does not match the state [{}, {}, {}, {}]", out.batch, out.heads,
               out.len, out.dim, s.batch, s.heads, s.len, s.dim);
  }

  void merge(const MergeParams& p) override {
    check_same_shape("merge", p.state, p.other);
    use_device();
    cuda::launch_merge(p, stream_);
  }
  void finalize(const FinalizeParams& p) override {
    check_out_shape(p.out, p.state);
    use_device();
    cuda::launch_finalize(p, stream_);
  }
  void fill_empty(const StateView& s) override {
    use_device();
    cuda::launch_fill_empty(s, stream_);
  }
  void zero_f32(const TensorView& x) override {
    check_zero_f32(x);
    use_device();
    cuda::launch_zero_f32(x, stream_);
  }
  void add_f32(const TensorView& dst, const TensorView& src) override {
    check_add_f32(dst, src);
    use_device();
    cuda::launch_add_f32(dst, src, stream_);
  }
  // Polled instead of cudaStreamSynchronize, so that the wait is bounded like every other
  // (--timeout): a stream that never drains ends the job with a message, not a hang.
  void synchronize() override {
    use_device();
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady)
        core::throw_call_failed("CUDA", "cudaStreamQuery(stream_)", __FILE__, __LINE__, cudaGetErrorString(q),
                                (long long)q, cudaGetErrorName(q));
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > wait_timeout_s_)
        fail_runtime("cuda:{}: the compute stream did not finish within {} s (--timeout)", device_, wait_timeout_s_);
      std::this_thread::yield();
    }
  }
  void set_wait_timeout(double seconds) override { wait_timeout_s_ = seconds; }

 private:
  void use_device() { RA_CHECK_CUDA(cudaSetDevice(device_)); }

  // Scratch for split partials in `buf`, a buffer of the backend for the one call: freed when the
  // call has queued its work, which only later work on the one stream can reuse (every Memory is
  // stream-ordered).
  cuda::SplitPartials partials(DeviceBuffer& buf, int64_t parts, int64_t rows, int64_t dim) {
    buf = DeviceBuffer(*this, size_t(parts * rows * (dim + 1)) * sizeof(float));
    float* base = buf.as<float>();
    return cuda::SplitPartials{base, base + parts * rows * dim, parts, rows, dim};
  }

  int device_ = 0;
  cuda::FlashKernelOptions options_;
  cuda::DeviceCaps caps_;
  bool own_stream_ = true;
  DeviceAllocator alloc_;
  Memory memory_ = Memory::Caching;
  double wait_timeout_s_ = 300.0;
  cudaStream_t stream_ = nullptr;
  static constexpr size_t kAlign = 512;
  std::multimap<size_t, void*> cached_;      // freed buffers by (rounded) size
  std::unordered_map<void*, size_t> live_;  // handed-out buffers and their size
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendConfig& config) {
  if (config.allocator.allocate == nullptr && config.allocator.deallocate != nullptr)
    fail_arg("the CUDA backend's allocator has a deallocate but no allocate function");
  return std::make_unique<CudaBackend>(
      config, cuda::flash_options(config.kernels ? *config.kernels : settings().kernels()));
}
std::unique_ptr<Backend> make_cuda_backend(int device, const KernelChoices& kernels) {
  CudaBackendConfig config;
  config.device = device;
  config.kernels = &kernels;
  return make_cuda_backend(config);
}
// The library's default: the process's kernel choices (core/settings.hpp), read once per process.
std::unique_ptr<Backend> make_cuda_backend(int device) { return make_cuda_backend(device, settings().kernels()); }
std::unique_ptr<Backend> make_cuda_backend(int device, const cuda::FlashKernelOptions& options) {
  CudaBackendConfig config;
  config.device = device;
  return std::make_unique<CudaBackend>(config, options);
}

bool cuda_built() { return true; }
int current_cuda_device() noexcept {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device;
}
void set_cuda_device(int device) noexcept {
  if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
}

bool cuda_available() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();  // no driver or no device is an answer here, not a pending error
  return ok;
}

}  // namespace ringattn
