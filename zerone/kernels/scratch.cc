#include "zerone/kernels/scratch.h"

#include <algorithm>

#include "zerone/kernels/cuda/sizes.h"

namespace zerone::kernels {
namespace {

// Note [Backend scratch]'s assumption about cuBLASLt's heuristic, for a matrix of
// `bytes_per_element` elements stored with leading dimension `ld`: 16-bit matrices need 16-byte
// aligned columns, f32 ones none.
bool gemm_columns_aligned(int ld, size_t bytes_per_element) {
  return bytes_per_element == 4 || static_cast<size_t>(ld) * bytes_per_element % 16 == 0;
}

}  // namespace

// Each operation below mirrors the cuda backend's branches of the same name (cuda_backend.cc)
// on the path Note [Backend scratch] counts.

ScratchCount::ScratchCount(DeviceKind kind, const DeviceOptions& options, const Backend* live)
    : counts_(kind == DeviceKind::cuda), options_(options), live_(live) {}

void ScratchCount::need(ScratchSlot slot, size_t bytes) {
  if (!counts_) return;
  size_t& kept = bytes_[static_cast<size_t>(slot)];
  kept = std::max(kept, bytes);
}

void ScratchCount::operand(ScratchSlot slot, DType dtype, DType param_dtype, size_t numel) {
  if (dtype != param_dtype) need(slot, numel * dtype_size(param_dtype));  // Note [CUDA linear]
}

bool ScratchCount::tensor_core_attention(int hs, DType operands) const {
  if (live_ != nullptr) return live_->tensor_core_attention(operands, hs);
  return operands != DType::f32 && options_.cuda_attention == CudaAttention::flash &&
         cuda::tensor_core_flash_built_for(hs);
}

bool ScratchCount::gemm(bool trans_a, bool trans_b, int m, int n, int k, DType dtype, int lda, int ldb, int ldd,
                        bool bias, DType d_dtype) {
  const size_t elem = dtype_size(dtype);
  const bool found = gemm_columns_aligned(lda, elem) && gemm_columns_aligned(ldb, elem) &&
                     gemm_columns_aligned(ldd, dtype_size(d_dtype));
  if (!found && bias && d_dtype != DType::f32) return false;  // the caller takes an f32 form
  if (!found && d_dtype != DType::f32) {
    // A band of D's columns at a time in f32, then rounded; the first band is the widest.
    const size_t band_columns = std::max<size_t>(1, cuda::kGemmWideBandBytes / (static_cast<size_t>(m) * sizeof(float)));
    const int cols = static_cast<int>(std::min<size_t>(band_columns, static_cast<size_t>(n)));
    need(ScratchSlot::wide_d, static_cast<size_t>(m) * cols * sizeof(float));
    gemm(trans_a, trans_b, m, cols, k, dtype, lda, ldb, m, false, DType::f32);
    return false;
  }
  if (!found && bias) {
    gemm(trans_a, trans_b, m, n, k, dtype, lda, ldb, ldd, false, d_dtype);
    return false;
  }
  if (!found) {  // f32 on the operands widened: a column-major rows x cols span with leading dimension ld
    auto span = [](int rows, int cols, int ld) { return static_cast<size_t>(cols - 1) * ld + rows; };
    need(ScratchSlot::wide_a, span(trans_a ? k : m, trans_a ? m : k, lda) * sizeof(float));
    need(ScratchSlot::wide_b, span(trans_b ? n : k, trans_b ? k : n, ldb) * sizeof(float));
    return gemm(trans_a, trans_b, m, n, k, DType::f32, lda, ldb, ldd, false, d_dtype);
  }
  need(ScratchSlot::gemm_workspace, kCudaGemmWorkspaceBytes);
  return bias;
}

void ScratchCount::linear_forward(DType out_dtype, DType inp_dtype, bool bias, DType param_dtype, int N, int C,
                                  int OC) {
  if (N == 0 || OC == 0) return;
  operand(ScratchSlot::operand_a, inp_dtype, param_dtype, static_cast<size_t>(N) * C);
  if (out_dtype != DType::f32) {
    if (bias) need(ScratchSlot::bias, static_cast<size_t>(OC) * dtype_size(param_dtype));  // in D's dtype
    if (gemm(true, false, OC, N, C, param_dtype, C, C, OC, bias, out_dtype) || !bias) return;
    // No algorithm with the bias epilogue: the f32 form in bands of rows, then rounded.
    const size_t band_rows = std::max<size_t>(1, cuda::kGemmWideBandBytes / (static_cast<size_t>(OC) * sizeof(float)));
    const int rows = static_cast<int>(std::min<size_t>(band_rows, static_cast<size_t>(N)));
    need(ScratchSlot::wide_d, static_cast<size_t>(rows) * OC * sizeof(float));
    linear_forward(DType::f32, param_dtype, bias, param_dtype, rows, C, OC);
    return;
  }
  if (bias) need(ScratchSlot::bias, static_cast<size_t>(OC) * sizeof(float));  // widened for the epilogue
  gemm(true, false, OC, N, C, param_dtype, C, C, OC, bias, DType::f32);
}

void ScratchCount::linear_backward(bool dinp, bool dbias, DType dout_dtype, DType inp_dtype, DType param_dtype, int N,
                                   int C, int OC) {
  if (N == 0) return;
  const size_t rows = static_cast<size_t>(N);
  // With a bias, its column sums over dout; with 16-bit weights they also store the rounded dout
  // (Note [Rounded on the way]).
  if (dbias) need(ScratchSlot::column_partials, cuda::column_sum_partials_numel(N, OC) * sizeof(float));
  if (dbias && param_dtype != DType::f32)
    need(ScratchSlot::operand_a, rows * OC * dtype_size(param_dtype));
  else
    operand(ScratchSlot::operand_a, dout_dtype, param_dtype, rows * OC);
  if (dinp) gemm(false, false, C, N, OC, param_dtype, C, OC, C, false, DType::f32);
  operand(ScratchSlot::operand_b, inp_dtype, param_dtype, rows * C);
  gemm(false, true, C, OC, N, param_dtype, C, OC, C, false, DType::f32);
}

void ScratchCount::attention_forward(int B, int T, int NH, int NKV, int hs, DType operands) {
  if (tensor_core_attention(hs, operands)) return;  // forward needs no scratch (Note [Operands rounded once])
  if (operands == DType::f32) return;
  const size_t BT = static_cast<size_t>(B) * T;
  need(ScratchSlot::attention_qkv, BT * (NH + 2 * NKV) * hs * sizeof(float));  // qkv widened
  need(ScratchSlot::attention_out, BT * NH * hs * sizeof(float));              // out before rounding
}

void ScratchCount::attention_backward(int B, int T, int NH, int NKV, int hs, DType operands) {
  const size_t rows = static_cast<size_t>(B) * NH * T;  // (B, NH, T)
  const size_t qkv_bytes = static_cast<size_t>(B) * T * (NH + 2 * NKV) * hs * sizeof(float);
  if (options_.cuda_attention == CudaAttention::flash) {
    need(ScratchSlot::scores, rows * sizeof(float));  // D
    if (tensor_core_attention(hs, operands))
      need(ScratchSlot::operand_a, cuda::tensor_core_flash_scratch_elems(B, T, NH, hs, true) * dtype_size(operands));
    else if (operands != DType::f32)
      need(ScratchSlot::attention_qkv, qkv_bytes);
    return;
  }
  if (operands != DType::f32) need(ScratchSlot::attention_qkv, qkv_bytes);
  need(ScratchSlot::scores, rows * T * sizeof(float));  // dP (B, NH, T, T)
}

void ScratchCount::norm_backward(int N, int C) {
  need(ScratchSlot::column_partials, cuda::column_sum_partials_numel(N, C) * sizeof(float));
}

void ScratchCount::sums(size_t n, size_t ranges) {
  const size_t blocks = cuda::norm_blocks(n);
  if (blocks > 0) need(ScratchSlot::norm_partials, (blocks + std::max<size_t>(ranges, 1) - 1) * sizeof(double));
}

void ScratchCount::classifier_forward(int N) {
  if (N > 0) need(ScratchSlot::hits, static_cast<size_t>(N) * sizeof(int32_t));
}

int64_t ScratchCount::bytes() const {
  size_t total = 0;
  for (size_t b : bytes_) total += b;
  return static_cast<int64_t>(total);
}

}  // namespace zerone::kernels
