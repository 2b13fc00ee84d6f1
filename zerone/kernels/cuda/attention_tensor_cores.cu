// Flash attention on tensor cores: launching the kernels of attention_tensor_cores.cuh (Note [Flash
// attention on tensor cores] there) and the pass that forms D; attention.cu dispatches here when a
// model computes in 16 bits (flash_common.cuh says which calls this form takes).
#include "zerone/kernels/cuda/attention_tensor_cores.cuh"

#include <atomic>

#include "zerone/kernels/cuda/common.cuh"
#include "zerone/kernels/cuda/kernels.h"

namespace zerone::cuda {
namespace {

using namespace tensor_cores;

// ---------------------------------------------------------------- D

// D = rowsum(dO * O) (B, NH, T) from the output (16-bit, as forward stored it) and its f32
// gradient: one warp per row, the lanes' shares summed in a fixed butterfly. (The f32 form sums
// P * dP over the keys instead: it equals this, and costs a second sweep.) In the same pass dO is
// rounded to the operand dtype into dout16 (Note [Operands rounded once]), element for element
// what convert() made of it.
__global__ void tc_flash_row_dot_kernel(float* dsum, uint16_t* dout16, const float* dout, const uint16_t* out,
                                        DType operands, FlashShape s) {
  const size_t rows = static_cast<size_t>(s.B) * s.NH * s.T;
  const size_t row = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp
  const int t = static_cast<int>(row % s.T), h = static_cast<int>(row / s.T % s.NH), b = static_cast<int>(row / s.T / s.NH);
  const size_t at = s.o(b, t, h);
  float d = 0.0f;
  for (int i = lane; i < s.hs; i += 32) {
    const float dy = dout[at + i];
    d += dy * load_param(out, operands, at + i);
    store_param(dout16, operands, at + i, dy);
  }
  d = warp_sum(d);
  if (lane == 0) dsum[s.stat(b, h, t)] = d;
}

// ---------------------------------------------------------------- launching

template <typename E, int HS>
void forward_with(uint16_t* out, float* lse, const uint16_t* qkv, const FlashShape& s, float scale, cudaStream_t stream) {
  const size_t bytes = request_smem(tc_flash_forward_kernel<E, HS>, forward_smem_bytes(HS));
  ZERONE_LAUNCH(forward_grid(s, HS), kThreadsTc, bytes, stream, tc_flash_forward_kernel<E, HS>)(out, lse, qkv, s, scale);
  ZERONE_CUDA_LAUNCHED();
}

template <typename E, int HS>
void backward_with(float* dqkv, float* dsum, const uint16_t* dout, const uint16_t* qkv, const float* lse,
                   const FlashShape& s, float scale, cudaStream_t stream, const FlashBackwardMarks* marks) {
  // dsum (D) is already formed (tensor_core_flash_backward).
  const size_t dq_bytes = request_smem(tc_flash_dq_kernel<E, HS>, dq_smem_bytes(HS));
  ZERONE_LAUNCH(dq_grid(s, HS), kThreadsTc, dq_bytes, stream, tc_flash_dq_kernel<E, HS>)(dqkv, dsum, dout, qkv, lse, s, scale);
  ZERONE_CUDA_LAUNCHED();
  if (marks && marks->after_dq) ZERONE_CUDA_CHECK(cudaEventRecord(marks->after_dq, stream));
  const size_t dkv_bytes = request_smem(tc_flash_dkv_kernel<E, HS>, dkv_smem_bytes(HS));
  ZERONE_LAUNCH(dkv_grid(s, HS), kThreadsTc, dkv_bytes, stream, tc_flash_dkv_kernel<E, HS>)(dqkv, dout, qkv, lse, dsum, s, scale);
  ZERONE_CUDA_LAUNCHED();
}

// The instance for the operand dtype and head size (tensor_core_flash_takes said yes).
#define ZERONE_TC_FLASH_DISPATCH(operands, hs, CALL)                  \
  do {                                                               \
    if ((operands) == DType::bf16) {                                 \
      using E = __nv_bfloat16;                                       \
      ZERONE_TC_FLASH_HEAD_SIZES(hs, CALL);                          \
    } else {                                                         \
      using E = __half;                                              \
      ZERONE_TC_FLASH_HEAD_SIZES(hs, CALL);                          \
    }                                                                \
  } while (false)
#define ZERONE_TC_FLASH_HEAD_SIZES(hs, CALL)                         \
  switch (hs) {                                                      \
    case 16: { constexpr int HS = 16; CALL; break; }                 \
    case 32: { constexpr int HS = 32; CALL; break; }                 \
    case 64: { constexpr int HS = 64; CALL; break; }                 \
    case 96: { constexpr int HS = 96; CALL; break; }                 \
    default: { constexpr int HS = 128; CALL; break; }                \
  }

}  // namespace

bool tensor_core_flash_takes(DType operands, int hs) {
  if (operands == DType::f32 || !tensor_core_flash_built_for(hs)) return false;
  // Asked a few times per attention call: the device's limit is read once per device.
  constexpr int kDevicesKept = 64;
  static std::atomic<int> limits[kDevicesKept];  // 0: not read yet
  // Shared memory: the double-buffered sweeps (Note [Tiles loaded ahead]) need up to 105 KB a
  // block at hs 128, over the 99 KB an sm_86/sm_89 GPU lets a block opt into: there the f32 form
  // runs. The same answer for every call of a run (it depends on hs and the device only).
  int device = 0;
  ZERONE_CUDA_CHECK(cudaGetDevice(&device));
  int limit = device < kDevicesKept ? limits[device].load(std::memory_order_relaxed) : 0;
  if (limit == 0) {
    ZERONE_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (device < kDevicesKept) limits[device].store(limit, std::memory_order_relaxed);
  }
  return largest_smem_bytes(hs) <= static_cast<size_t>(limit);
}

size_t tensor_core_flash_scratch_elems(const FlashShape& s, bool backward) {
  return cuda::tensor_core_flash_scratch_elems(s.B, s.T, s.NH, s.hs, backward);  // sizes.h
}

// Note [Operands rounded once]: every block of every kernel reads its tiles from 16-bit copies
// (half the bytes of f32, no conversion in the tile loads). qkv comes stored in the operand dtype
// (Note [Attention's inputs and output in the compute dtype], kernels/backend.h), so only dO,
// which backward receives in f32, is rounded into the caller's scratch, by the pass that forms D
// (it reads dO anyway).
void tensor_core_flash_forward(uint16_t* out, float* lse, const uint16_t* qkv, const FlashShape& s, DType operands,
                               float scale, cudaStream_t stream) {
  ZERONE_ASSERT(aligned_to(out, 4) && aligned_to(qkv, 16), "tensor-core attention: misaligned qkv or out");
  ZERONE_TC_FLASH_DISPATCH(operands, s.hs, (forward_with<E, HS>(out, lse, qkv, s, scale, stream)));
}

void tensor_core_flash_backward(float* dqkv, float* dsum, const float* dout, const uint16_t* qkv, const uint16_t* out,
                                const float* lse, const FlashShape& s, DType operands, float scale, uint16_t* scratch,
                                cudaStream_t stream, const FlashBackwardMarks* marks) {
  ZERONE_ASSERT(aligned_to(dqkv, 8) && aligned_to(qkv, 16) && aligned_to(scratch, 16),
                "tensor-core attention: misaligned qkv, dqkv or scratch");
  const size_t rows = static_cast<size_t>(s.B) * s.NH * s.T;
  constexpr int kRowsPerBlock = 8;  // warps of 32 lanes, one row each
  uint16_t* dout16 = scratch;  // dO rounded, beside D
  ZERONE_LAUNCH(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, stream, tc_flash_row_dot_kernel)(dsum, dout16, dout, out, operands, s);
  ZERONE_CUDA_LAUNCHED();
  if (marks && marks->after_row_dot) ZERONE_CUDA_CHECK(cudaEventRecord(marks->after_row_dot, stream));
  ZERONE_TC_FLASH_DISPATCH(operands, s.hs,
                           (backward_with<E, HS>(dqkv, dsum, dout16, qkv, lse, s, scale, stream, marks)));
}

}  // namespace zerone::cuda