// cuBLASLt for the CUDA backend's host build on emulated warps (zerone_kernels_cuda_emulated; Note
// [Emulated warps] in emulated_gpu.h): the calls the backend makes (cublaslt.h's table), with
// cublasLtMatmul a plain column-major GEMM on the host, D = alpha op(A) op(B) + beta C (+ the bias
// epilogue's bias on every column), f32 products summed in k order with fused multiply-adds, a
// 16-bit D rounded to nearest even once. The heuristic finds no algorithm for 16-bit operands
// whose columns (leading dimensions or pointers) are not 16-byte aligned, as cuBLASLt's does not,
// so the backend's f32 fallbacks (Note [GEMM plans]) run here where they run on a GPU.
// Thread-safety: handles, descriptors and layouts are the caller's; no shared state.
#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/kernels/cuda/cublaslt.h"

namespace zerone::cuda {
namespace {

struct Desc {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
};
struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Preference {
  uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt assumes 256 unless told
};

size_t size_of(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

float load(const void* p, cudaDataType t, size_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_16BF: return bf16_to_f32(static_cast<const bf16_t*>(p)[i]);
    default: return f16_to_f32(static_cast<const f16_t*>(p)[i]);
  }
}
void store(void* p, cudaDataType t, size_t i, float x) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(p)[i] = x; return;
    case CUDA_R_16BF: static_cast<bf16_t*>(p)[i] = f32_to_bf16(x); return;
    default: static_cast<f16_t*>(p)[i] = f32_to_f16(x); return;
  }
}

