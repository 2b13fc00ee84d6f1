// CPU kernels of the image classifiers (nn/sequential.h) besides convolution and pooling
// (conv.h) and linear layers (ops.h): ReLU, dropout and softmax cross-entropy over classes.
// All f32; n is an element count, N the batch, K the number of classes.
// Thread-safety: call from one thread at a time (each call uses the whole OpenMP team).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zerone/kernels/types.h"

namespace zerone::kernels::cpu {

// out (n) = max(inp, 0). out may alias inp.
void relu_forward(float* out, const float* inp, size_t n);
// dinp (n) = dout where out > 0, else 0 (PyTorch's rule: the gradient at 0 is 0). Overwrites;
// dinp may alias dout.
void relu_backward(float* dinp, const float* dout, const float* out, size_t n);

// Dropout masks are keyed (Note [Dropout keys] in kernels/types.h).
// out (N, per_sample) = inp * mask / (1 - p), mask from the key (0 <= p < 1). out may alias inp.
void dropout_forward(float* out, const float* inp, int N, size_t per_sample, float p, const DropoutKey& key);
// dinp = dout * mask / (1 - p) with the same mask. Overwrites; dinp may alias dout.
void dropout_backward(float* dinp, const float* dout, int N, size_t per_sample, float p, const DropoutKey& key);

// Softmax cross-entropy over K classes. probs (N,K) = softmax(logits (N,K)) per row; losses (N) =
// -log probs[label]. Labels must be in [0, K) (validated by the caller). Returns the mean loss.
// `correct`, when not null, receives how many rows' argmax (the first maximum) is the label.
float softmax_cross_entropy_forward(float* probs, float* losses, const float* logits, const int32_t* labels, int N,
                                    int K, int64_t* correct = nullptr);
// dlogits (N,K) = (probs - onehot(label)) * scale / N: the gradient of scale * mean loss. Overwrites;
// dlogits may alias probs.
void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K,
                                    float scale);

}  // namespace zerone::kernels::cpu
