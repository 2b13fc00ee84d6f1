// The image classifiers' operations on the GPU (kernels.h; kernels/cpu/classifier.h and conv.h are
// the spec): direct convolution and pooling in plain NCHW, one thread per output element.
// Note [CUDA kernels, correctness first] (kernels.h).
#include <cfloat>

#include "zerone/core/rng.h"
#include "zerone/kernels/cuda/common.cuh"
#include "zerone/kernels/cuda/kernels.h"
#include "zerone/kernels/softmax_row.h"

namespace zerone::cuda {
namespace {

using kernels::Conv2dShape;
using kernels::Pool2dShape;

__global__ void relu_forward_kernel(float* out, const float* inp, size_t n) {
  ZERONE_GRID_STRIDE(i, n) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

__global__ void relu_backward_kernel(float* dinp, const float* dout, const float* out, size_t n) {
  ZERONE_GRID_STRIDE(i, n) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

// Note [Dropout keys]: element e of sample b is kept iff uniform(seed, mix(key, first + b), e) >= p,
// the cpu kernel's draw (core/rng.h, Note [Rng on the GPU]).
__global__ void dropout_kernel(float* out, const float* inp, int N, size_t per_sample, float p, uint64_t seed,
                               uint64_t key, uint64_t first_sample) {
  const float scale = 1.0f / (1.0f - p);
  const size_t total = static_cast<size_t>(N) * per_sample;
  ZERONE_GRID_STRIDE(i, total) {
    const uint64_t b = i / per_sample, e = i % per_sample;
    const uint64_t k = Rng::key(seed, mix64(key ^ mix64(first_sample + b)));
    const bool keep = Rng::to_uniform(Rng::at(k, e)) >= static_cast<double>(p);
    out[i] = inp[i] * (keep ? scale : 0.0f);
  }
}

// One thread per row (K is a class count: small).
__global__ void softmax_ce_forward_kernel(float* probs, float* losses, int32_t* hits, const float* logits,
                                          const int32_t* labels, int N, int K) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const kernels::SoftmaxRow r = kernels::softmax_row(probs + static_cast<size_t>(n) * K,
                                                     logits + static_cast<size_t>(n) * K, K, labels[n]);
  losses[n] = r.loss;
  hits[n] = r.argmax == labels[n] ? 1 : 0;
}

__global__ void softmax_ce_backward_kernel(float* dlogits, const float* probs, const int32_t* labels, int N, int K,
                                           float s) {
  const size_t total = static_cast<size_t>(N) * K;
  ZERONE_GRID_STRIDE(i, total) {
    const int n = static_cast<int>(i / K), k = static_cast<int>(i % K);
    dlogits[i] = (probs[i] - (k == labels[n] ? 1.0f : 0.0f)) * s;
  }
}

// f(kh, kw, h, w) for each cell (h, w) of output (oh, ow)'s window that lies inside the input.
template <typename Shape, typename F>
__device__ void for_window(const Shape& s, int oh, int ow, F&& f) {
  for (int kh = 0; kh < s.KH; ++kh) {
    const int h = oh * s.stride_h - s.pad_h + kh;
    if (h < 0 || h >= s.H) continue;
    for (int kw = 0; kw < s.KW; ++kw) {
      const int w = ow * s.stride_w - s.pad_w + kw;
      if (w >= 0 && w < s.W) f(kh, kw, h, w);
    }
  }
}

// f(kh, kw, oh, ow) for each output (oh, ow) whose window holds input cell (h, w) at (kh, kw): the
// gather form of a backward pass (each input gradient written by one thread, no atomics).
template <typename Shape, typename F>
__device__ void for_covering_outputs(const Shape& s, int h, int w, F&& f) {
  const int OH = s.OH(), OW = s.OW();
  for (int kh = 0; kh < s.KH; ++kh) {
    const int oh_s = h + s.pad_h - kh;  // oh * stride_h
    if (oh_s < 0 || oh_s % s.stride_h != 0 || oh_s / s.stride_h >= OH) continue;
    for (int kw = 0; kw < s.KW; ++kw) {
      const int ow_s = w + s.pad_w - kw;
      if (ow_s >= 0 && ow_s % s.stride_w == 0 && ow_s / s.stride_w < OW) f(kh, kw, oh_s / s.stride_h, ow_s / s.stride_w);
    }
  }
}

__global__ void conv_forward_kernel(float* out, const float* inp, const float* weight, const float* bias, Conv2dShape s) {
  const int OH = s.OH(), OW = s.OW();
  const size_t total = static_cast<size_t>(s.N) * s.OC * OH * OW;
  ZERONE_GRID_STRIDE(i, total) {
    const int ow = static_cast<int>(i % OW), oh = static_cast<int>(i / OW % OH);
    const int oc = static_cast<int>(i / OW / OH % s.OC), n = static_cast<int>(i / OW / OH / s.OC);
    float acc = bias ? bias[oc] : 0.0f;
    for (int c = 0; c < s.C; ++c)
      for_window(s, oh, ow, [&](int kh, int kw, int h, int w) {
        acc += inp[((static_cast<size_t>(n) * s.C + c) * s.H + h) * s.W + w] *
               weight[((static_cast<size_t>(oc) * s.C + c) * s.KH + kh) * s.KW + kw];
      });
    out[i] = acc;
  }
}

// dinp (n, c, h, w): a gather over every output whose window covers (h, w).
__global__ void conv_backward_input_kernel(float* dinp, const float* dout, const float* weight, Conv2dShape s) {
  const int OH = s.OH(), OW = s.OW();
  const size_t total = static_cast<size_t>(s.N) * s.C * s.H * s.W;
  ZERONE_GRID_STRIDE(i, total) {
    const int w = static_cast<int>(i % s.W), h = static_cast<int>(i / s.W % s.H);
    const int c = static_cast<int>(i / s.W / s.H % s.C), n = static_cast<int>(i / s.W / s.H / s.C);
    float acc = 0.0f;
    for (int oc = 0; oc < s.OC; ++oc)
      for_covering_outputs(s, h, w, [&](int kh, int kw, int oh, int ow) {
        acc += dout[((static_cast<size_t>(n) * s.OC + oc) * OH + oh) * OW + ow] *
               weight[((static_cast<size_t>(oc) * s.C + c) * s.KH + kh) * s.KW + kw];
      });
    dinp[i] = acc;
  }
}

__global__ void conv_backward_weight_kernel(float* dweight, const float* dout, const float* inp, Conv2dShape s,
                                            bool accumulate) {
  const int OH = s.OH(), OW = s.OW();
  const size_t total = static_cast<size_t>(s.OC) * s.C * s.KH * s.KW;
  ZERONE_GRID_STRIDE(i, total) {
    const int kw = static_cast<int>(i % s.KW), kh = static_cast<int>(i / s.KW % s.KH);
    const int c = static_cast<int>(i / s.KW / s.KH % s.C), oc = static_cast<int>(i / s.KW / s.KH / s.C);
    float acc = 0.0f;
    for (int n = 0; n < s.N; ++n)
      for (int oh = 0; oh < OH; ++oh) {
        const int h = oh * s.stride_h - s.pad_h + kh;
        if (h < 0 || h >= s.H) continue;
        for (int ow = 0; ow < OW; ++ow) {
          const int w = ow * s.stride_w - s.pad_w + kw;
          if (w < 0 || w >= s.W) continue;
          acc += dout[((static_cast<size_t>(n) * s.OC + oc) * OH + oh) * OW + ow] *
                 inp[((static_cast<size_t>(n) * s.C + c) * s.H + h) * s.W + w];
        }
      }
    dweight[i] = accumulate ? dweight[i] + acc : acc;
  }
}

__global__ void conv_backward_bias_kernel(float* dbias, const float* dout, Conv2dShape s, bool accumulate) {
  const int oc = blockIdx.x * blockDim.x + threadIdx.x;
  if (oc >= s.OC) return;
  const size_t plane = static_cast<size_t>(s.OH()) * s.OW();
  float acc = 0.0f;
  for (int n = 0; n < s.N; ++n) {
    const float* d = dout + (static_cast<size_t>(n) * s.OC + oc) * plane;
    for (size_t k = 0; k < plane; ++k) acc += d[k];
  }
  dbias[oc] = accumulate ? dbias[oc] + acc : acc;
}

// Padding never wins: the maximum is over the window's cells inside the input (the first of equal
// maxima, in row-major window order).
__global__ void maxpool_forward_kernel(float* out, int32_t* argmax, const float* inp, Pool2dShape s) {
  const int OH = s.OH(), OW = s.OW();
  const size_t total = static_cast<size_t>(s.N) * s.C * OH * OW;
  ZERONE_GRID_STRIDE(i, total) {
    const int ow = static_cast<int>(i % OW), oh = static_cast<int>(i / OW % OH);
    const size_t nc = i / OW / OH;
    float best = -FLT_MAX;
    int32_t where = -1;
    for_window(s, oh, ow, [&](int, int, int h, int w) {
      const float x = inp[(nc * s.H + h) * s.W + w];
      if (where < 0 || x > best) best = x, where = h * s.W + w;
    });
    out[i] = best;
    argmax[i] = where;
  }
}

// dinp (n, c, h, w) = the sum of dout over the outputs whose maximum (h, w) was: a gather.
__global__ void maxpool_backward_kernel(float* dinp, const float* dout, const int32_t* argmax, Pool2dShape s) {
  const int OH = s.OH(), OW = s.OW();
  const size_t total = static_cast<size_t>(s.N) * s.C * s.H * s.W;
  ZERONE_GRID_STRIDE(i, total) {
    const int w = static_cast<int>(i % s.W), h = static_cast<int>(i / s.W % s.H);
    const size_t nc = i / s.W / s.H;
    const int32_t me = h * s.W + w;
    float acc = 0.0f;
    for_covering_outputs(s, h, w, [&](int, int, int oh, int ow) {
      const size_t o = (nc * OH + oh) * OW + ow;
      if (argmax[o] == me) acc += dout[o];
    });
    dinp[i] = acc;
  }
}

void check_plain(kernels::ActLayout a, kernels::ActLayout b) {
  ZERONE_ASSERT(a == kernels::ActLayout::plain && b == kernels::ActLayout::plain,
                "cuda: blocked activation layouts are never asked for (activation_channel_block() is 0)");
}

}  // namespace

void relu_forward(float* out, const float* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ZERONE_LAUNCH(grid_for(n), kThreads, 0, stream, relu_forward_kernel)(out, inp, n);
  ZERONE_CUDA_LAUNCHED();
}

void relu_backward(float* dinp, const float* dout, const float* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ZERONE_LAUNCH(grid_for(n), kThreads, 0, stream, relu_backward_kernel)(dinp, dout, out, n);
  ZERONE_CUDA_LAUNCHED();
}

void dropout(float* out, const float* inp, int N, size_t per_sample, float p, const kernels::DropoutKey& key,
             cudaStream_t stream) {
  const size_t total = static_cast<size_t>(N) * per_sample;
  if (total == 0) return;
  ZERONE_LAUNCH(grid_for(total), kThreads, 0, stream, dropout_kernel)(out, inp, N, per_sample, p, key.seed, key.key,
                                                          key.first_sample);
  ZERONE_CUDA_LAUNCHED();
}

void softmax_cross_entropy_forward(float* probs, float* losses, int32_t* hits, const float* logits,
                                   const int32_t* labels, int N, int K, cudaStream_t stream) {
  if (N == 0) return;
  ZERONE_LAUNCH((N + kThreads - 1) / kThreads, kThreads, 0, stream, softmax_ce_forward_kernel)(probs, losses, hits, logits, labels,
                                                                                    N, K);
  ZERONE_CUDA_LAUNCHED();
}

void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K,
                                    float scale, cudaStream_t stream) {
  if (N == 0) return;
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(N) * K), kThreads, 0, stream, softmax_ce_backward_kernel)(
      dlogits, probs, labels, N, K, scale / static_cast<float>(N));
  ZERONE_CUDA_LAUNCHED();
}

