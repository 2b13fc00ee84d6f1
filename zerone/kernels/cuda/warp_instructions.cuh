// The warp-level instructions of the tensor-core flash attention (attention_tensor_cores.cuh),
// each one function: mma.sync m16n8k16, ldmatrix x4, shfl.xor, ex2.approx and the cp.async
// copies. Compiled by nvcc each is its PTX instruction;
// compiled by a host compiler each is its emulation on emulated_gpu.h's fibers (Note [Emulated
// warps]), so that a test runs the kernels' own source on the host (tests/kernels/
// tensor_core_emulated_test.cc).
// Thread-safety: device functions of one thread; the .sync.aligned ones (mma, ldmatrix, shfl) are
// called by all 32 lanes of a warp in warp-uniform control flow.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "zerone/kernels/cuda/launch.cuh"  // ZERONE_DYNAMIC_SHARED

#if !defined(__CUDACC__)
#include <cmath>

#include "zerone/core/dtype.h"
#include "zerone/kernels/cuda/emulated_gpu.h"
#endif

namespace zerone::cuda {

// mma.sync.aligned.m16n8k16.row.col.f32.E.E.f32: c (16 x 8, f32) += a (16 x 16) b (16 x 8) in the
// fragment layouts of Note [Flash attention on tensor cores]; E is __nv_bfloat16 or __half.
template <typename E>
__device__ __forceinline__ void mma_m16n8k16(float c[4], const uint32_t a[4], const uint32_t b[2]);

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane l names row l % 8 of matrix l / 8 at
// `row`; r[j] gets the lane's two elements of matrix j (Note [Fragments by ldmatrix]).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint16_t* row);
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const uint16_t* row);

// shfl.sync.bfly over all 32 lanes: v of lane (this lane ^ lane_mask).
__device__ __forceinline__ float shfl_xor(float v, int lane_mask);

// ex2.approx.ftz.f32: 2^x, relative error about 2^-22, subnormal results flushed to zero.
__device__ __forceinline__ float exp2_approx(float x);

// cp.async of 16 (.cg) or 4 (.ca) bytes from global to shared memory; valid false copies none and
// zero-fills dst. commit closes this thread's group of copies; wait returns once at most
// kPending of its committed groups are still in flight (Note [Tiles loaded ahead]).
__device__ __forceinline__ void copy16_async(uint16_t* dst, const uint16_t* src, bool valid);
__device__ __forceinline__ void copy4_async(float* dst, const float* src, bool valid);
__device__ __forceinline__ void copies_commit();
template <int kPending>
__device__ __forceinline__ void copies_wait();

#if defined(__CUDACC__)

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint16_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const uint16_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ float shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void copy16_async(uint16_t* dst, const uint16_t* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy4_async(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void copies_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

#else  // a host compiler: Note [Emulated warps] (emulated_gpu.h)

namespace emulated_detail {
inline float widen(__nv_bfloat16*, uint16_t bits) { return bf16_to_f32(bits); }
inline float widen(__half*, uint16_t bits) { return f16_to_f32(bits); }
inline uint16_t half_of(uint32_t word, int high) { return static_cast<uint16_t>(high ? word >> 16 : word); }
}  // namespace emulated_detail

template <typename E>
inline void mma_m16n8k16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  struct Fragments {
    uint32_t a[4], b[2];
  };
  const Fragments mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  Fragments all[32];
  emulated::warp_exchange(&mine, all, sizeof mine);
  using emulated_detail::half_of;
  // A (16 x 16): row r, column k is in lane 4 (r % 8) + (k % 8) / 2, register (r >= 8) + 2 (k >= 8),
  // half k % 2. B (16 x 8): row k, column n in lane 4 n + (k % 8) / 2, register k >= 8, half k % 2.
  const auto A = [&](int r, int k) {
    return emulated_detail::widen(static_cast<E*>(nullptr),
                                  half_of(all[4 * (r % 8) + (k % 8) / 2].a[(r >= 8) + 2 * (k >= 8)], k % 2));
  };
  const auto B = [&](int k, int n) {
    return emulated_detail::widen(static_cast<E*>(nullptr), half_of(all[4 * n + (k % 8) / 2].b[k >= 8], k % 2));
  };
  const int lane = emulated::lane_index(), g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), column = 2 * t + (e & 1);
    float sum = c[e];
    for (int k = 0; k < 16; ++k) sum = std::fma(A(row, k), B(k, column), sum);  // products of 16-bit values are exact
    c[e] = sum;
  }
}

inline void ldmatrix_x4(uint32_t r[4], const uint16_t* row) {
  emulated::check_shared(row, 16, "ldmatrix");
  const uint16_t* rows[32];
  emulated::warp_exchange(&row, rows, sizeof row);
  const int lane = emulated::lane_index(), g = lane / 4, t = lane % 4;
  for (int j = 0; j < 4; ++j) r[j] = rows[8 * j + g][2 * t] | static_cast<uint32_t>(rows[8 * j + g][2 * t + 1]) << 16;
}
inline void ldmatrix_x4_trans(uint32_t r[4], const uint16_t* row) {
  emulated::check_shared(row, 16, "ldmatrix");
  const uint16_t* rows[32];
  emulated::warp_exchange(&row, rows, sizeof row);
  const int lane = emulated::lane_index(), g = lane / 4, t = lane % 4;
  for (int j = 0; j < 4; ++j) r[j] = rows[8 * j + 2 * t][g] | static_cast<uint32_t>(rows[8 * j + 2 * t + 1][g]) << 16;
}
inline float shfl_xor(float v, int lane_mask) {
  float all[32];
  emulated::warp_exchange(&v, all, sizeof v);
  return all[emulated::lane_index() ^ lane_mask];
}
inline float exp2_approx(float x) {
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}
inline void copy16_async(uint16_t* dst, const uint16_t* src, bool valid) {
  emulated::copy_async(dst, src, 16, valid ? 16 : 0);
}
inline void copy4_async(float* dst, const float* src, bool valid) { emulated::copy_async(dst, src, 4, valid ? 4 : 0); }
inline void copies_commit() { emulated::commit_copies(); }
template <int kPending>
inline void copies_wait() {
  emulated::wait_copies(kPending);
}

#endif

}  // namespace zerone::cuda
