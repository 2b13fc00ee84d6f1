// The CUDA backend's kernels (the .cu files of this folder), as host-callable launchers: each
// enqueues its work on `stream` and returns at once (nothing here synchronizes). Every pointer is
// device memory of the current device unless a parameter says `host`; shapes and semantics are the
// cpu kernels' (kernels/cpu/*.h, the executable spec), which CudaBackend (cuda_backend.h) forwards
// to. Scratch a kernel needs is passed in by the caller, sized by the *_scratch_* functions.
//
// Note [CUDA kernels, correctness first]: every kernel here started as the plain, obviously-right
// form: one thread per output element (or one block per row for row reductions), each output
// written by one thread, reductions in a fixed order (no atomics), so a run on one GPU gives the
// same bits every time. The faster forms that replaced some keep those rules: flash attention
// (attention.cu, and attention_tensor_cores.cu for 16-bit runs; the plain form stays selectable),
// Note [Column sums] and Note [Embedding backward without atomics] (transformer.cu), the
// four-at-a-time convert (engine.cu), linear's bias in cuBLASLt's epilogue (cuda_backend.cc).
// Run on an H200 (2026-11-27): every op against the op harness, compute-sanitizer clean (docs/GPU.md).
// Thread-safety: launchers may be called from any thread; ordering is the stream's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "zerone/core/dtype.h"
#include "zerone/kernels/cuda/sizes.h"
#include "zerone/kernels/types.h"

namespace zerone::cuda {

// ---------------------------------------------------------------- the engine's own needs
// dst (n) += src (n).
void accumulate(float* dst, const float* src, size_t n, cudaStream_t stream);
// Note [Deterministic gradient norm] (kernels/backend.h) on the GPU: device_partials (device
// scratch of norm_blocks(n) doubles, sizes.h) receive the double sum of squares of each kNormBlock
// chunk of x in chunk order (a fixed tree inside each chunk), for the host to add in that order;
// `copy_to` (may be null) receives x. Asynchronous (the backend copies the partials to the host).
void sum_squares_partials(const float* x, size_t n, float* copy_to, double* device_partials, cudaStream_t stream);
// The same with plain sums (Backend::sum).
void sum_partials(const float* x, size_t n, double* device_partials, cudaStream_t stream);
// dst (n, dst_dtype) = src (n, src_dtype); one side f32; rounding to nearest even.
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, cudaStream_t stream);
// *flag (device int) = 1 when some x is not finite (left alone otherwise).
void mark_not_finite(const float* x, size_t n, int* flag, cudaStream_t stream);
// Note [Blockwise quantization] (kernels/cpu/quantize.h).
void quantize_blockwise(const void* src, DType src_dtype, size_t n, int bits, size_t block, void* out,
                        cudaStream_t stream);
void dequantize_blockwise(const void* in, size_t n, int bits, size_t block, void* dst, DType dst_dtype,
                          bool accumulate, cudaStream_t stream);

// ---------------------------------------------------------------- optimizers
// The updates of kernels/cpu/adamw.h and sgd.h. Each also leaves the gradients' norm partials in
// device_partials (norm_blocks(n) doubles): the values sum_squares_partials(grad, n, ...) gives
// (Note [Updates that measure the norm]). `param` (param_dtype) and `momentum` may be null.
// adamw_update_ranges: `count` ranges in order, their partials side by side (range r's after the
// norm_blocks of those before it), in launches of several ranges each (Note [AdamW ranges in one
// launch]): the values of one adamw_update per range.
void adamw_update_ranges(const kernels::AdamWRange* ranges, size_t count, DType param_dtype, double* device_partials,
                         cudaStream_t stream);
void sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n,
                const kernels::SGDHyper& hyper, double* device_partials, cudaStream_t stream);
// host_partials (count) = device_partials (count), once the stream's work before is done: the
// host waits for the stream.
void partials_to_host(const double* device_partials, double* host_partials, size_t count, cudaStream_t stream);

// ---------------------------------------------------------------- transformers (kernels/cpu/ops.h)
void embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype, int B,
                       int T, int C, cudaStream_t stream);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        cudaStream_t stream);
