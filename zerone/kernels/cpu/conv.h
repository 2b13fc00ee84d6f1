// 2-D convolution and max pooling on the CPU through oneDNN (its convolution and pooling
// primitives), forward and backward, in f32 with PyTorch's layouts:
//   activations (N, C, H, W) row-major (NCHW), conv weights (OC, C, KH, KW) (OIHW), bias (OC).
// Activations (and their gradients) may instead be held in oneDNN's channel-blocked layout
// (ActLayout::blocked: nChw16c or nChw8c, whichever this CPU's convolutions use, channels padded
// to the block with zeros), so that a chain conv -> pool -> relu -> conv runs without converting
// between layers (Note [Conv layouts] in conv.cc). Each shape says the layout of its input and
// output; a gradient has the layout of the tensor it is the gradient of.
// Output size per spatial dim: (in + 2 * pad - kernel) / stride + 1 (floor), as torch.nn.Conv2d
// and torch.nn.MaxPool2d (ceil_mode false, dilation 1).
//
// Primitives are created once per shape and cached (Note [Primitive cache] in conv.cc).
// Thread-safety: call from one thread at a time (each call runs on oneDNN's OpenMP team).
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>

#include "zerone/kernels/types.h"

namespace zerone::kernels::cpu {

// Channels per block of ActLayout::blocked on this CPU (16 with AVX-512, 8 with AVX2), or 0 when
// oneDNN's convolutions prefer plain layouts here (then nothing should be held blocked).
int activation_channel_block();
// Floats of one sample (C, H, W) held in `layout` (blocked: C rounded up to the block).
size_t activation_numel(int C, int H, int W, ActLayout layout);
// Converts N samples (C, H, W) between the layouts (padding channels written as zeros). `out` and
// `in` must not overlap.
void activation_to_plain(float* out, const float* blocked, int N, int C, int H, int W);
void activation_to_blocked(float* out, const float* plain, int N, int C, int H, int W);


// out (N,OC,OH,OW) = conv(inp (N,C,H,W), weight (OC,C,KH,KW)) + bias (OC); bias may be null.
// Blocked outputs have zeros in their padding channels; blocked inputs must too.
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias, const Conv2dShape& s);
// dinp (N,C,H,W) = gradient wrt the input (overwrite; skipped when null). dweight (OC,C,KH,KW) and
// dbias (OC; skipped when null) accumulate (+=), or are overwritten when accumulate_param_grads is
// false (Note [Fresh gradients] in nn/flat_param.h).
void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, const Conv2dShape& s, bool accumulate_param_grads = true);


// Bytes of the workspace max pooling keeps between forward and backward (where each maximum was).
size_t maxpool2d_workspace_bytes(const Pool2dShape& s);
// out (N,C,OH,OW) = max over each window of inp (N,C,H,W) (padding never wins); records the
// argmax in `workspace` (maxpool2d_workspace_bytes(s) bytes) for the backward.
void maxpool2d_forward(float* out, void* workspace, const float* inp, const Pool2dShape& s);
// dinp (N,C,H,W) = dout routed to each window's maximum (overwrite).
void maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s);

}  // namespace zerone::kernels::cpu
