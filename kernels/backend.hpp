// A compute backend: where buffers live and how flash, decode, merge and the final cast run.
// The ring runner talks only to this interface (ARCHITECTURE.md, "Layers"); a new backend is a new
// file under kernels/, not an edit of the runner.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/params.hpp"

namespace ringattn {

struct KernelChoices;  // core/settings.hpp

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // True when buffers live in device memory (the host cannot dereference them).
  virtual bool device_memory() const = 0;

  // Buffers in the backend's memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Host memory for staging this backend's buffers (the MPI path's host copies of K/V blocks):
  // page-locked on a GPU, so that copy_to_host/copy_from_host run at the link's rate and need no
  // bounce buffer; plain heap memory by default. Throws RuntimeError naming the size when it
  // cannot be had. free_host(nullptr) does nothing.
  virtual void* allocate_host(size_t bytes);
  virtual void free_host(void* p) noexcept;

  // Operations. On a GPU they are queued on the compute stream and return at once;
  // synchronize() waits for everything queued. Each validates its params first.
  virtual void flash(const FlashParams& p) = 0;
  // Gradients of one attention call (BackwardParams): dq, dk, dv written or accumulated in fp32.
  virtual void flash_backward(const BackwardParams& p) = 0;
  virtual void decode(const DecodeParams& p) = 0;
  virtual void merge(const MergeParams& p) = 0;
  virtual void finalize(const FinalizeParams& p) = 0;
  virtual void fill_empty(const StateView& s) = 0;
  // fp32 views of one shape, any strides: x := 0, and dst += src (the ring backward's gradient
  // accumulators). The defaults work on host memory in place and stage device memory through the
  // host row by row (correct on any backend; a device backend may override them with kernels).
  virtual void zero_f32(const TensorView& x);
  virtual void add_f32(const TensorView& dst, const TensorView& src);
  // The checks of zero_f32 / add_f32 (InvalidArgument naming the dtype or the shapes), for
  // overrides to call first.
  static void check_zero_f32(const TensorView& x);
  static void check_add_f32(const TensorView& dst, const TensorView& src);
  virtual void synchronize() = 0;
  // Bound in seconds on synchronize() (--timeout): a device backend polls its stream and throws
  // RuntimeError past it instead of blocking for good. Host backends have nothing to wait for.
  virtual void set_wait_timeout(double /*seconds*/) {}

  // The compute stream (a cudaStream_t) for transports that order their work on it; null on CPU.
  virtual void* stream() const { return nullptr; }
  // The CUDA device that the backend's memory and stream live on; -1 for a host backend. Pure,
  // so that a decorator cannot forget to forward it.
  virtual int device() const = 0;
};

// The CPU engine (kernels/cpu) behind the interface; OpenMP threads as set by OMP_NUM_THREADS.
std::unique_ptr<Backend> make_cpu_backend();

// Device memory from the backend's caller (a framework's caching allocator): `allocate` returns
// `bytes` on the backend's device usable by work queued on `stream` (null when it has none),
// `deallocate` takes it back once the work queued on `stream` so far no longer needs it (stream
// order, as torch's caching allocator and cudaFreeAsync keep it). Null `allocate`: none given.
struct DeviceAllocator {
  void* ctx = nullptr;
  void* (*allocate)(void* ctx, size_t bytes, void* stream) = nullptr;
  void (*deallocate)(void* ctx, void* p, size_t bytes, void* stream) = nullptr;
};

// How an embedding host makes a CUDA backend (a framework's op, the C ABI):
// - caller_stream: queue every operation on `stream`, the caller's cudaStream_t (null: the legacy
//   default stream); the backend never synchronizes it except in synchronize() and the
//   copy_to_host / copy_from_host that must, and never destroys it. Off: the backend makes and
//   owns a stream of its own (the CLI, the ring).
// - allocator: scratch (the backward's per-row D, decode partials, the caller's Backend::allocate)
//   from the caller's allocator in stream order. None given: on the caller's stream, the CUDA
//   driver's stream-ordered pool (cudaMallocAsync / cudaFreeAsync); on the backend's own stream,
//   its caching allocator.
// - kernels: the kernel choices (core/settings.hpp); null: the process's, settings().kernels().
// Nothing in the backend is shared with another backend but the per-device facts (compute
// capability, SMs) read once: backends on several threads and streams do not interfere.
struct CudaBackendConfig {
  int device = 0;
  bool caller_stream = false;
  void* stream = nullptr;
  DeviceAllocator allocator;
  const KernelChoices* kernels = nullptr;
};

// The CUDA backend (kernels/cuda) as `config` says. Throws RuntimeError when the build has no
// CUDA or the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendConfig& config);
// The CUDA backend on `device` with its own stream and caching allocator and the kernel choices
// `kernels` (core/settings.hpp).
std::unique_ptr<Backend> make_cuda_backend(int device, const KernelChoices& kernels);
// The same with the process's choices, settings().kernels() (RINGATTN_FLASH_KERNEL and the other
// kernel variables, read once per process); a refused value of theirs throws InvalidArgument.
std::unique_ptr<Backend> make_cuda_backend(int device);

// True when this build has the CUDA backend and at least one GPU is visible.
bool cuda_available();
// True when this build has the CUDA backend (whether or not a GPU is visible).
bool cuda_built();
// The calling thread's current CUDA device (-1 when the build has no CUDA or none can be asked),
// and making `device` current (errors dropped: for guards that restore a caller's device).
int current_cuda_device() noexcept;
void set_cuda_device(int device) noexcept;

// RAII buffer in a backend's memory.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& b, size_t bytes) : backend_(&b), ptr_(bytes ? b.allocate(bytes) : nullptr), bytes_(bytes) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }
  void reset() {
    if (ptr_ && backend_) backend_->deallocate(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  // Gives up ownership without freeing (an error path whose transfer may still write the memory).
  void* release() {
    void* p = ptr_;
    ptr_ = nullptr;
    bytes_ = 0;
    return p;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ringattn