// The outputs with an out_dtype are stored rounded to it (Note [GEMM operands in the compute
// dtype], kernels/backend.h): computed in f32, rounded as core/dtype.h rounds.
void layernorm_forward(void* out, DType out_dtype, float* mean, float* rstd, const float* inp, const void* weight,
                       const void* bias, DType param_dtype, int N, int C, cudaStream_t stream);
// The norms' parameter gradients and the bias's are column sums (Note [Column sums], Note [Column
// sums in two passes], transformer.cu); `partials` is device scratch of column_sum_partials_numel(N,
// C) floats for them.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const void* weight, DType param_dtype, const float* mean, const float* rstd, int N, int C,
                        float* partials, cudaStream_t stream);
void rmsnorm_forward(void* out, DType out_dtype, float* rstd, const float* inp, const void* weight, DType param_dtype,
                     int N, int C, float eps, cudaStream_t stream);
// dinp_rounded (or null): the new dinp rounded to rounded_dtype (Note [Gradients rounded where
// they are made], kernels/backend.h).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight,
                      DType param_dtype, const float* rstd, int N, int C, void* dinp_rounded, DType rounded_dtype,
                      float* partials, cudaStream_t stream);
// out (N, OC) += bias (OC, param_dtype) on every row.
void add_bias(float* out, const void* bias, DType param_dtype, int N, int OC, cudaStream_t stream);
// dbias (OC) (+)= sum over the N rows of dout (N, OC), in a fixed order. Note [Rounded on the way]:
// with `rounded` (N x OC elements of the 16-bit rounded_dtype, or null) dout is also stored there
// rounded to nearest even, as convert() would, in the same pass: the operand of the linear's
// backward GEMMs (Note [GEMM operands in the compute dtype], kernels/backend.h) without a
// conversion pass of its own reading dout again.
void bias_backward(float* dbias, const float* dout, int N, int OC, bool accumulate, void* rounded, DType rounded_dtype,
                   float* partials, cudaStream_t stream);
// Note [GELU's backward in the linear's] (kernels/backend.h): dbias (OC) (+)= the column sums of
// dout = gelu'(pre) dgelu, and `rounded` (N x OC of pre_dtype) = dout rounded, in one pass over
// dgelu (N, OC, f32) and pre (N, OC, bf16 or f16), the bits gelu_backward then bias_backward give.
// Returns false, doing nothing, where that pass cannot run (f32 pre, a shape or alignment the
// two-pass column sums do not take): the caller takes the two calls.
bool gelu_bias_backward(float* dbias, const float* dgelu, const void* pre, DType pre_dtype, int N, int OC,
                        bool accumulate, void* rounded, float* partials, cudaStream_t stream);
// Grouped-query causal attention (NH query heads, NKV key/value heads, head size hs) with the
// probabilities kept in att (B, NH, T, T), zero above the diagonal, as the cpu kernel.
void gqa_attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int NKV, int hs,
                           cudaStream_t stream);
// datt: scratch (B, NH, T, T).
void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, float* datt, int B,
                            int T, int NH, int NKV, int hs, cudaStream_t stream);
// Note [Flash attention on CUDA cores] (attention.cu): the same attention without the (B, NH, T, T)
// matrix. forward: out (B, T, NH*hs) and lse (B, NH, T), each row's logsumexp of its scaled scores,
// all that backward reads besides qkv; backward: dqkv (B, T, (NH + 2 NKV) hs) overwritten, with
// dsum scratch (B, NH, T) (D = rowsum(dO * O)). Head sizes 1..flash::kMaxHeadSize (flash_tiles.h).
// operands: f32, or bf16 / f16 where flash_attention_takes_16bit: then qkv and out are stored in
// it (Note [Attention's inputs and output in the compute dtype], kernels/backend.h) and the
// products run on tensor cores with P, dO and dS rounded to it (Note [Flash attention on tensor
// cores]); elsewhere the caller widens a 16-bit qkv and passes f32. scratch:
// flash_attention_scratch_bytes of device memory, 256-byte aligned (none for f32), which the call
// may overwrite.
bool flash_attention_takes_16bit(DType operands, int hs);
size_t flash_attention_scratch_bytes(int B, int T, int NH, int NKV, int hs, DType operands, bool backward);
void flash_attention_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int hs,
                             DType operands, void* scratch, cudaStream_t stream);
