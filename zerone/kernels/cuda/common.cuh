// Device helpers shared by the CUDA backend's .cu files: grid sizing, parameter loads by dtype,
// the roundings of core/dtype.h written for the device, four-wide stores, the f32 elementwise
// launcher (launch_binary) and the warp and block sums.
// Thread-safety: pure functions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "zerone/core/dtype.h"
#include "zerone/kernels/cuda/check.h"
#include "zerone/kernels/cuda/launch.cuh"

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

// Four consecutive values x0..x3 stored as elements 4*i4 .. 4*i4+3 of an array of kDtype, with
// store_param's roundings: one 16-byte store (f32) or one 8-byte store (bf16, f16). `p` must be
// aligned for it (16 bytes for f32, 8 for the 16-bit dtypes).
template <DType kDtype>
__device__ __forceinline__ void store4(void* p, size_t i4, float x0, float x1, float x2, float x3) {
  if constexpr (kDtype == DType::f32) {
    static_cast<float4*>(p)[i4] = make_float4(x0, x1, x2, x3);
  } else {
    const auto bits = [](float x) -> uint32_t {
      return kDtype == DType::bf16 ? f32_to_bf16_bits(x) : f32_to_f16_bits(x);
    };
    static_cast<uint2*>(p)[i4] = make_uint2(bits(x0) | bits(x1) << 16, bits(x2) | bits(x3) << 16);
  }
}

// Elements 4*i4 .. 4*i4+3 of an array of kDtype, widened to f32 (load_param's widenings): one
// 16-byte load (f32) or one 8-byte load (bf16, f16), aligned as store4's.
template <DType kDtype>
__device__ __forceinline__ float4 load4(const void* p, size_t i4) {
  if constexpr (kDtype == DType::f32) {
    return static_cast<const float4*>(p)[i4];
  } else {
    const uint2 v = static_cast<const uint2*>(p)[i4];
    const auto wide = [](uint32_t bits) {
      const auto half = static_cast<uint16_t>(bits);
      return kDtype == DType::bf16 ? bf16_bits_to_f32(half) : f16_bits_to_f32(half);
    };
    return make_float4(wide(v.x), wide(v.x >> 16), wide(v.y), wide(v.y >> 16));
  }
}
// Whether p is a multiple of `bytes`.
inline bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
// Whether an array of `dtype` at p can be read or written four elements at a time (load4, store4).
inline bool aligned4(const void* p, DType dtype) { return aligned_to(p, dtype == DType::f32 ? 16 : 8); }
// Runs body(std::integral_constant<DType, d>{}) for the runtime dtype d: a kernel templated on a
// dtype launched for the one in hand.
template <typename Body>
void with_dtype(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::f32: body(std::integral_constant<DType, DType::f32>{}); return;
    case DType::bf16: body(std::integral_constant<DType, DType::bf16>{}); return;
    case DType::f16: body(std::integral_constant<DType, DType::f16>{}); return;
  }
}

// Whether n elements at src (f32) and dst (of dst_dtype) can go four at a time: store4's alignment
// and float4 loads.
inline bool vectorizable4(const void* src, const void* dst, DType dst_dtype, size_t n) {
  return n % 4 == 0 && aligned_to(src, 16) && aligned4(dst, dst_dtype);
}

// Whether n elements of f32 arrays can go four at a time: n % 4 == 0 and each array 16-byte aligned.
inline bool f32_vectorizable4(size_t n, std::initializer_list<const float*> arrays) {
  if (n % 4 != 0) return false;
  for (const float* p : arrays)
    if (!aligned_to(p, 16)) return false;
  return true;
}

// Elementwise out[i] = Op()(a[i], b[i]) over f32 arrays (out may be a or b), one element a
// thread-step, or four (16-byte loads and stores; n4 = n / 4) where f32_vectorizable4 allows.
template <typename Op>
__global__ void binary_kernel(float* out, const float* a, const float* b, size_t n) {
  ZERONE_GRID_STRIDE(i, n) out[i] = Op()(a[i], b[i]);
}
template <typename Op>
__global__ void binary4_kernel(float4* out, const float4* a, const float4* b, size_t n4) {
  ZERONE_GRID_STRIDE(i, n4) {
    const float4 x = a[i], y = b[i];
    const Op op{};
    out[i] = make_float4(op(x.x, y.x), op(x.y, y.y), op(x.z, y.z), op(x.w, y.w));
  }
}
template <typename Op>
void launch_binary(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (f32_vectorizable4(n, {out, a, b}))
    ZERONE_LAUNCH(grid_for(n / 4), kThreads, 0, stream, binary4_kernel<Op>)(
        reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b), n / 4);
  else
    ZERONE_LAUNCH(grid_for(n), kThreads, 0, stream, binary_kernel<Op>)(out, a, b, n);
  ZERONE_CUDA_LAUNCHED();
}

struct Add {
  __device__ float operator()(float x, float y) const { return x + y; }
};

// Sum of v over the warp's 32 lanes (all active), by an xor butterfly: at each level both lanes
// of a pair add the same two values, and float addition commutes, so every lane ends with the
// same bits, the same every run.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
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
