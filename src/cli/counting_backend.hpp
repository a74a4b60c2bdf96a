// A Backend that forwards every call to another one and counts the bytes allocated through it:
// the "workspace" line of the report (inputs, outputs and whatever the runner allocates for K/V
// blocks and states), measured where it happens rather than estimated.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/backend.hpp"

namespace ringattn::cli {

class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  bool device_memory() const override { return inner_->device_memory(); }
  void* allocate(size_t bytes) override {
    void* p = inner_->allocate(bytes);
    std::lock_guard<std::mutex> g(mu_);
    sizes_[p] = bytes;
    current_ += bytes;
    peak_ = std::max(peak_, current_);
    return p;
  }
  void deallocate(void* p) override {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (auto it = sizes_.find(p); it != sizes_.end()) {
        current_ -= it->second;
        sizes_.erase(it);
      }
    }
    inner_->deallocate(p);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { inner_->copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { inner_->copy_to_host(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { inner_->copy(dst, src, bytes); }
  void flash(const FlashParams& p) override { inner_->flash(p); }
  void decode(const DecodeParams& p) override { inner_->decode(p); }
  void merge(const MergeParams& p) override { inner_->merge(p); }
  void finalize(const FinalizeParams& p) override { inner_->finalize(p); }
  void fill_empty(const StateView& s) override { inner_->fill_empty(s); }
  void synchronize() override { inner_->synchronize(); }
  void set_wait_timeout(double seconds) override { inner_->set_wait_timeout(seconds); }
  void* stream() const override { return inner_->stream(); }
  int device() const override { return inner_->device(); }

  size_t peak_bytes() const {
    std::lock_guard<std::mutex> g(mu_);
    return peak_;
  }
  // Starts a new peak from what is allocated now (bench measures each size on its own).
  void reset_peak() {
    std::lock_guard<std::mutex> g(mu_);
    peak_ = current_;
  }

 private:
  std::unique_ptr<Backend> inner_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  size_t current_ = 0, peak_ = 0;
};

}  // namespace ringattn::cli