// out: what forward wrote (the tensor-core form forms D = rowsum(dO * out) from it). marks (null
// in training; bench_attention_cuda's split of the time): events the tensor-core form records on
// the stream after its D pass and after its dQ pass (dK/dV runs last); other forms record none.
struct FlashBackwardMarks {
  cudaEvent_t after_row_dot = nullptr, after_dq = nullptr;
};
void flash_attention_backward(float* dqkv, float* dsum, const float* dout, const void* qkv, const void* out,
                              const float* lse, int B, int T, int NH, int NKV, int hs, DType operands, void* scratch,
                              cudaStream_t stream, const FlashBackwardMarks* marks = nullptr);
// x in `dtype` (rotated in f32, stored rounded to it).
void rope_rotate(void* x, DType dtype, const float* inv_freq, int B, int T, int stride, int heads, int hs, float sign,
                 cudaStream_t stream);
// rope's backward rotation of f32 dx (read only) into `out`, every element of every row stored
// rounded to out_dtype (Note [Gradients rounded where they are made], kernels/backend.h).
void rope_backward_rounded(void* out, DType out_dtype, const float* dx, const float* inv_freq, int B, int T, int stride,
                           int heads, int hs, cudaStream_t stream);
// inp in inp_dtype (Note [The MLP's hidden activation in the compute dtype], kernels/backend.h).
void swiglu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, int N, int F, cudaStream_t stream);
void swiglu_backward(void* dinp, DType dinp_dtype, const float* dout, const void* inp, DType inp_dtype, int N, int F,
                     cudaStream_t stream);
void gelu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, size_t n, cudaStream_t stream);
void gelu_backward(float* dinp, const void* inp, DType inp_dtype, const float* dout, size_t n, cudaStream_t stream);
void residual_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);
void crossentropy_forward(float* losses, float* lse, const void* logits, DType logits_dtype, const int32_t* targets,
                          int N, int V, int Vp, cudaStream_t stream);
void crossentropy_backward(void* dlogits, DType dlogits_dtype, const void* logits, DType logits_dtype, const float* lse,
                           const int32_t* targets, float dloss, int N, int V, int Vp, cudaStream_t stream);

// ---------------------------------------------------------------- image classifiers
void relu_forward(float* out, const float* inp, size_t n, cudaStream_t stream);
void relu_backward(float* dinp, const float* dout, const float* out, size_t n, cudaStream_t stream);
// Note [Dropout keys] (kernels/types.h): the same mask bits as the cpu kernel (core/rng.h).
void dropout(float* out, const float* inp, int N, size_t per_sample, float p, const kernels::DropoutKey& key,
             cudaStream_t stream);
// probs (N, K), losses (N), hits (N ints: 1 where the first argmax is the label).
void softmax_cross_entropy_forward(float* probs, float* losses, int32_t* hits, const float* logits,
                                   const int32_t* labels, int N, int K, cudaStream_t stream);
void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K,
                                    float scale, cudaStream_t stream);
// Plain NCHW layouts only (activation_channel_block() is 0 on the GPU).
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias, const kernels::Conv2dShape& s,
                    cudaStream_t stream);
void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, const kernels::Conv2dShape& s, bool accumulate_param_grads,
                     cudaStream_t stream);
// workspace: one int32 per output element (the flat input index of its window's maximum).
size_t maxpool2d_workspace_bytes(const kernels::Pool2dShape& s);
void maxpool2d_forward(float* out, int32_t* workspace, const float* inp, const kernels::Pool2dShape& s,
                       cudaStream_t stream);
void maxpool2d_backward(float* dinp, const float* dout, const int32_t* workspace, const kernels::Pool2dShape& s,
                        cudaStream_t stream);

}  // namespace zerone::cuda
