// The cpu backend (kernels/backend.h): device memory is host memory from the default arena, and
// every operation is a direct call of the kernels in this folder, the executable spec of every
// other backend. Also the host backend of every build (kernels::host_backend()): optimizers with
// state on the host run their updates through it.
//
// Every device operand, with the extent the operation touches (Note [Operand ranges]), passes
// through dev() on its way to a kernel: here the identity. A backend that runs these same kernels
// on memory the host reaches another way (the simulated device, kernels/sim) derives from this
// class and overrides operand() with its translation and range check, so the operations are
// written once.
// Thread-safety: as Backend; the object holds no mutable state.
#pragma once

#include "zerone/kernels/backend.h"

namespace zerone::kernels::cpu {

class CpuBackend : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string description() const override;
  bool host_addressable() const override { return true; }
  MemoryArena& device_arena() override { return default_arena(); }
  MemPlace place_of(const void*) const override { return MemPlace::host; }

  void copy(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void accumulate(float* dst, const float* src, size_t n) override;
  PendingSum sum_squares(const float* x, size_t n, float* copy_to) override;
  double sum(const float* x, size_t n) override;
  void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) override;
  bool all_finite(const float* x, size_t n) override;
  void quantize_blockwise(const void* src, DType src_dtype, size_t n, int bits, size_t block, void* out) override;
  void dequantize_blockwise(const void* in, size_t n, int bits, size_t block, void* dst, DType dst_dtype,
                            bool accumulate) override;

  PendingSum adamw_update(float* master, float* m, float* v, const float* grad, void* param, DType param_dtype, size_t n,
                          const AdamWHyper& hyper) override;
  PendingSum sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n,
                        const SGDHyper& hyper) override;

  void embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype, int B,
                         int T, int C, int V) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                          int C, int V) override;
  void layernorm_forward(void* out, DType out_dtype, float* mean, float* rstd, const float* inp, const void* weight,
                         const void* bias, DType param_dtype, int N, int C) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const void* weight, DType param_dtype, const float* mean, const float* rstd, int N,
                          int C) override;
  void linear_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, const void* weight,
                      const void* bias, DType param_dtype, int N, int C, int OC) override;
  void linear_backward(float* dinp, float* dweight, float* dbias, const void* dout, DType dout_dtype, const void* inp,
                       DType inp_dtype, const void* weight, DType param_dtype, int N, int C, int OC,
                       bool accumulate_param_grads) override;
  // In f32 whatever `operands` says (backend.h).
  void attention_forward(void* out, float* att, const void* qkv, int B, int T, int C, int NH,
                         DType operands) override;
  void attention_backward(float* dqkv, const float* dout, const void* qkv, const void* out, const float* att, int B,
                          int T, int C, int NH, DType operands) override;
  void gqa_attention_forward(void* out, float* att, const void* qkv, int B, int T, int NH, int NKV, int hs,
                             DType operands) override;
  void gqa_attention_backward(float* dqkv, const float* dout, const void* qkv, const void* out, const float* att,
                              int B, int T, int NH, int NKV, int hs, DType operands) override;
  void rmsnorm_forward(void* out, DType out_dtype, float* rstd, const float* inp, const void* weight,
                       DType param_dtype, int N, int C, float eps) override;
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight,
                        DType param_dtype, const float* rstd, int N, int C, void* dinp_rounded,
                        DType rounded_dtype) override;
  void rope_forward(void* x, DType x_dtype, const float* inv_freq, int B, int T, int stride, int heads,
                    int hs) override;
  void rope_backward(float* dx, const float* inv_freq, int B, int T, int stride, int heads, int hs, void* dx_rounded,
                     DType rounded_dtype) override;
  void swiglu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, int N, int F) override;
  void swiglu_backward(void* dinp, DType dinp_dtype, const float* dout, const void* inp, DType inp_dtype, int N,
                       int F) override;
  void gelu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, size_t n) override;
  void gelu_backward(float* dinp, const void* inp, DType inp_dtype, const float* dout, size_t n) override;
  void residual_forward(float* out, const float* a, const float* b, size_t n) override;
  void crossentropy_forward(float* losses, float* lse, const void* logits, DType logits_dtype, const int32_t* targets,
                            int N, int V, int Vp) override;
  void crossentropy_backward(void* dlogits, DType dlogits_dtype, const void* logits, DType logits_dtype,
                             const float* lse, const int32_t* targets, float dloss, int N, int V, int Vp) override;

  void relu_forward(float* out, const float* inp, size_t n) override;
  void relu_backward(float* dinp, const float* dout, const float* out, size_t n) override;
  void dropout_forward(float* out, const float* inp, int N, size_t per_sample, float p, const DropoutKey& key) override;
  void dropout_backward(float* dinp, const float* dout, int N, size_t per_sample, float p,
                        const DropoutKey& key) override;
  float softmax_cross_entropy_forward(float* probs, float* losses, const float* logits, const int32_t* labels, int N,
                                      int K, int64_t* correct) override;
  void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K,
                                      float scale) override;
  int activation_channel_block() override;
  size_t activation_numel(int C, int H, int W, ActLayout layout) override;
  void activation_to_plain(float* out, const float* blocked, int N, int C, int H, int W) override;
  void activation_to_blocked(float* out, const float* plain, int N, int C, int H, int W) override;
  void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                      const Conv2dShape& s) override;
  void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const Conv2dShape& s, bool accumulate_param_grads) override;
  size_t maxpool2d_workspace_bytes(const Pool2dShape& s) override;
  void maxpool2d_forward(float* out, void* workspace, const float* inp, const Pool2dShape& s) override;
  void maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s) override;

 public:
  CpuBackend() = default;

 protected:
  // For a derived backend whose device memory the kernels reach through a translation (sim): every
  // device operand then passes through operand(). The cpu backend never sets it, so its operands
  // cost one predictable branch and no virtual call (Note [Operand ranges]).
  struct TranslatesOperands {};
  explicit CpuBackend(TranslatesOperands) : translates_operands_(true) {}

  // Where the kernels reach the `bytes` of device memory at p (the identity here). Never called with
  // null. An override checks the whole range [p, p + bytes) and aborts when it is not device memory.
  virtual void* operand(const void* p, size_t bytes) const { return const_cast<void*>(p); }

  // Note [Operand ranges]: each operation names the extent of every device operand it reads or
  // writes, from its shape arguments (the extents the kernels' headers state), so that a backend
  // that translates operands checks the whole range an operation touches, not its first byte: a
  // range that runs off its device allocation (a wrong shape, a short buffer) aborts on sim instead
  // of reading a neighbour. dev(p, n) is n elements of T, dev_param(p, n, dtype) n parameters in
  // their storage dtype, dev_bytes(p, bytes) raw bytes. Null stays null.
  template <typename T> T* dev(T* p, size_t n) const {
    if (!translates_operands_ || p == nullptr) return p;
    return static_cast<T*>(operand(p, n * sizeof(T)));
  }
  template <typename T> T* dev_bytes(T* p, size_t bytes) const {
    if (!translates_operands_ || p == nullptr) return p;
    return static_cast<T*>(operand(p, bytes));
  }
  template <typename T> T* dev_param(T* p, size_t n, DType dtype) const { return dev_bytes(p, n * dtype_size(dtype)); }

 private:
  const bool translates_operands_ = false;
};

}  // namespace zerone::kernels::cpu
