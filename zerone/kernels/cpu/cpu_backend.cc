#include "zerone/kernels/cpu/cpu_backend.h"

#include "zerone/kernels/cpu/quantize.h"

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

namespace {
// Extents of operands (Note [Operand ranges]), in elements.
size_t sz(int n) { return static_cast<size_t>(n); }
size_t conv_in_numel(const Conv2dShape& s) { return sz(s.N) * activation_numel(s.C, s.H, s.W, s.src_layout); }
size_t conv_out_numel(const Conv2dShape& s) { return sz(s.N) * activation_numel(s.OC, s.OH(), s.OW(), s.dst_layout); }
size_t conv_weight_numel(const Conv2dShape& s) { return sz(s.OC) * s.C * s.KH * s.KW; }
size_t pool_in_numel(const Pool2dShape& s) { return sz(s.N) * activation_numel(s.C, s.H, s.W, s.layout); }
size_t pool_out_numel(const Pool2dShape& s) { return sz(s.N) * activation_numel(s.C, s.OH(), s.OW(), s.layout); }
}  // namespace

std::string CpuBackend::description() const { return str_cat("cpu (oneDNN ", onednn_version_string(), ")"); }

void CpuBackend::copy(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) {
  ZERONE_ASSERT(dst_place != MemPlace::nvme && src_place != MemPlace::nvme, "copy: NVMe is not memory");
  if (bytes == 0 || dst == src) return;
  void* d = dst_place == MemPlace::device ? operand(dst, bytes) : dst;
  const void* s = src_place == MemPlace::device ? operand(src, bytes) : src;
  std::memcpy(d, s, bytes);
}

void CpuBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes > 0) std::memset(operand(dst, bytes), 0, bytes);
}

void CpuBackend::convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  if (n == 0) return;
  dst = dev_param(dst, n, dst_dtype);
  src = dev_param(src, n, src_dtype);
  if (src_dtype == DType::f32) {
    convert_from_f32(static_cast<const float*>(src), dst, dst_dtype, n);
  } else {
    ZERONE_ASSERT(dst_dtype == DType::f32, "convert: one side must be f32");
    convert_to_f32(src, src_dtype, static_cast<float*>(dst), n);
  }
}

void CpuBackend::quantize_blockwise(const void* src, DType src_dtype, size_t n, int bits, size_t block, void* out) {
  if (n == 0) return;
  cpu::quantize_blockwise(dev_param(src, n, src_dtype), src_dtype, n, bits, block,
                          dev_bytes(out, cpu::quantized_bytes(n, bits, block)));
}

void CpuBackend::dequantize_blockwise(const void* in, size_t n, int bits, size_t block, void* dst, DType dst_dtype,
                                      bool accumulate) {
  if (n == 0) return;
  cpu::dequantize_blockwise(dev_bytes(in, cpu::quantized_bytes(n, bits, block)), n, bits, block,
                            dev_param(dst, n, dst_dtype), dst_dtype, accumulate);
}

void CpuBackend::accumulate(float* dst, const float* src, size_t n) {
  cpu::accumulate(dev(dst, n), dev(src, n), n);
}

PendingSum CpuBackend::sum_squares(const float* x, size_t n, float* copy_to) {
  return cpu::sum_squares(dev(x, n), n, dev(copy_to, n));
}

double CpuBackend::sum(const float* x, size_t n) {
  return cpu::sum(dev(x, n), n);
}

bool CpuBackend::all_finite(const float* x, size_t n) {
  return cpu::all_finite(dev(x, n), n);
}

PendingSum CpuBackend::adamw_update(float* master, float* m, float* v, const float* grad, void* param, DType param_dtype, size_t n, const AdamWHyper& hyper) {
  return cpu::adamw_update(dev(master, n), dev(m, n), dev(v, n), dev(grad, n), dev_param(param, n, param_dtype), param_dtype, n,
                           hyper);
}

PendingSum CpuBackend::sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n, const SGDHyper& hyper) {
  return cpu::sgd_update(dev(master, n), dev(momentum, n), dev(grad, n), dev_param(param, n, param_dtype), param_dtype, n,
                         hyper);
}

