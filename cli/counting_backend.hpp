// A Backend that forwards every call to another one and counts the bytes allocated through it:
// the "workspace" line of the report (inputs, outputs and whatever the runner allocates for K/V
// blocks and states), measured where it happens rather than estimated.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/forwarding_backend.hpp"

namespace ringattn::cli {

class CountingBackend final : public ForwardingBackend {
 public:
  explicit CountingBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(*inner), owned_(std::move(inner)) {}
  void* allocate(size_t bytes) override {
    void* p = ForwardingBackend::allocate(bytes);
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
    ForwardingBackend::deallocate(p);
  }

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
  std::unique_ptr<Backend> owned_;  // what the base forwards to
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  size_t current_ = 0, peak_ = 0;
};

}  // namespace ringattn::cli
