#include "zerone/kernels/cpu/cpu_backend.h"

#include <cstring>

#include "zerone/core/error.h"
#include "zerone/kernels/cpu/adamw.h"
#include "zerone/kernels/cpu/classifier.h"
#include "zerone/kernels/cpu/conv.h"
#include "zerone/kernels/cpu/matmul.h"
#include "zerone/kernels/cpu/ops.h"
#include "zerone/kernels/cpu/reduce.h"
#include "zerone/kernels/cpu/sgd.h"

namespace zerone::kernels::cpu {

std::string CpuBackend::description() const { return str_cat("cpu (oneDNN ", onednn_version_string(), ")"); }

void CpuBackend::copy(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) {
  ZERONE_ASSERT(dst_place != MemPlace::nvme && src_place != MemPlace::nvme, "copy: NVMe is not memory");
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

void CpuBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes > 0) std::memset(dst, 0, bytes);
}

void CpuBackend::convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  if (src_dtype == DType::f32) {
    convert_from_f32(static_cast<const float*>(src), dst, dst_dtype, n);
  } else {
    ZERONE_ASSERT(dst_dtype == DType::f32, "convert: one side must be f32");
    convert_to_f32(src, src_dtype, static_cast<float*>(dst), n);
  }
}

void CpuBackend::accumulate(float* dst, const float* src, size_t n) {
  cpu::accumulate(dst, src, n);
}

double CpuBackend::sum_squares(const float* x, size_t n, float* copy_to) {
  return cpu::sum_squares(x, n, copy_to);
}

double CpuBackend::sum(const float* x, size_t n) {
  return cpu::sum(x, n);
}

bool CpuBackend::all_finite(const float* x, size_t n) {
  return cpu::all_finite(x, n);
}

double CpuBackend::adamw_update(float* master, float* m, float* v, const float* grad, void* param, DType param_dtype, size_t n, const AdamWHyper& hyper) {
  return cpu::adamw_update(master, m, v, grad, param, param_dtype, n, hyper);
}

double CpuBackend::sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n, const SGDHyper& hyper) {
  return cpu::sgd_update(master, momentum, grad, param, param_dtype, n, hyper);
}

void CpuBackend::embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype, int B, int T, int C) {
  cpu::embedding_forward(out, tokens, wte, wpe, param_dtype, B, T, C);
}

void CpuBackend::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
}

void CpuBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const void* weight, const void* bias, DType param_dtype, int N, int C) {
  cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, param_dtype, N, C);
}

void CpuBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const void* weight, DType param_dtype, const float* mean, const float* rstd, int N, int C) {
  cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, param_dtype, mean, rstd, N, C);
}

void CpuBackend::linear_forward(float* out, const float* inp, const void* weight, const void* bias, DType param_dtype, int N, int C, int OC) {
  cpu::linear_forward(out, inp, weight, bias, param_dtype, N, C, OC);
}

void CpuBackend::linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const void* weight, DType param_dtype, int N, int C, int OC, bool accumulate_param_grads) {
  cpu::linear_backward(dinp, dweight, dbias, dout, inp, weight, param_dtype, N, C, OC, accumulate_param_grads);
}

void CpuBackend::attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  cpu::attention_forward(out, att, qkv, B, T, C, NH);
}

void CpuBackend::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH) {
  cpu::attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
}

void CpuBackend::gqa_attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int NKV, int hs) {
  cpu::gqa_attention_forward(out, att, qkv, B, T, NH, NKV, hs);
}

void CpuBackend::gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int NH, int NKV, int hs) {
  cpu::gqa_attention_backward(dqkv, dout, qkv, att, B, T, NH, NKV, hs);
}

void CpuBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, const void* weight, DType param_dtype, int N, int C, float eps) {
  cpu::rmsnorm_forward(out, rstd, inp, weight, param_dtype, N, C, eps);
}

void CpuBackend::rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight, DType param_dtype, const float* rstd, int N, int C) {
  cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, param_dtype, rstd, N, C);
}