void CpuBackend::embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype, int B, int T, int C, int V) {
  const size_t BT = sz(B) * T;
  cpu::embedding_forward(dev(out, BT * C), dev(tokens, BT), dev_param(wte, sz(V) * C, param_dtype),
                         dev_param(wpe, sz(T) * C, param_dtype), param_dtype, B, T, C);
}

void CpuBackend::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C, int V) {
  const size_t BT = sz(B) * T;
  cpu::embedding_backward(dev(dwte, sz(V) * C), dev(dwpe, sz(T) * C), dev(dout, BT * C), dev(tokens, BT), B, T, C);
}

void CpuBackend::layernorm_forward(void* out, DType out_dtype, float* mean, float* rstd, const float* inp, const void* weight, const void* bias, DType param_dtype, int N, int C) {
  const size_t NC = sz(N) * C;
  cpu::layernorm_forward(dev_param(out, NC, out_dtype), out_dtype, dev(mean, N), dev(rstd, N), dev(inp, NC), dev_param(weight, C, param_dtype),
                         dev_param(bias, C, param_dtype), param_dtype, N, C);
}

void CpuBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const void* weight, DType param_dtype, const float* mean, const float* rstd, int N, int C) {
  const size_t NC = sz(N) * C;
  cpu::layernorm_backward(dev(dinp, NC), dev(dweight, C), dev(dbias, C), dev(dout, NC), dev(inp, NC),
                          dev_param(weight, C, param_dtype), param_dtype, dev(mean, N), dev(rstd, N), N, C);
}

void CpuBackend::linear_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, const void* weight, const void* bias, DType param_dtype, int N, int C, int OC) {
  cpu::linear_forward(dev_param(out, sz(N) * OC, out_dtype), out_dtype, dev_param(inp, sz(N) * C, inp_dtype), inp_dtype, dev_param(weight, sz(OC) * C, param_dtype),
                      dev_param(bias, OC, param_dtype), param_dtype, N, C, OC);
}

void CpuBackend::linear_backward(float* dinp, float* dweight, float* dbias, const void* dout, DType dout_dtype, const void* inp, DType inp_dtype, const void* weight, DType param_dtype, int N, int C, int OC, bool accumulate_param_grads) {
  cpu::linear_backward(dev(dinp, sz(N) * C), dev(dweight, sz(OC) * C), dev(dbias, OC),
                       dev_param(dout, sz(N) * OC, dout_dtype), dout_dtype, dev_param(inp, sz(N) * C, inp_dtype),
                       inp_dtype, dev_param(weight, sz(OC) * C, param_dtype), param_dtype, N, C, OC,
                       accumulate_param_grads);
}

// Note [Attention's inputs and output in the compute dtype]: qkv and out in `operands`.
void CpuBackend::attention_forward(void* out, float* att, const void* qkv, int B, int T, int C, int NH,
                                   DType operands) {
  gqa_attention_forward(out, att, qkv, B, T, NH, NH, C / NH, operands);
}

void CpuBackend::attention_backward(float* dqkv, const float* dout, const void* qkv, const void* out,
                                    const float* att, int B, int T, int C, int NH, DType operands) {
  gqa_attention_backward(dqkv, dout, qkv, out, att, B, T, NH, NH, C / NH, operands);
}

void CpuBackend::gqa_attention_forward(void* out, float* att, const void* qkv, int B, int T, int NH, int NKV, int hs,
                                       DType operands) {
  const size_t BT = sz(B) * T, att_n = sz(B) * NH * T * T, qkv_n = BT * (NH + 2 * NKV) * hs;
  cpu::gqa_attention_forward_stored(dev_param(out, BT * NH * hs, operands), dev(att, att_n),
                                    dev_param(qkv, qkv_n, operands), operands, B, T, NH, NKV, hs);
}

void CpuBackend::gqa_attention_backward(float* dqkv, const float* dout, const void* qkv, const void*,
                                        const float* att, int B, int T, int NH, int NKV, int hs, DType operands) {
  const size_t BT = sz(B) * T, att_n = sz(B) * NH * T * T, qkv_n = BT * (NH + 2 * NKV) * hs;
  cpu::gqa_attention_backward_stored(dev(dqkv, qkv_n), dev(dout, BT * NH * hs), dev_param(qkv, qkv_n, operands),
                                     operands, dev(att, att_n), B, T, NH, NKV, hs);
}

