// The C ABI's descriptor checks (capi/ringattn_c.cpp), shared by the single-process op and the
// ring calls (capi/ring_c.cpp): DLPack descriptors turned into views, every refusal an
// InvalidArgument naming the argument, its value and what is allowed.
#pragma once

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "attention_op.hpp"
#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "ringattn_c.h"

namespace ringattn::op {

// DLPack device types.
inline constexpr int32_t kCpu = 1, kCuda = 2;

std::string shape_text(const ringattn_tensor& t);
std::string device_text(const ringattn_device& d);
int64_t stride_of(const ringattn_tensor& t, int i);
// The descriptor `t`, checked for a usable shape and data pointer.
const ringattn_tensor& need(const char* name, const ringattn_tensor* t);
// q, k, v, out, dout and the gradients: [B, T, H, D] (or [T, H, D] packed) as a [B, H, T, D] view.
TensorView attention_view(const char* name, const ringattn_tensor* tp, bool packed);
std::string view_shape(const TensorView& v, bool packed);
void same_device(const char* name, const ringattn_tensor* t, const ringattn_tensor* q);
// The tensor `name` must have exactly the shape and dtype of `like`.
void same_as(const char* name, const TensorView& t, const char* like_name, const TensorView& like, bool packed);
// cu_seqlens: int32/int64 [docs + 1] in host memory, 0 = cu[0] <= ... <= cu[docs] = tokens.
std::vector<int64_t> parse_cu_seqlens(const ringattn_tensor* tp, int64_t tokens, int64_t max_seqlen);
// The arguments that are not tensors (mask, scale, determinism), checked.
void parse_args(AttentionCall& c, const ringattn_attention_args* a);
// The backend of the tensors' device (the CPU engine, or CUDA on the caller's stream).
std::unique_ptr<Backend> backend_for(const ringattn_tensor& q, const ringattn_attention_args& a);

// Makes `device` current for the life of the guard and restores the caller's after (the op must
// not move its host thread to another GPU); nothing for CPU tensors.
class DeviceGuard {
 public:
  explicit DeviceGuard(const ringattn_tensor& q) {
    if (q.device.device_type == kCuda && cuda_built()) previous_ = current_cuda_device();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (previous_ >= 0) set_cuda_device(previous_);
  }

 private:
  int previous_ = -1;
};

// Runs `f`, turning every exception into a status and its text in error[0, size).
template <typename F>
int32_t guarded(char* error, size_t size, F&& f) noexcept {
  int32_t rc = RINGATTN_OK;
  std::string text;
  try {
    f();
  } catch (const InvalidArgument& e) {
    rc = RINGATTN_INVALID_ARGUMENT;
    text = e.what();
  } catch (const std::exception& e) {
    rc = RINGATTN_RUNTIME_ERROR;
    text = e.what();
  } catch (...) {
    rc = RINGATTN_RUNTIME_ERROR;
    text = "an unknown exception";
  }
  if (error != nullptr && size > 0) {
    const size_t n = std::min(size - 1, text.size());
    std::memcpy(error, text.data(), n);
    error[n] = '\0';
  }
  return rc;
}

}  // namespace ringattn::op
