#include "zerone/core/dtype.h"

#include "zerone/core/error.h"

namespace zerone {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  ZERONE_ASSERT(false, "bad dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
  }
  ZERONE_ASSERT(false, "bad dtype");
}

DType parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp16" || name == "f16" || name == "float16") return DType::f16;
  throw Error(str_cat("unknown precision '", name, "': expected fp32, bf16 or fp16"));
}

// Note [Bulk conversion threading]: these run on activations of a few hundred KB to tens of MB;
// below ~64K elements the OpenMP fork costs more than the work, so small calls stay serial.
static constexpr size_t kParallelMin = 1 << 16;

void convert_f32_to_bf16(const float* src, bf16_t* dst, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void convert_bf16_to_f32(const bf16_t* src, float* dst, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void convert_f32_to_f16(const float* src, f16_t* dst, size_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void convert_f16_to_f32(const f16_t* src, float* dst, size_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void convert_to_f32(const void* src, DType src_dtype, float* dst, size_t n) {
  switch (src_dtype) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::bf16: convert_bf16_to_f32(static_cast<const bf16_t*>(src), dst, n); return;
    case DType::f16: convert_f16_to_f32(static_cast<const f16_t*>(src), dst, n); return;
  }
}

void convert_from_f32(const float* src, void* dst, DType dst_dtype, size_t n) {
  switch (dst_dtype) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::bf16: convert_f32_to_bf16(src, static_cast<bf16_t*>(dst), n); return;
    case DType::f16: convert_f32_to_f16(src, static_cast<f16_t*>(dst), n); return;
  }
}

}  // namespace zerone
