// CPU kernels for the GPT family, each with its forward and backward (the executable spec, after
// llm.c). Shapes are written inline: B batch, T time, C channels, NH heads, V vocabulary, Vp padded
// vocabulary, N = B*T rows.
//
// Conventions:
//  - Activations and gradients are f32. Parameters are read in their storage dtype (`param_dtype`:
//    f32, bf16 or f16) and widened to f32 inside the kernel; matmuls run in bf16 for bf16 (inputs
//    rounded from the f32 activations, f32 accumulation, like PyTorch autocast), in f32 for f32,
//    and in f32 on f16-rounded operands for f16 (Note [fp16 on the CPU] in ops.cc).
//  - Outputs that only matmuls read may be stored rounded (`out_dtype`), and linear's activation
//    operands may come rounded (`inp_dtype`, `dout_dtype` == param_dtype): Note [GEMM operands in
//    the compute dtype] in kernels/backend.h. Such an op computes in f32 and rounds as it stores.
//  - Parameter gradients always accumulate (+=), so gradient accumulation over micro-steps is free.
//  - Input gradients overwrite (=) except where a kernel says it accumulates (layernorm_backward,
//    which adds into the residual stream's gradient).
//  - Kernels are OpenMP-parallel and allocate nothing on the hot path except a per-thread scratch
//    arena that grows to the largest request and is recorded in the memory ledger.
// Thread-safety: call from one thread at a time (each call uses the whole OpenMP team).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zerone/core/dtype.h"
#include "zerone/kernels/types.h"

namespace zerone::kernels::cpu {

// out (B,T,C) = wte[tokens] (Vp,C) + wpe[t] (maxT,C); wpe may be null (no position table, as in
// LLaMA). Token ids must already be validated < V.
void embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype,
                       int B, int T, int C);
// dwte (Vp,C) += scatter of dout; dwpe (maxT,C) += sum over batch of dout (skipped when null).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);

// out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved for backward. eps = 1e-5.
void layernorm_forward(void* out, DType out_dtype, float* mean, float* rstd, const float* inp, const void* weight,
                       const void* bias, DType param_dtype, int N, int C);
// dinp (N,C) += ..., dweight (C) += ..., dbias (C) += ...
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const void* weight, DType param_dtype, const float* mean, const float* rstd, int N,
                        int C);

// out (N,OC) = inp (N,C) @ weight^T (OC,C) + bias (OC); bias may be null. inp in f32 or param_dtype;
// out in f32 or param_dtype (rounded to nearest even as stored: Note [Logits in the compute dtype]).
void linear_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, const void* weight, const void* bias,
                    DType param_dtype, int N, int C, int OC);
// dinp (N,C) = dout @ weight (overwrite; skipped when dinp is null); dweight (OC,C) += dout^T @ inp;
// dbias (OC) += column sums of dout (skipped when null; needs dout in f32). With
// accumulate_param_grads false, dweight and dbias are overwritten (= instead of +=; Note [Fresh
// gradients] in nn/flat_param.h). dout and inp in f32 or param_dtype.
void linear_backward(float* dinp, float* dweight, float* dbias, const void* dout, DType dout_dtype, const void* inp,
                     DType inp_dtype, const void* weight, DType param_dtype, int N, int C, int OC,
                     bool accumulate_param_grads = true);

// Grouped-query causal attention: NH query heads share NKV key/value heads (NH % NKV == 0; query
// head h reads kv head h / (NH/NKV)), head size hs. qkv (B,T,(NH+2*NKV)*hs) holds per token the
// NH query heads, then the NKV key heads, then the NKV value heads; out (B,T,NH*hs); att
// (B,NH,T,T) saves the softmax probabilities (row t uses columns 0..t) for backward. GPT-2's
// multi-head attention is the case NKV == NH, hs = C/NH (qkv (B,T,3C), out (B,T,C)).
void gqa_attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int NKV, int hs);
// dqkv (B,T,(NH+2*NKV)*hs) = gradient wrt qkv (overwrite).
void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int NH,
                            int NKV, int hs);
