// The CPU engine behind the Backend interface. Buffers are host memory.
#include <cstdlib>
#include <cstring>

#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "core/error.hpp"
#include "core/settings.hpp"

namespace ringattn {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool device_memory() const override { return false; }
  int device() const override { return -1; }
  void* allocate(size_t bytes) override {
    // 64-byte alignment for vector loads; aligned_alloc needs a multiple of the alignment.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) fail_runtime("cpu backend: could not allocate {} bytes", bytes);
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
  // A rank with no tokens copies 0 bytes from and to null buffers: memcpy may not see them.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void flash(const FlashParams& p) override {
    cpu::flash_forward(p);
    if (p.out.data != nullptr) cpu::finalize(FinalizeParams{p.state, p.out});
  }
  void flash_backward(const BackwardParams& p) override { cpu::flash_backward(p); }
  void decode(const DecodeParams& p) override {
    cpu::decode_split_kv(p);
    if (p.flash.out.data != nullptr) cpu::finalize(FinalizeParams{p.flash.state, p.flash.out});
  }
  void merge(const MergeParams& p) override { cpu::merge_states(p); }
  void finalize(const FinalizeParams& p) override { cpu::finalize(p); }
  void fill_empty(const StateView& s) override { cpu::fill_empty(s); }
  void synchronize() override {}
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

#ifndef RINGATTN_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendConfig&) {
  fail_runtime("this ringattn was built without CUDA (configure with nvcc present and -DRINGATTN_CUDA=ON)");
}
std::unique_ptr<Backend> make_cuda_backend(int, const KernelChoices&) { return make_cuda_backend(CudaBackendConfig{}); }
std::unique_ptr<Backend> make_cuda_backend(int device) { return make_cuda_backend(device, KernelChoices{}); }
bool cuda_available() { return false; }
bool cuda_built() { return false; }
int current_cuda_device() noexcept { return -1; }
void set_cuda_device(int) noexcept {}
#endif

}  // namespace ringattn
