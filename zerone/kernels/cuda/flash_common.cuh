// What the two forms of the CUDA backend's flash attention share (attention.cu: CUDA cores in f32;
// attention_tensor_cores.cu: tensor cores on 16-bit operands): the head views into qkv, the
// shared-memory request, and the tensor-core form's entry points, which attention.cu dispatches to.
// Thread-safety: pure functions; the launchers are called on the backend's compute stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "zerone/core/dtype.h"
#include "zerone/kernels/cuda/check.h"
#include "zerone/kernels/cuda/kernels.h"

namespace zerone::cuda {

// qkv rows (R = (NH + 2 NKV) hs): query head h at h*hs, key head kv at (NH + kv)*hs, value head
// kv at (NH + NKV + kv)*hs; query head h reads kv head h / G, G = NH / NKV.
struct FlashShape {
  int B, T, NH, NKV, hs;
  __host__ __device__ int G() const { return NH / NKV; }
  __device__ size_t row(int b, int t) const { return (static_cast<size_t>(b) * T + t) * (static_cast<size_t>(NH + 2 * NKV) * hs); }
  __device__ size_t q(int b, int t, int h) const { return row(b, t) + static_cast<size_t>(h) * hs; }
  __device__ size_t k(int b, int t, int kv) const { return row(b, t) + static_cast<size_t>(NH + kv) * hs; }
  __device__ size_t v(int b, int t, int kv) const { return row(b, t) + static_cast<size_t>(NH + NKV + kv) * hs; }
  __device__ size_t o(int b, int t, int h) const { return (static_cast<size_t>(b) * T + t) * NH * hs + static_cast<size_t>(h) * hs; }
  // Index of row t of head h in a (B, NH, T) tensor (lse, D).
  __device__ size_t stat(int b, int h, int t) const { return (static_cast<size_t>(b) * NH + h) * T + t; }
};

// Dynamic shared memory of `bytes` for `kernel`: above the 48 KiB default a kernel must opt in,
// up to the device's limit per block (sm_80: 163 KiB, sm_90: 227 KiB; the largest need, the CUDA
// cores' form at hs 256, is about 132 KiB). Returns bytes.
template <typename Kernel>
size_t request_smem(Kernel kernel, size_t bytes) {
  int device = 0, limit = 0;
  ZERONE_CUDA_CHECK(cudaGetDevice(&device));
  ZERONE_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  ZERONE_ASSERT(bytes <= static_cast<size_t>(limit), "flash attention needs ", bytes,
                " bytes of shared memory per block; this GPU offers ", limit);
  ZERONE_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return bytes;
}

// Note [Flash attention on tensor cores] (attention_tensor_cores.cu). Whether that form takes a
// call: 16-bit operands and a head size it is built for (and the shared memory it needs).
bool tensor_core_flash_takes(DType operands, int hs);
// 16-bit elements of the scratch it rounds dO into in backward (Note [Operands rounded once]).
size_t tensor_core_flash_scratch_elems(const FlashShape& s, bool backward);
// The contracts of flash_attention_forward / _backward (kernels.h) for calls it takes: qkv and out
// in `operands` (16-bit); scratch: tensor_core_flash_scratch_elems of them, 16-byte aligned.
void tensor_core_flash_forward(uint16_t* out, float* lse, const uint16_t* qkv, const FlashShape& s, DType operands,
                               float scale, cudaStream_t stream);
void tensor_core_flash_backward(float* dqkv, float* dsum, const float* dout, const uint16_t* qkv, const uint16_t* out,
                                const float* lse, const FlashShape& s, DType operands, float scale, uint16_t* scratch,
                                cudaStream_t stream, const FlashBackwardMarks* marks);

}  // namespace zerone::cuda
