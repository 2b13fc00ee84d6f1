// 2-D convolution and max pooling on the CPU through oneDNN (its convolution and pooling
// primitives), forward and backward, in f32 with PyTorch's layouts:
//   activations (N, C, H, W) row-major (NCHW), conv weights (OC, C, KH, KW) (OIHW), bias (OC).
// Output size per spatial dim: (in + 2 * pad - kernel) / stride + 1 (floor), as torch.nn.Conv2d
// and torch.nn.MaxPool2d (ceil_mode false, dilation 1).
//
// Primitives are created once per shape and cached (Note [Primitive cache] in conv.cc).
// Thread-safety: call from one thread at a time (each call runs on oneDNN's OpenMP team).
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>

namespace zerone::kernels::cpu {

struct Conv2dShape {
  int N = 1, C = 1, H = 1, W = 1;      // input
  int OC = 1, KH = 1, KW = 1;          // filters
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int OH() const { return (H + 2 * pad_h - KH) / stride_h + 1; }
  int OW() const { return (W + 2 * pad_w - KW) / stride_w + 1; }
  auto tie() const { return std::tie(N, C, H, W, OC, KH, KW, stride_h, stride_w, pad_h, pad_w); }
  bool operator<(const Conv2dShape& o) const { return tie() < o.tie(); }
};

// out (N,OC,OH,OW) = conv(inp (N,C,H,W), weight (OC,C,KH,KW)) + bias (OC); bias may be null.
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias, const Conv2dShape& s);
// dinp (N,C,H,W) = gradient wrt the input (overwrite; skipped when null). dweight (OC,C,KH,KW) and
// dbias (OC; skipped when null) accumulate (+=), or are overwritten when accumulate_param_grads is
// false (Note [Fresh gradients] in nn/flat_param.h).
void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, const Conv2dShape& s, bool accumulate_param_grads = true);

struct Pool2dShape {
  int N = 1, C = 1, H = 1, W = 1;
  int KH = 1, KW = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int OH() const { return (H + 2 * pad_h - KH) / stride_h + 1; }
  int OW() const { return (W + 2 * pad_w - KW) / stride_w + 1; }
  auto tie() const { return std::tie(N, C, H, W, KH, KW, stride_h, stride_w, pad_h, pad_w); }
  bool operator<(const Pool2dShape& o) const { return tie() < o.tie(); }
};

// Bytes of the workspace max pooling keeps between forward and backward (where each maximum was).
size_t maxpool2d_workspace_bytes(const Pool2dShape& s);
// out (N,C,OH,OW) = max over each window of inp (N,C,H,W) (padding never wins); records the
// argmax in `workspace` (maxpool2d_workspace_bytes(s) bytes) for the backward.
void maxpool2d_forward(float* out, void* workspace, const float* inp, const Pool2dShape& s);
// dinp (N,C,H,W) = dout routed to each window's maximum (overwrite).
void maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s);

}  // namespace zerone::kernels::cpu
