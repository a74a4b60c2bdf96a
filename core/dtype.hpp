// The dtype table: one row per DType holding everything the code knows about it (its names, its
// size, its .npy descriptor, its tensor-map and DLPack codes, the tolerances a result in it is
// checked to). Code that needs a fact about a dtype reads it here instead of testing the enum.
// Read by nvcc too (the Hopper configuration takes its value size from it): no fmt, no CUDA
// header (the tensor-map type is the CUtensorMapDataType value as an int; hopper_plan.cpp checks
// it against cuda.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringattn {

enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2 };

// How close a forward result must come to the fp64 reference (`ringattn check`, cli/check.cpp):
// allclose-style, |o - ref| <= atol + rtol * |ref| + score_rtol * M elementwise, and
// |lse - ref| <= lse_atol + lse_rtol * |ref| + D * 2^-24 * M, where M is the row's score
// magnitude: max(|lse_ref|, scale * max over its visible keys of sum_d |q_d k_d|). Each fp32 score
// carries roundoff of up to D units of that dot-product magnitude (not of the score itself: a small
// score can be the difference of large products), and the lse and the softmax weights move by as
// much (q, k ~ N(0, 30^2) give magnitudes in the thousands and output errors near 2e-4 in correct
// fp32 arithmetic; a row whose one visible score cancels to near 0 still has its lse off by ~1e-3).
// fp32 compute is far inside these otherwise; the half dtypes pay one rounding of the output (and
// on GPUs the half-precision P in P·V).
struct Tolerance {
  double atol, rtol, lse_atol, lse_rtol, score_rtol;
};

struct DTypeInfo {
  DType id;
  const char* name;                     // "fp32": --dtype, messages, reports
  const char* full_name;                // "float32": numpy's, DLPack's and torch's word for it
  std::array<const char*, 2> aliases;   // the other names parse_dtype takes (nullptr: none)
  int bytes;                            // bytes per element
  double max_finite;                    // the largest finite value
  const char* npy_descr;                // its .npy descr ("<f4"); nullptr: .npy has no such type
  int tensor_map_type;                  // CUtensorMapDataType (cuda.h) of a bulk-copy tensor map over it
  uint8_t dlpack_code;                  // DLDataTypeCode (kDLFloat 2, kDLBfloat 4); bits = 8 * bytes
  Tolerance tolerance;                  // the forward's check (above)
  // The ring backward's check (`ringattn run --backward --check`, cli/backward.cpp): max |g - ref| <=
  // grad_tolerance * max |ref| per gradient. fp32: arithmetic only (measured near 1e-6). fp16/bf16:
  // the oracle reads the same half inputs and takes D = rowsum(dO * out) from the forward's output
  // as the backward does (cpu::OracleDelta::FromOutput: out's rounding would otherwise move D, and
  // dq and dk with it, by up to ~10% at head dim 1 with N(0, 16^2) inputs); what remains is the
  // arithmetic and, on GPUs, the half-precision P and dS in the products (measured up to 2e-3 for
  // bf16).
  double grad_tolerance;
  // One backward call against the fp64 oracle, norm-wise: ||g - ref|| / ||ref|| per gradient
  // (measured: fp32 about 5e-7; fp16 and bf16 up to 1e-4 and 8e-4), for the same reason.
  double grad_norm_tolerance;
};

// In DType order (dtype_info indexes it by the enum).
inline constexpr std::array kDTypes{
    DTypeInfo{DType::F32, "fp32", "float32", {"f32", nullptr}, 4, 3.4028234663852886e38, "<f4", /*FLOAT32*/ 7,
              /*kDLFloat*/ 2, {1e-4, 1e-5, 1e-4, 1e-5, 1e-6}, 1e-4, 1e-5},
    DTypeInfo{DType::F16, "fp16", "float16", {"f16", "half"}, 2, 65504.0, "<f2", /*FLOAT16*/ 6, /*kDLFloat*/ 2,
              {1e-2, 1e-2, 1e-2, 1e-4, 1e-6}, 5e-3, 1e-3},
    DTypeInfo{DType::BF16, "bf16", "bfloat16", {nullptr, nullptr}, 2, 3.3895313892515355e38, nullptr,
              /*BFLOAT16*/ 9, /*kDLBfloat*/ 4, {1e-2, 1e-2, 1e-2, 1e-4, 1e-6}, 2e-2, 5e-3},
};

namespace dtype_detail {
constexpr bool in_enum_order() {
  for (size_t i = 0; i < kDTypes.size(); ++i)
    if (size_t(kDTypes[i].id) != i) return false;
  return true;
}
static_assert(in_enum_order(), "kDTypes lists the dtypes in DType order");
// A value outside the enum (never made by the code; only a cast of foreign bytes) reads as this.
inline constexpr DTypeInfo kUnknown{DType(0xff), "?", "?", {nullptr, nullptr}, 0, 0, nullptr, -1, 0,
                                    {0, 0, 0, 0, 0}, 0, 0};
}  // namespace dtype_detail

constexpr const DTypeInfo& dtype_info(DType t) {
  return size_t(t) < kDTypes.size() ? kDTypes[size_t(t)] : dtype_detail::kUnknown;
}
constexpr const char* dtype_name(DType t) { return dtype_info(t).name; }
constexpr int dtype_size(DType t) { return dtype_info(t).bytes; }

// The names of the table's dtypes, "fp32, fp16, bf16" (joined by `sep`; `last` before the last
// one when set: "fp32, fp16 and bf16").
std::string dtype_names(const char* sep = ", ", const char* last = nullptr);

// A dtype by its name or one of its aliases (the table's); InvalidArgument naming the value and
// the allowed names otherwise.
DType parse_dtype(const std::string& name);

}  // namespace ringattn