void CpuBackend::rmsnorm_forward(void* out, DType out_dtype, float* rstd, const float* inp, const void* weight, DType param_dtype, int N, int C, float eps) {
  const size_t NC = sz(N) * C;
  cpu::rmsnorm_forward(dev_param(out, NC, out_dtype), out_dtype, dev(rstd, N), dev(inp, NC), dev_param(weight, C, param_dtype), param_dtype, N, C,
                       eps);
}

void CpuBackend::rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight,
                                  DType param_dtype, const float* rstd, int N, int C, void* dinp_rounded,
                                  DType rounded_dtype) {
  const size_t NC = sz(N) * C;
  cpu::rmsnorm_backward(dev(dinp, NC), dev(dweight, C), dev(dout, NC), dev(inp, NC), dev_param(weight, C, param_dtype),
                        param_dtype, dev(rstd, N), N, C, dinp_rounded ? dev_param(dinp_rounded, NC, rounded_dtype) : nullptr,
                        rounded_dtype);
}

void CpuBackend::rope_forward(void* x, DType x_dtype, const float* inv_freq, int B, int T, int stride, int heads,
                              int hs) {
  cpu::rope_forward(dev_param(x, sz(B) * T * stride, x_dtype), x_dtype, dev(inv_freq, sz(hs) / 2), B, T, stride, heads,
                    hs);
}

void CpuBackend::rope_backward(float* dx, const float* inv_freq, int B, int T, int stride, int heads, int hs,
                               void* dx_rounded, DType rounded_dtype) {
  const size_t n = sz(B) * T * stride;
  cpu::rope_backward(dev(dx, n), dev(inv_freq, sz(hs) / 2), B, T, stride, heads, hs,
                     dx_rounded ? dev_param(dx_rounded, n, rounded_dtype) : nullptr, rounded_dtype);
}

void CpuBackend::swiglu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, int N, int F) {
  cpu::swiglu_forward(dev_param(out, sz(N) * F, out_dtype), out_dtype, dev_param(inp, sz(N) * 2 * F, inp_dtype),
                      inp_dtype, N, F);
}

void CpuBackend::swiglu_backward(void* dinp, DType dinp_dtype, const float* dout, const void* inp, DType inp_dtype,
                                 int N, int F) {
  cpu::swiglu_backward(dev_param(dinp, sz(N) * 2 * F, dinp_dtype), dinp_dtype, dev(dout, sz(N) * F),
                       dev_param(inp, sz(N) * 2 * F, inp_dtype), inp_dtype, N, F);
}

void CpuBackend::gelu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, size_t n) {
  cpu::gelu_forward(dev_param(out, n, out_dtype), out_dtype, dev_param(inp, n, inp_dtype), inp_dtype, n);
}

void CpuBackend::gelu_backward(float* dinp, const void* inp, DType inp_dtype, const float* dout, size_t n) {
  cpu::gelu_backward(dev(dinp, n), dev_param(inp, n, inp_dtype), inp_dtype, dev(dout, n), n);
}

void CpuBackend::residual_forward(float* out, const float* a, const float* b, size_t n) {
  cpu::residual_forward(dev(out, n), dev(a, n), dev(b, n), n);
}

void CpuBackend::crossentropy_forward(float* losses, float* lse, const void* logits, DType logits_dtype, const int32_t* targets, int N, int V, int Vp) {
  cpu::crossentropy_forward(dev(losses, N), dev(lse, N), dev_param(logits, sz(N) * Vp, logits_dtype), logits_dtype, dev(targets, N), N, V, Vp);
}

void CpuBackend::crossentropy_backward(void* dlogits, DType dlogits_dtype, const void* logits, DType logits_dtype, const float* lse, const int32_t* targets, float dloss, int N, int V, int Vp) {
  cpu::crossentropy_backward(dev_param(dlogits, sz(N) * Vp, dlogits_dtype), dlogits_dtype, dev_param(logits, sz(N) * Vp, logits_dtype), logits_dtype,
                             dev(lse, N), dev(targets, N), dloss, N, V, Vp);
}

