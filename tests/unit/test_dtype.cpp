// The dtype table (core/dtype.hpp): its rows in enum order, the facts read from it, and
// parse_dtype's names and message, derived from the table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "core/types.hpp"

namespace ringattn {
namespace {

TEST(DTypeTable, RowsInEnumOrderWithTheirSizesAndNames) {
  ASSERT_EQ(kDTypes.size(), 3u);
  for (size_t i = 0; i < kDTypes.size(); ++i) EXPECT_EQ(size_t(kDTypes[i].id), i);
  static_assert(dtype_size(DType::F32) == 4 && dtype_size(DType::F16) == 2 && dtype_size(DType::BF16) == 2);
  EXPECT_STREQ(dtype_name(DType::F32), "fp32");
  EXPECT_STREQ(dtype_name(DType::F16), "fp16");
  EXPECT_STREQ(dtype_name(DType::BF16), "bf16");
  EXPECT_STREQ(dtype_name(DType(7)), "?");  // a value no code makes
  EXPECT_EQ(dtype_names(), "fp32, fp16, bf16");
  EXPECT_EQ(dtype_names(", ", " and "), "fp32, fp16 and bf16");
  EXPECT_STREQ(dtype_info(DType::F16).npy_descr, "<f2");
  EXPECT_EQ(dtype_info(DType::BF16).npy_descr, nullptr);
  EXPECT_EQ(dtype_info(DType::F16).max_finite, 65504.0);
}

// Each row's largest finite value is what its conversion keeps finite, and the next step up is not.
TEST(DTypeTable, LargestFiniteValuesMatchTheConversions) {
  for (const DTypeInfo& d : kDTypes) {
    uint8_t buf[4];
    store_from_float(buf, d.id, 0, float(d.max_finite));
    EXPECT_EQ(double(load_as_float(buf, d.id, 0)), d.max_finite) << d.name;
  }
  uint8_t buf[4];
  store_from_float(buf, DType::F16, 0, 65520.f);  // halfway to the next binade rounds to inf
  EXPECT_TRUE(std::isinf(load_as_float(buf, DType::F16, 0)));
}

TEST(DTypeTable, ParseTakesTheNamesAndAliases) {
  for (const auto& [name, want] : {std::pair{"fp32", DType::F32}, {"f32", DType::F32}, {"float32", DType::F32},
                                   {"fp16", DType::F16}, {"f16", DType::F16}, {"float16", DType::F16},
                                   {"half", DType::F16}, {"bf16", DType::BF16}, {"bfloat16", DType::BF16}})
    EXPECT_EQ(parse_dtype(name), want) << name;
  for (const DTypeInfo& d : kDTypes) EXPECT_EQ(parse_dtype(d.name), d.id);
  try {
    parse_dtype("fp8");
    ADD_FAILURE() << "accepted fp8";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "unknown dtype 'fp8': allowed are fp32, fp16, bf16");
  }
  EXPECT_THROW(parse_dtype(""), InvalidArgument);
  EXPECT_THROW(parse_dtype("FP32"), InvalidArgument);  // names are case-sensitive
}

}  // namespace
}  // namespace ringattn
