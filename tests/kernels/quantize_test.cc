// Note [Blockwise quantization] (kernels/cpu/quantize.h): golden codes, the error bound, exact
// zero blocks, int4 packing, NaN propagation and accumulation, on the cpu backend's interface.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/kernels/backend.h"

namespace zerone::kernels {
namespace {

std::vector<char> quantize(const std::vector<float>& x, int bits, size_t block) {
  std::vector<char> q(quantized_bytes(x.size(), bits, block));
  host_backend().quantize_blockwise(x.data(), DType::f32, x.size(), bits, block, q.data());
  return q;
}

std::vector<float> dequantize(const std::vector<char>& q, size_t n, int bits, size_t block) {
  std::vector<float> y(n, 0.0f);
  host_backend().dequantize_blockwise(q.data(), n, bits, block, y.data(), DType::f32, false);
  return y;
}

TEST(Quantize, Sizes) {
  EXPECT_EQ(quantized_bytes(256, 8, 256), 4u + 256u);
  EXPECT_EQ(quantized_bytes(257, 8, 256), 8u + 257u);
  EXPECT_EQ(quantized_bytes(257, 4, 256), 8u + 129u);
}

TEST(Quantize, GoldenInt8) {
  // One block: max |x| = 2.54, scale 0.02; codes round half to even.
  std::vector<float> x = {2.54f, -1.0f, 0.01f, 0.03f, 0.0f, -2.54f};
  auto q = quantize(x, 8, 8);
  float scale;
  std::memcpy(&scale, q.data(), 4);
  EXPECT_FLOAT_EQ(scale, 2.54f / 127.0f);
  const int8_t* codes = reinterpret_cast<const int8_t*>(q.data() + 4);
  const int expected[] = {127, -50, 0, 2, 0, -127};  // 0.01/0.02 = 0.5 -> 0 (even); 1.5 -> 2
  for (int i = 0; i < 6; ++i) EXPECT_EQ(codes[i], expected[i]) << i;
}

TEST(Quantize, ErrorBoundAndExactZeros) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int bits : {8, 4}) {
    const size_t block = 64, n = 1000;  // the last block is short
    std::vector<float> x(n);
    for (auto& v : x) v = normal(rng) * 3.0f;
    for (size_t i = 128; i < 192; ++i) x[i] = 0.0f;  // a whole block of zeros
    auto y = dequantize(quantize(x, bits, block), n, bits, block);
    const float qmax = bits == 8 ? 127.0f : 7.0f;
    for (size_t b = 0; b * block < n; ++b) {
      float amax = 0.0f;
      for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) amax = std::max(amax, std::fabs(x[i]));
      for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i)
        ASSERT_LE(std::fabs(y[i] - x[i]), amax / qmax / 2.0f * (1.0f + 1e-5f)) << "bits " << bits << " i " << i;
    }
    for (size_t i = 128; i < 192; ++i) EXPECT_EQ(y[i], 0.0f);
  }
}

TEST(Quantize, Int4PacksTwoPerByte) {
  std::vector<float> x = {7.0f, -7.0f, 3.0f, -1.0f, 0.0f};
  auto q = quantize(x, 4, 6);
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(q.data() + 4);
  EXPECT_EQ(codes[0], (-7 + 8) << 4 | (7 + 8));  // 7 low, -7 high
  EXPECT_EQ(codes[1], (-1 + 8) << 4 | (3 + 8));
  EXPECT_EQ(dequantize(q, 5, 4, 6), x);
}

TEST(Quantize, NonFiniteBlocksDecodeAsNaN) {
  std::vector<float> x(8, 1.0f);
  x[5] = INFINITY;
  auto y = dequantize(quantize(x, 8, 4), 8, 8, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], 1.0f);
  for (int i = 4; i < 8; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
}

TEST(Quantize, Bf16SourceAndAccumulate) {
  std::vector<bf16_t> src = {f32_to_bf16(1.0f), f32_to_bf16(-0.5f)};
  std::vector<char> q(quantized_bytes(2, 8, 2));
  host_backend().quantize_blockwise(src.data(), DType::bf16, 2, 8, 2, q.data());
  std::vector<float> acc = {10.0f, 10.0f};
  host_backend().dequantize_blockwise(q.data(), 2, 8, 2, acc.data(), DType::f32, true);
  EXPECT_NEAR(acc[0], 11.0f, 1e-6);
  EXPECT_NEAR(acc[1], 9.5f, 1.0f / 127.0f);
  std::vector<bf16_t> back(2);
  host_backend().dequantize_blockwise(q.data(), 2, 8, 2, back.data(), DType::bf16, false);
  EXPECT_EQ(bf16_to_f32(back[0]), 1.0f);
}

}  // namespace
}  // namespace zerone::kernels