void CpuBackend::rope_forward(float* x, const float* inv_freq, int B, int T, int stride, int heads, int hs) {
  cpu::rope_forward(x, inv_freq, B, T, stride, heads, hs);
}

void CpuBackend::rope_backward(float* dx, const float* inv_freq, int B, int T, int stride, int heads, int hs) {
  cpu::rope_backward(dx, inv_freq, B, T, stride, heads, hs);
}

void CpuBackend::swiglu_forward(float* out, const float* inp, int N, int F) {
  cpu::swiglu_forward(out, inp, N, F);
}

void CpuBackend::swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int F) {
  cpu::swiglu_backward(dinp, dout, inp, N, F);
}

void CpuBackend::gelu_forward(float* out, const float* inp, size_t n) {
  cpu::gelu_forward(out, inp, n);
}

void CpuBackend::gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  cpu::gelu_backward(dinp, inp, dout, n);
}

void CpuBackend::residual_forward(float* out, const float* a, const float* b, size_t n) {
  cpu::residual_forward(out, a, b, n);
}

void CpuBackend::crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int N, int V, int Vp) {
  cpu::crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
}

void CpuBackend::crossentropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets, float dloss, int N, int V, int Vp) {
  cpu::crossentropy_backward(dlogits, logits, lse, targets, dloss, N, V, Vp);
}

void CpuBackend::relu_forward(float* out, const float* inp, size_t n) {
  cpu::relu_forward(out, inp, n);
}

void CpuBackend::relu_backward(float* dinp, const float* dout, const float* out, size_t n) {
  cpu::relu_backward(dinp, dout, out, n);
}

void CpuBackend::dropout_forward(float* out, const float* inp, int N, size_t per_sample, float p, const DropoutKey& key) {
  cpu::dropout_forward(out, inp, N, per_sample, p, key);
}

void CpuBackend::dropout_backward(float* dinp, const float* dout, int N, size_t per_sample, float p, const DropoutKey& key) {
  cpu::dropout_backward(dinp, dout, N, per_sample, p, key);
}

float CpuBackend::softmax_cross_entropy_forward(float* probs, float* losses, const float* logits, const int32_t* labels, int N, int K, int64_t* correct) {
  return cpu::softmax_cross_entropy_forward(probs, losses, logits, labels, N, K, correct);
}

void CpuBackend::softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K, float scale) {
  cpu::softmax_cross_entropy_backward(dlogits, probs, labels, N, K, scale);
}

int CpuBackend::activation_channel_block() {
  return cpu::activation_channel_block();
}

size_t CpuBackend::activation_numel(int C, int H, int W, ActLayout layout) {
  return cpu::activation_numel(C, H, W, layout);
}

void CpuBackend::activation_to_plain(float* out, const float* blocked, int N, int C, int H, int W) {
  cpu::activation_to_plain(out, blocked, N, C, H, W);
}

void CpuBackend::activation_to_blocked(float* out, const float* plain, int N, int C, int H, int W) {
  cpu::activation_to_blocked(out, plain, N, C, H, W);
}

void CpuBackend::conv2d_forward(float* out, const float* inp, const float* weight, const float* bias, const Conv2dShape& s) {
  cpu::conv2d_forward(out, inp, weight, bias, s);
}

void CpuBackend::conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, const Conv2dShape& s, bool accumulate_param_grads) {
  cpu::conv2d_backward(dinp, dweight, dbias, dout, inp, weight, s, accumulate_param_grads);
}

size_t CpuBackend::maxpool2d_workspace_bytes(const Pool2dShape& s) {
  return cpu::maxpool2d_workspace_bytes(s);
}

void CpuBackend::maxpool2d_forward(float* out, void* workspace, const float* inp, const Pool2dShape& s) {
  cpu::maxpool2d_forward(out, workspace, inp, s);
}

void CpuBackend::maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s) {
  cpu::maxpool2d_backward(dinp, dout, workspace, s);
}

}  // namespace zerone::kernels::cpu
