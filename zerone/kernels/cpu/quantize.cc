#include "zerone/kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "zerone/core/error.h"

namespace zerone::kernels::cpu {
namespace {

size_t num_blocks(size_t n, size_t block) { return (n + block - 1) / block; }

float load(const void* src, DType dtype, size_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(src)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const bf16_t*>(src)[i]);
    case DType::f16: return f16_to_f32(static_cast<const f16_t*>(src)[i]);
  }
  ZERONE_ASSERT(false, "quantize: unknown dtype");
  return 0.0f;
}

int q_max(int bits) { return bits == 8 ? 127 : 7; }

}  // namespace

size_t quantized_bytes(size_t n, int bits, size_t block) {
  ZERONE_ASSERT((bits == 4 || bits == 8) && block > 0 && block % 2 == 0, "quantize: bits ", bits, ", block ", block);
  return num_blocks(n, block) * sizeof(float) + (bits == 8 ? n : (n + 1) / 2);
}

void quantize_blockwise(const void* src, DType src_dtype, size_t n, int bits, size_t block, void* out) {
  const size_t nb = num_blocks(n, block);
  float* scales = static_cast<float*>(out);
  uint8_t* codes = reinterpret_cast<uint8_t*>(scales + nb);
  const int qm = q_max(bits);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < nb; ++b) {
    const size_t begin = b * block, end = std::min(n, begin + block);
    float amax = 0.0f;
    bool finite = true;
    for (size_t i = begin; i < end; ++i) {
      const float x = load(src, src_dtype, i);
      finite = finite && std::isfinite(x);
      amax = std::max(amax, std::fabs(x));
    }
    const float scale = finite ? amax / static_cast<float>(qm) : std::numeric_limits<float>::quiet_NaN();
    scales[b] = scale;
    const float inv = (finite && scale > 0.0f) ? 1.0f / scale : 0.0f;
    for (size_t i = begin; i < end; ++i) {
      // x * inv may exceed q_max by a rounding step: clamp. nearbyint rounds half to even.
      const float q = std::clamp(std::nearbyint(load(src, src_dtype, i) * inv), -static_cast<float>(qm),
                                 static_cast<float>(qm));
      const int code = finite ? static_cast<int>(q) : 0;
      if (bits == 8) {
        codes[i] = static_cast<uint8_t>(static_cast<int8_t>(code));
      } else {  // blocks are even-sized, so a byte never straddles two blocks' threads
        uint8_t& byte = codes[i / 2];
        const uint8_t nib = static_cast<uint8_t>(code + 8);
        byte = (i % 2 == 0) ? static_cast<uint8_t>((byte & 0xF0) | nib) : static_cast<uint8_t>((byte & 0x0F) | (nib << 4));
      }
    }
  }
}

void dequantize_blockwise(const void* in, size_t n, int bits, size_t block, void* dst, DType dst_dtype, bool accumulate) {
  ZERONE_ASSERT(!accumulate || dst_dtype == DType::f32, "dequantize: accumulation needs an f32 destination");
  const size_t nb = num_blocks(n, block);
  const float* scales = static_cast<const float*>(in);
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(scales + nb);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < nb; ++b) {
    const size_t begin = b * block, end = std::min(n, begin + block);
    const float scale = scales[b];
    for (size_t i = begin; i < end; ++i) {
      const int code = bits == 8 ? static_cast<int8_t>(codes[i])
                                 : static_cast<int>((i % 2 == 0) ? (codes[i / 2] & 0x0F) : (codes[i / 2] >> 4)) - 8;
      // A non-finite scale decodes as NaN even for code 0 (Note [Blockwise quantization]).
      const float x = std::isfinite(scale) ? static_cast<float>(code) * scale : std::numeric_limits<float>::quiet_NaN();
      switch (dst_dtype) {
        case DType::f32:
          if (accumulate) static_cast<float*>(dst)[i] += x;
          else static_cast<float*>(dst)[i] = x;
          break;
        case DType::bf16: static_cast<bf16_t*>(dst)[i] = f32_to_bf16(x); break;
        case DType::f16: static_cast<f16_t*>(dst)[i] = f32_to_f16(x); break;
      }
    }
  }
}

}  // namespace zerone::kernels::cpu
