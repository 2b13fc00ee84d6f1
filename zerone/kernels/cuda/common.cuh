// Device helpers shared by the CUDA backend's .cu files: grid sizing, parameter loads by dtype,
// and the roundings of core/dtype.h written for the device.
// Thread-safety: pure functions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "zerone/core/dtype.h"
#include "zerone/kernels/cuda/check.h"

namespace zerone::cuda {

constexpr int kThreads = 256;

// Blocks of kThreads covering n elements, capped (the kernels loop grid-stride).
inline unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks > 65535 * 8 ? 65535 * 8 : blocks);
}

#define ZERONE_GRID_STRIDE(i, n)                                                        \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

// core/dtype.h's f32_to_bf16 on the device: round to nearest even; a NaN stays a quiet NaN with
// its sign (bit for bit the host's).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}
__device__ __forceinline__ float f16_bits_to_f32(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
// Round to nearest even, overflow to infinity (as _Float16 on the host).
__device__ __forceinline__ uint16_t f32_to_f16_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

// Element i of a parameter array stored as `dtype`, widened to f32.
__device__ __forceinline__ float load_param(const void* p, DType dtype, size_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}
// Element i of a parameter array of `dtype` = x rounded to it.
__device__ __forceinline__ void store_param(void* p, DType dtype, size_t i, float x) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(p)[i] = x; return;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(x); return;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(x); return;
  }
}

// Sum of v over the block (blockDim.x a power of two <= 1024), in a fixed tree order; every thread
// gets the result. `shared` holds blockDim.x values.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  T out = shared[0];
  __syncthreads();
  return out;
}
// Maximum of v over the block, likewise.
__device__ inline float block_max(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  float out = shared[0];
  __syncthreads();
  return out;
}

}  // namespace zerone::cuda
