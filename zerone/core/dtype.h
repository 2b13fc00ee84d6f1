// Element types and conversions.
//
// f32 is the reference precision; bf16 and f16 are storage/compute types. Conversions from f32
// round to nearest, ties to even (RNE), as hardware and PyTorch do; NaN stays NaN (quiet),
// overflow in f16 becomes inf. All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace zerone {

enum class DType : uint8_t { f32, bf16, f16 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16". Throws Error otherwise.
DType parse_dtype(std::string_view name);

using bf16_t = uint16_t;  // raw bits of a bfloat16
using f16_t = uint16_t;   // raw bits of an IEEE half

inline float bf16_to_f32(bf16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round-to-nearest-even; NaN inputs produce a quiet NaN with the sign kept.
inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((u >> 16) | 0x0040u);
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_t>((u + rounding_bias) >> 16);
}

inline float f16_to_f32(f16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, sizeof h);
  return static_cast<float>(h);
}

inline f16_t f32_to_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);  // RNE, overflow to inf
  f16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

// Bulk conversions (OpenMP-parallel and vectorized). `n` elements; buffers must not overlap.
void convert_f32_to_bf16(const float* src, bf16_t* dst, size_t n);
void convert_bf16_to_f32(const bf16_t* src, float* dst, size_t n);
void convert_f32_to_f16(const float* src, f16_t* dst, size_t n);
void convert_f16_to_f32(const f16_t* src, float* dst, size_t n);
// Copies `n` elements of `src_dtype` at `src` into f32 `dst` (a plain copy for f32).
void convert_to_f32(const void* src, DType src_dtype, float* dst, size_t n);
// Writes `n` f32 values as `dst_dtype` (RNE for bf16/f16, plain copy for f32).
void convert_from_f32(const float* src, void* dst, DType dst_dtype, size_t n);

}  // namespace zerone
