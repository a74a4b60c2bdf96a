// A Backend that forwards every call to another one and throws std::bad_alloc from flash()
// whenever `fires()` says so: an exception from inside a ring hop, as a backend whose workspace
// allocation fails would throw (issue 12: the repro was --tile-q 1000000000).
#pragma once

#include <functional>
#include <new>
#include <string>

#include "kernels/backend.hpp"

namespace ringattn::test {

class ThrowingBackend final : public Backend {
 public:
  ThrowingBackend(Backend& inner, std::function<bool()> fires) : inner_(inner), fires_(std::move(fires)) {}
  std::string name() const override { return inner_.name(); }
  bool device_memory() const override { return inner_.device_memory(); }
  int device() const override { return inner_.device(); }
  void* allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void deallocate(void* p) override { inner_.deallocate(p); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { inner_.copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { inner_.copy_to_host(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { inner_.copy(dst, src, bytes); }
  void flash(const FlashParams& p) override {
    if (fires_()) {
      ++throws_;
      throw std::bad_alloc();
    }
    inner_.flash(p);
  }
  void decode(const DecodeParams& p) override { inner_.decode(p); }
  void merge(const MergeParams& p) override { inner_.merge(p); }
  void finalize(const FinalizeParams& p) override { inner_.finalize(p); }
  void fill_empty(const StateView& s) override { inner_.fill_empty(s); }
  void synchronize() override { inner_.synchronize(); }
  void* stream() const override { return inner_.stream(); }

  int throws() const { return throws_; }

 private:
  Backend& inner_;
  std::function<bool()> fires_;
  int throws_ = 0;
};

}  // namespace ringattn::test