void CpuBackend::relu_forward(float* out, const float* inp, size_t n) {
  cpu::relu_forward(dev(out, n), dev(inp, n), n);
}

void CpuBackend::relu_backward(float* dinp, const float* dout, const float* out, size_t n) {
  cpu::relu_backward(dev(dinp, n), dev(dout, n), dev(out, n), n);
}

void CpuBackend::dropout_forward(float* out, const float* inp, int N, size_t per_sample, float p, const DropoutKey& key) {
  cpu::dropout_forward(dev(out, sz(N) * per_sample), dev(inp, sz(N) * per_sample), N, per_sample, p, key);
}

void CpuBackend::dropout_backward(float* dinp, const float* dout, int N, size_t per_sample, float p, const DropoutKey& key) {
  cpu::dropout_backward(dev(dinp, sz(N) * per_sample), dev(dout, sz(N) * per_sample), N, per_sample, p, key);
}

float CpuBackend::softmax_cross_entropy_forward(float* probs, float* losses, const float* logits, const int32_t* labels, int N, int K, int64_t* correct) {
  return cpu::softmax_cross_entropy_forward(dev(probs, sz(N) * K), dev(losses, N), dev(logits, sz(N) * K), dev(labels, N),
                                            N, K, correct);
}

void CpuBackend::softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K, float scale) {
  cpu::softmax_cross_entropy_backward(dev(dlogits, sz(N) * K), dev(probs, sz(N) * K), dev(labels, N), N, K, scale);
}

int CpuBackend::activation_channel_block() {
  return cpu::activation_channel_block();
}

size_t CpuBackend::activation_numel(int C, int H, int W, ActLayout layout) {
  return cpu::activation_numel(C, H, W, layout);
}

void CpuBackend::activation_to_plain(float* out, const float* blocked, int N, int C, int H, int W) {
  cpu::activation_to_plain(dev(out, sz(N) * C * H * W),
                           dev(blocked, sz(N) * cpu::activation_numel(C, H, W, ActLayout::blocked)), N, C, H, W);
}

void CpuBackend::activation_to_blocked(float* out, const float* plain, int N, int C, int H, int W) {
  cpu::activation_to_blocked(dev(out, sz(N) * cpu::activation_numel(C, H, W, ActLayout::blocked)),
                             dev(plain, sz(N) * C * H * W), N, C, H, W);
}

void CpuBackend::conv2d_forward(float* out, const float* inp, const float* weight, const float* bias, const Conv2dShape& s) {
  cpu::conv2d_forward(dev(out, conv_out_numel(s)), dev(inp, conv_in_numel(s)), dev(weight, conv_weight_numel(s)), dev(bias, s.OC), s);
}

void CpuBackend::conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, const Conv2dShape& s, bool accumulate_param_grads) {
  cpu::conv2d_backward(dev(dinp, conv_in_numel(s)), dev(dweight, conv_weight_numel(s)), dev(dbias, s.OC),
                       dev(dout, conv_out_numel(s)), dev(inp, conv_in_numel(s)), dev(weight, conv_weight_numel(s)), s,
                       accumulate_param_grads);
}

size_t CpuBackend::maxpool2d_workspace_bytes(const Pool2dShape& s) {
  return cpu::maxpool2d_workspace_bytes(s);
}

void CpuBackend::maxpool2d_forward(float* out, void* workspace, const float* inp, const Pool2dShape& s) {
  cpu::maxpool2d_forward(dev(out, pool_out_numel(s)), dev_bytes(workspace, cpu::maxpool2d_workspace_bytes(s)),
                         dev(inp, pool_in_numel(s)), s);
}

void CpuBackend::maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s) {
  cpu::maxpool2d_backward(dev(dinp, pool_in_numel(s)), dev(dout, pool_out_numel(s)),
                          dev_bytes(workspace, cpu::maxpool2d_workspace_bytes(s)), s);
}

}  // namespace zerone::kernels::cpu
