// A Backend that forwards every call to another one and throws std::bad_alloc from flash()
// whenever `fires()` says so: an exception from inside a ring hop, as a backend whose workspace
// allocation fails would throw (issue 12: the repro was --tile-q 1000000000).
#pragma once

#include <functional>
#include <new>
#include <string>

#include "kernels/forwarding_backend.hpp"

namespace ringattn::test {

class ThrowingBackend final : public ForwardingBackend {
 public:
  ThrowingBackend(Backend& inner, std::function<bool()> fires) : ForwardingBackend(inner), fires_(std::move(fires)) {}
  void flash(const FlashParams& p) override {
    if (fires_()) {
      ++throws_;
      throw std::bad_alloc();
    }
    ForwardingBackend::flash(p);
  }

  int throws() const { return throws_; }

 private:
  std::function<bool()> fires_;
  int throws_ = 0;
};

}  // namespace ringattn::test
