// Dense matrix multiplication on the CPU through oneDNN.
//
//   C (M, N) = op(A) (M, K) @ op(B) (K, N) [+ bias (N)] [+ C if accumulate]
//
// All matrices are row-major and contiguous. op(A) = A when A is stored (M, K), or A^T when
// trans_a and A is stored (K, M); likewise for B. A and B have the same element type `dtype`
// (f32, or bf16 which oneDNN runs on AVX512-BF16/AMX with f32 accumulation); C and bias are f32.
//
// Primitives are created once per shape and cached (creation costs milliseconds, execution of the
// small GEMMs here tens of microseconds). Thread-safety: safe to call from several threads; the
// cache is locked, each call runs on oneDNN's own OpenMP team.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>

#include "zerone/core/dtype.h"

namespace zerone::kernels::cpu {

void matmul(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m, int64_t n,
            int64_t k, DType dtype, bool accumulate, const float* bias = nullptr);
// The same without accumulation, C stored as bf16: A and B bf16, the f32 accumulators (plus the
// f32 bias) rounded to nearest even as oneDNN writes them (Note [Logits in the compute dtype],
// kernels/backend.h).
void matmul_bf16_out(const void* a, bool trans_a, const void* b, bool trans_b, void* c, int64_t m, int64_t n,
                     int64_t k, const float* bias = nullptr);

// Batched matmul with explicit strides: for every (i, j) in [0, batch0) x [0, batch1),
//   C[i,j] (M, N) = alpha * A[i,j] (M, K) @ B[i,j] (K, N) [+ C[i,j] if accumulate]
// Each operand is described by four element strides {batch0, batch1, row, column}, so views into
// interleaved layouts (the heads of a (B, T, 3C) qkv buffer, a transposed probability matrix) need
// no copies. A and B have `dtype`; C is f32.
struct Strides4 {
  int64_t batch0, batch1, row, col;
  bool operator<(const Strides4& o) const {
    return std::tie(batch0, batch1, row, col) < std::tie(o.batch0, o.batch1, o.row, o.col);
  }
};
void batched_matmul(int64_t batch0, int64_t batch1, int64_t m, int64_t n, int64_t k, const void* a, Strides4 a_strides,
                    const void* b, Strides4 b_strides, float* c, Strides4 c_strides, DType dtype, float alpha,
                    bool accumulate);

// For tests: makes every bf16 GEMM take the form an AMX CPU takes for column counts that are not a
// multiple of 16 (Note [oneDNN 2.6 AMX column tails], matmul.cc) on any CPU, with a bf16 output
// made in bands of at most `band_bytes` of f32 (0: the default band). Not synchronized with
// matmuls running on other threads; call it between them.
void force_amx_column_fallback_for_testing(bool on, size_t band_bytes = 0);

// Version string of the oneDNN library in use, e.g. "2.6.3 (cpu runtime: OpenMP, isa: ...)".
const char* onednn_version_string();

}  // namespace zerone::kernels::cpu