// cuBLASLt's opaque handles are pointers to these structs.
template <typename T, typename Handle>
cublasStatus_t make(Handle* handle, T value) {
  *handle = reinterpret_cast<Handle>(new T(value));
  return CUBLAS_STATUS_SUCCESS;
}
template <typename T, typename Handle>
cublasStatus_t free_handle(Handle handle) {
  delete reinterpret_cast<T*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t create(cublasLtHandle_t* handle) {
  static int the_handle;
  *handle = reinterpret_cast<cublasLtHandle_t>(&the_handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t destroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
size_t get_version() { return CUBLAS_VERSION; }

cublasStatus_t desc_create(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  return make(desc, Desc{});
}
cublasStatus_t desc_destroy(cublasLtMatmulDesc_t desc) { return free_handle<Desc>(desc); }
cublasStatus_t desc_set_attribute(cublasLtMatmulDesc_t handle, cublasLtMatmulDescAttributes_t attribute,
                                  const void* buf, size_t size) {
  Desc& d = *reinterpret_cast<Desc*>(handle);
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA: std::memcpy(&d.trans_a, buf, sizeof d.trans_a); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: std::memcpy(&d.trans_b, buf, sizeof d.trans_b); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: std::memcpy(&d.epilogue, buf, sizeof d.epilogue); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: std::memcpy(&d.bias, buf, sizeof d.bias); break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  (void)size;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t layout_create(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols,
                             int64_t ld) {
  return make(layout, Layout{type, rows, cols, ld});
}
cublasStatus_t layout_destroy(cublasLtMatrixLayout_t layout) { return free_handle<Layout>(layout); }
cublasStatus_t preference_create(cublasLtMatmulPreference_t* pref) { return make(pref, Preference{}); }
cublasStatus_t preference_destroy(cublasLtMatmulPreference_t pref) { return free_handle<Preference>(pref); }
cublasStatus_t preference_set_attribute(cublasLtMatmulPreference_t handle, cublasLtMatmulPreferenceAttributes_t attribute,
                                        const void* buf, size_t size) {
  Preference& p = *reinterpret_cast<Preference*>(handle);
  int slot = -1;
  switch (attribute) {
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: slot = 0; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: slot = 1; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: slot = 2; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: slot = 3; break;
    default: return CUBLAS_STATUS_SUCCESS;  // workspace, reduction schemes: nothing to emulate
  }
  (void)size;
  std::memcpy(&p.min_alignment[slot], buf, sizeof p.min_alignment[slot]);
  return CUBLAS_STATUS_SUCCESS;
}

// 16-bit operands need 16-byte aligned columns: every leading dimension and pointer alignment.
bool aligned_enough(const Layout& l, uint32_t alignment) {
  return l.type == CUDA_R_32F || (l.ld * static_cast<int64_t>(size_of(l.type)) % 16 == 0 && alignment >= 16);
}

cublasStatus_t algo_get_heuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t a,
                                  cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                  cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t* results,
                                  int* returned) {
  const Preference& p = *reinterpret_cast<const Preference*>(pref);
  const Layout *la = reinterpret_cast<const Layout*>(a), *lb = reinterpret_cast<const Layout*>(b),
               *lc = reinterpret_cast<const Layout*>(c), *ld = reinterpret_cast<const Layout*>(d);
  *returned = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (!aligned_enough(*la, p.min_alignment[0]) || !aligned_enough(*lb, p.min_alignment[1]) ||
      !aligned_enough(*lc, p.min_alignment[2]) || !aligned_enough(*ld, p.min_alignment[3]))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  std::memset(&results[0], 0, sizeof results[0]);
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t matmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                      cublasLtMatrixLayout_t a_layout, const void* B, cublasLtMatrixLayout_t b_layout, const void* beta,
                      const void* C, cublasLtMatrixLayout_t c_layout, void* D, cublasLtMatrixLayout_t d_layout,
                      const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t) {
  const Desc& op = *reinterpret_cast<const Desc*>(desc);
  const Layout &la = *reinterpret_cast<const Layout*>(a_layout), &lb = *reinterpret_cast<const Layout*>(b_layout),
               &lc = *reinterpret_cast<const Layout*>(c_layout), &ld = *reinterpret_cast<const Layout*>(d_layout);
  const bool ta = op.trans_a == CUBLAS_OP_T, tb = op.trans_b == CUBLAS_OP_T;
  const uint64_t m = ld.rows, n = ld.cols, k = ta ? la.rows : la.cols;
  if ((ta ? la.cols : la.rows) != m || (tb ? lb.rows : lb.cols) != n || (tb ? lb.cols : lb.rows) != k)
    return CUBLAS_STATUS_INVALID_VALUE;
  const float scale_ab = *static_cast<const float*>(alpha), scale_c = *static_cast<const float*>(beta);
  const bool bias = op.epilogue == CUBLASLT_EPILOGUE_BIAS;
  if (bias && op.bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // op(A) row by row and op(B) column by column, widened to f32 once (row i of op(A) is column i of
  // A, or row i when A is transposed: column-major).
  std::vector<float> a(m * k), b(n * k);
  for (uint64_t i = 0; i < m; ++i)
    for (uint64_t p = 0; p < k; ++p) a[i * k + p] = load(A, la.type, ta ? p + i * la.ld : i + p * la.ld);
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t p = 0; p < k; ++p) b[j * k + p] = load(B, lb.type, tb ? j + p * lb.ld : p + j * lb.ld);
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i) {
      const float *row = &a[i * k], *column = &b[j * k];
      float sum = 0.0f;
      for (uint64_t p = 0; p < k; ++p) sum = std::fma(row[p], column[p], sum);
      float out = scale_ab * sum;
      if (scale_c != 0.0f) out += scale_c * load(C, lc.type, i + j * lc.ld);
      if (bias) out += load(op.bias, ld.type, i);  // the bias is in D's dtype
      store(D, ld.type, i + j * ld.ld, out);
    }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

const CublasLtLibrary& cublaslt() {
  static const CublasLtLibrary library{create,         destroy,           get_version,       matmul,
                                       algo_get_heuristic, desc_create,    desc_destroy,      desc_set_attribute,
                                       preference_create,  preference_destroy, preference_set_attribute, layout_create,
                                       layout_destroy};
  return library;
}

bool cublaslt_loaded() { return true; }

}  // namespace zerone::cuda
