// A Backend that forwards every call to another one: the base of backend decorators (the CLI's
// allocation counter, fault injection, test doubles), which override only what they change.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/backend.hpp"

namespace ringattn {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  bool device_memory() const override { return inner_.device_memory(); }
  void* allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void deallocate(void* p) override { inner_.deallocate(p); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { inner_.copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { inner_.copy_to_host(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { inner_.copy(dst, src, bytes); }
  void* allocate_host(size_t bytes) override { return inner_.allocate_host(bytes); }
  void free_host(void* p) noexcept override { inner_.free_host(p); }
  void flash(const FlashParams& p) override { inner_.flash(p); }
  void flash_backward(const BackwardParams& p) override { inner_.flash_backward(p); }
  void decode(const DecodeParams& p) override { inner_.decode(p); }
  void merge(const MergeParams& p) override { inner_.merge(p); }
  void finalize(const FinalizeParams& p) override { inner_.finalize(p); }
  void fill_empty(const StateView& s) override { inner_.fill_empty(s); }
  void zero_f32(const TensorView& x) override { inner_.zero_f32(x); }
  void add_f32(const TensorView& dst, const TensorView& src) override { inner_.add_f32(dst, src); }
  void synchronize() override { inner_.synchronize(); }
  void set_wait_timeout(double seconds) override { inner_.set_wait_timeout(seconds); }
  void* stream() const override { return inner_.stream(); }
  int device() const override { return inner_.device(); }

 protected:
  Backend& inner() const { return inner_; }

 private:
  Backend& inner_;
};

}  // namespace ringattn