// The same with qkv and out stored in `dtype` (Note [Attention's inputs and output in the compute
// dtype], kernels/backend.h): computed in f32 on qkv widened exactly, out rounded as stored.
void gqa_attention_forward_stored(void* out, float* att, const void* qkv, DType dtype, int B, int T, int NH, int NKV,
                                  int hs);
void gqa_attention_backward_stored(float* dqkv, const float* dout, const void* qkv, DType dtype, const float* att,
                                   int B, int T, int NH, int NKV, int hs);

// RMSNorm (LLaMA): out (N,C) = inp * rstd * weight with rstd (N) = 1/sqrt(mean(inp^2) + eps),
// saved for backward. No bias, no mean subtraction.
void rmsnorm_forward(void* out, DType out_dtype, float* rstd, const float* inp, const void* weight,
                     DType param_dtype, int N, int C, float eps);
// dinp (N,C) += ... (accumulates, like layernorm_backward), dweight (C) += ...; with dinp_rounded
// (N,C of rounded_dtype, or null) the new dinp also stored there rounded (Note [Gradients rounded
// where they are made], kernels/backend.h).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight,
                      DType param_dtype, const float* rstd, int N, int C, void* dinp_rounded, DType rounded_dtype);

// Rotary position embedding in Hugging Face's rotate-half convention. For each position t and
// each of the first `heads` head vectors x (hs values) of a row of `stride` floats:
//   x'[i]        = x[i] cos(t f_i) - x[i+hs/2] sin(t f_i)
//   x'[i + hs/2] = x[i+hs/2] cos(t f_i) + x[i] sin(t f_i),      i < hs/2,
// with f_i = inv_freq[i] (rope_inv_freq). In place on x (B,T,stride): applied to the q and k heads
// of a qkv buffer with heads = NH + NKV. Backward is the rotation by -t f_i (rope_backward).
// Forward's x is in x_dtype (rotated in f32, stored rounded); backward's dx is f32, rotated in
// place, or with dx_rounded only read and every row (all `stride` elements) stored there rounded
// to rounded_dtype (Note [Gradients rounded where they are made], kernels/backend.h).
void rope_forward(void* x, DType x_dtype, const float* inv_freq, int B, int T, int stride, int heads, int hs);
void rope_backward(float* dx, const float* inv_freq, int B, int T, int stride, int heads, int hs, void* dx_rounded,
                   DType rounded_dtype);

// SwiGLU (LLaMA MLP): inp (N,2F) holds per row the gate projection (F) then the up projection (F);
// out (N,F) = silu(gate) * up, silu(g) = g * sigmoid(g). inp in inp_dtype, widened exactly (Note
// [The MLP's hidden activation in the compute dtype], kernels/backend.h).
void swiglu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, int N, int F);
// dinp (N,2F) = gradient wrt inp (overwrite).
void swiglu_backward(void* dinp, DType dinp_dtype, const float* dout, const void* inp, DType inp_dtype, int N, int F);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x in inp_dtype.
void gelu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, size_t n);
// dinp = dout * gelu'(inp) (overwrite; dinp may alias dout).
void gelu_backward(float* dinp, const void* inp, DType inp_dtype, const float* dout, size_t n);

// out = a + b (n elements). Backward is the identity into both inputs, done by the caller.
void residual_forward(float* out, const float* a, const float* b, size_t n);

// Softmax cross-entropy over the first V of Vp columns (the padded columns are ignored).
// losses (N) = logsumexp(logits[:V]) - logits[target]; lse (N) saves logsumexp for backward.
// logits in logits_dtype (f32, bf16 or f16), widened exactly; everything computed in f32.
void crossentropy_forward(float* losses, float* lse, const void* logits, DType logits_dtype, const int32_t* targets,
                          int N, int V, int Vp);
// dlogits (N,Vp) = (softmax - onehot(target)) * dloss, 0 in padded columns. May alias logits when
// the dtypes are the same (each row is read before it is written).
void crossentropy_backward(void* dlogits, DType dlogits_dtype, const void* logits, DType logits_dtype, const float* lse,
                           const int32_t* targets, float dloss, int N, int V, int Vp);

}  // namespace zerone::kernels::cpu
