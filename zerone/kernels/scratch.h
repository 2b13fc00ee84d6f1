// The scratch a device backend keeps for itself, as a function of the calls it serves, so that
// `zerone estimate`, `zerone plan` and the start-up fit check count it without making the backend.
//
// Note [Backend scratch]: besides the Buffers its callers own, the cuda backend keeps device
// buffers of its own for some operations (ScratchSlot below: 16-bit copies of GEMM operands, the
// column sums' partials, flash attention's rounded dO, cuBLASLt's workspace, ...). A slot only
// grows, to the largest call it served, and stays until the backend goes; the ledger counts the
// slots as the device's "scratch". After a step they hold, per slot, the largest need of any call
// of the step. ScratchCount is that sum as a function of the calls: a model lists its calls
// (nn::Model::count_scratch), the estimate adds the engine's (zero/estimate.cc), and each
// operation's need follows the backend's own branches with the sizes it allocates by
// (kernels/cuda/sizes.h). emulated.Cuda/BackendScratch.* holds a model's calls to the count to
// the byte on the emulated GPU; zero.device_cuda(.emulated) a whole step's, whose norm partials
// (they depend on how the engine slices an update) the count bounds (ScratchCount::sums).
// Assumed, not asked: a 16-bit GEMM gets a cuBLASLt algorithm when its leading dimensions are whole
// multiples of 16 bytes, and its f32 fallback otherwise (Note [GEMM plans]: a classifier's 10-class
// head in bf16), which holds where the operands' pointers are 16-byte aligned too: the models'
// tensors are when their widths are multiples of 8 (a unit packs its tensors unpadded). Where the
// tensor-core attention runs is asked of the backend when it exists (the start-up fit check:
// Backend::tensor_core_attention; an sm_86 or sm_89 GPU runs head size 128 in the f32 form, on a
// widened qkv); `zerone estimate` and `plan`, which make none, count it at every head size it is
// built for, as sm_80 and sm_90 run it.
// The cpu and sim backends keep scratch in host memory (the cpu kernels' Note [Scratch arena]):
// counted as nothing here, as their fit is the host's.
//
// Thread-safety: a ScratchCount is a value for one thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "zerone/core/dtype.h"
#include "zerone/kernels/backend.h"

namespace zerone::kernels {

// The cuda backend's scratch slots (kernels/cuda/cuda_backend.cc).
enum class ScratchSlot : uint8_t {
  operand_a,        // a GEMM's operand rounded to 16 bits (an activation, or dout rounded by the bias's
                    // pass or the fused GELU backward's); tensor-core attention's rounded dO
  operand_b,        // a linear backward's input rounded to 16 bits
  scores,           // flash attention's D = rowsum(dO * O) (B, NH, T); plain attention's dP (B, NH, T, T)
  norm_partials,    // the deterministic sums' double partials (Note [Deterministic gradient norm])
  flag,             // all_finite's answer (no training call: not counted)
  hits,             // softmax_cross_entropy_forward's (N) correct predictions
  gemm_workspace,   // cuBLASLt's (kCudaGemmWorkspaceBytes)
  wide_a,           // a GEMM without a 16-bit algorithm: its operands widened to f32 (Note [GEMM plans])
  wide_b,
  wide_d,           // a 16-bit output's f32 form, a band at a time
  bias,             // a linear's bias in the GEMM epilogue's dtype, 256-byte aligned
  column_partials,  // the column sums' partials (the norms' and biases' gradients)
  attention_qkv,    // qkv widened to f32 for the f32 attention forms
  attention_out,    // their f32 output
};
inline constexpr size_t kScratchSlots = 14;
static_assert(static_cast<size_t>(ScratchSlot::attention_out) + 1 == kScratchSlots, "a slot for each ScratchSlot");

class ScratchCount {
 public:
  // Counts for a backend of `kind` made with `options`: nothing for cpu and sim. With `live`, that
  // backend itself (not owned), which says where the tensor-core attention runs; without, it is
  // assumed to run at every head size it is built for.
  ScratchCount(DeviceKind kind, const DeviceOptions& options, const Backend* live = nullptr);

  // One call of each operation, its arguments as the Backend's (shapes, dtypes; a bias or dbias
  // present or not). Calls may repeat: the count keeps each slot's largest need.
  void linear_forward(DType out_dtype, DType inp_dtype, bool bias, DType param_dtype, int N, int C, int OC);
  void linear_backward(bool dinp, bool dbias, DType dout_dtype, DType inp_dtype, DType param_dtype, int N, int C,
                       int OC);
  // Note [GELU's backward in the linear's]: linear_backward's scratch with an f32 dout.
  void linear_backward_through_gelu(bool dinp, bool dbias, DType inp_dtype, DType param_dtype, int N, int C, int OC) {
    linear_backward(dinp, dbias, DType::f32, inp_dtype, param_dtype, N, C, OC);
  }
  void attention_forward(int B, int T, int NH, int NKV, int hs, DType operands);
  void attention_backward(int B, int T, int NH, int NKV, int hs, DType operands);
  void norm_backward(int N, int C);  // layernorm_backward, rmsnorm_backward
  // sum, sum_squares, sgd_update over n elements; adamw_update_ranges over `ranges` runs of n
  // elements in all is at most norm_blocks(n) + ranges - 1 partials, which this counts.
  void sums(size_t n, size_t ranges = 1);
  void classifier_forward(int N);  // softmax_cross_entropy_forward

  int64_t slot_bytes(ScratchSlot slot) const { return static_cast<int64_t>(bytes_[static_cast<size_t>(slot)]); }
  int64_t bytes() const;  // all slots

 private:
  void need(ScratchSlot slot, size_t bytes);
  // The operand of a GEMM on `param_dtype` weights, given in `dtype`: rounded into `slot` when they differ.
  void operand(ScratchSlot slot, DType dtype, DType param_dtype, size_t numel);
  bool tensor_core_attention(int hs, DType operands) const;
  // The backend's gemm(): D (m, n; ld ldd, d_dtype) = op(A) op(B) on `dtype` operands with leading
  // dimensions lda and ldb, with a bias epilogue or not. Returns whether the bias was added.
  bool gemm(bool trans_a, bool trans_b, int m, int n, int k, DType dtype, int lda, int ldb, int ldd, bool bias,
            DType d_dtype);

  bool counts_;  // cuda
  DeviceOptions options_;
  const Backend* live_;
  std::array<size_t, kScratchSlots> bytes_{};
};

}  // namespace zerone::kernels
