#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/error.h"

namespace zerone {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  // 1 + 2^-8 lies exactly between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);
  // 1.0078125 + 2^-8 is the tie between 0x3f81 (odd) and 0x3f82 (even): goes up to even.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);
  // Just above the tie rounds up, just below rounds down.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);
}

TEST(Bf16, SpecialValues) {
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits must stay NaN (not become inf).
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(INFINITY)), INFINITY);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-INFINITY)), -INFINITY);
  // The largest finite float rounds to inf in bf16 (as RNE demands).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::max())), INFINITY);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

TEST(Bf16, BulkMatchesScalar) {
  std::vector<float> src(100000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(static_cast<float>(i)) * 1000.0f;
  std::vector<bf16_t> dst(src.size());
  convert_f32_to_bf16(src.data(), dst.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(dst[i], f32_to_bf16(src[i]));
  std::vector<float> back(src.size());
  convert_bf16_to_f32(dst.data(), back.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) ASSERT_LE(std::abs(back[i] - src[i]), std::abs(src[i]) / 256.0f);
}

TEST(F16, RoundTripAndOverflow) {
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.5f)), 1.5f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(70000.0f)), INFINITY);  // above f16 max 65504
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048.0f), f32_to_f16(1.0f));  // tie to even
}

TEST(DType, ParseNamesAndRejectsUnknown) {
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp32"), DType::f32);
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_THROW(parse_dtype("int8"), Error);
}

}  // namespace
}  // namespace zerone