void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias, const Conv2dShape& s,
                    cudaStream_t stream) {
  check_plain(s.src_layout, s.dst_layout);
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(s.N) * s.OC * s.OH() * s.OW()), kThreads, 0, stream, conv_forward_kernel)(
      out, inp, weight, bias, s);
  ZERONE_CUDA_LAUNCHED();
}

void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, const Conv2dShape& s, bool accumulate_param_grads, cudaStream_t stream) {
  check_plain(s.src_layout, s.dst_layout);
  if (dinp) {
    ZERONE_LAUNCH(grid_for(static_cast<size_t>(s.N) * s.C * s.H * s.W), kThreads, 0, stream, conv_backward_input_kernel)(
        dinp, dout, weight, s);
    ZERONE_CUDA_LAUNCHED();
  }
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(s.OC) * s.C * s.KH * s.KW), kThreads, 0, stream, conv_backward_weight_kernel)(
      dweight, dout, inp, s, accumulate_param_grads);
  ZERONE_CUDA_LAUNCHED();
  if (dbias) {
    ZERONE_LAUNCH((s.OC + kThreads - 1) / kThreads, kThreads, 0, stream, conv_backward_bias_kernel)(dbias, dout, s,
                                                                                       accumulate_param_grads);
    ZERONE_CUDA_LAUNCHED();
  }
}

size_t maxpool2d_workspace_bytes(const Pool2dShape& s) {
  return static_cast<size_t>(s.N) * s.C * s.OH() * s.OW() * sizeof(int32_t);
}

void maxpool2d_forward(float* out, int32_t* workspace, const float* inp, const Pool2dShape& s, cudaStream_t stream) {
  check_plain(s.layout, s.layout);
  ZERONE_ASSERT(s.OH() > 0 && s.OW() > 0, "maxpool2d: empty output for input ", s.H, "x", s.W);
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(s.N) * s.C * s.OH() * s.OW()), kThreads, 0, stream, maxpool_forward_kernel)(
      out, workspace, inp, s);
  ZERONE_CUDA_LAUNCHED();
}

void maxpool2d_backward(float* dinp, const float* dout, const int32_t* workspace, const Pool2dShape& s,
                        cudaStream_t stream) {
  check_plain(s.layout, s.layout);
  ZERONE_LAUNCH(grid_for(static_cast<size_t>(s.N) * s.C * s.H * s.W), kThreads, 0, stream, maxpool_backward_kernel)(
      dinp, dout, workspace, s);
  ZERONE_CUDA_LAUNCHED();
}

}  // namespace zerone::cuda
