// Sizes of the scratch the CUDA kernels are handed, as plain C++: the cuda backend allocates its
// scratch slots by them, and `zerone estimate` counts those slots by them (kernels/scratch.h) on a
// machine without the CUDA toolkit or a GPU. Nothing here includes a CUDA header.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>

#include "zerone/kernels/cpu/reduce.h"

namespace zerone::cuda {

// The deterministic sums (Note [Deterministic gradient norm], kernels/cpu/reduce.h) split n
// elements into chunks of kNormBlock, one double partial each.
inline size_t norm_blocks(size_t n) { return (n + kernels::cpu::kNormBlock - 1) / kernels::cpu::kNormBlock; }

// Note [Column sums in two passes] (transformer.cu): the first pass sums blocks of this many rows.
inline constexpr int kColumnSumRowsPerBlock = 64;
inline int column_sum_row_blocks(int N) { return (N + kColumnSumRowsPerBlock - 1) / kColumnSumRowsPerBlock; }
// Floats of scratch the column sums of an (N, C) tensor need (the norms' and bias_backward's): two
// partials (a norm's weight and bias gradients) per row block and column.
inline size_t column_sum_partials_numel(int N, int C) {
  return static_cast<size_t>(column_sum_row_blocks(N)) * 2 * static_cast<size_t>(C);
}

// Note [GEMM plans] (cuda_backend.cc): a 16-bit GEMM cuBLASLt has no algorithm for runs in f32 on
// its operands widened, and a 16-bit output's f32 form is made a band of at most this many bytes at a time.
inline constexpr size_t kGemmWideBandBytes = size_t{64} << 20;

// The head sizes the tensor-core flash attention is built for (attention_tensor_cores.cu; a GPU
// whose blocks cannot opt into its shared memory runs the f32 form instead: tensor_core_flash_takes).
inline bool tensor_core_flash_built_for(int hs) { return hs == 16 || hs == 32 || hs == 64 || hs == 96 || hs == 128; }
// Elements of the tensor-core form's scratch in its 16-bit operand dtype (Note [Operands rounded
// once]): backward rounds dO (B, T, NH * hs) once; forward needs none.
inline size_t tensor_core_flash_scratch_elems(int B, int T, int NH, int hs, bool backward) {
  return backward ? static_cast<size_t>(B) * T * NH * hs : 0;
}

}  // namespace zerone::cuda
