// SGD update over flat f32 arrays (torch.optim.SGD's single-tensor path), one pass.
//
// Per element, with g = grad[i] * grad_scale and p the f32 master:
//   g += weight_decay * p
//   momentum != 0:  b = g at the first step, else b = momentum * b + (1 - dampening) * g
//                   g = g + momentum * b (nesterov) or g = b
//   p -= lr * g;  param[i] = p rounded to `param_dtype` (RNE), when param is non-null
// Returns sum_i grad[i]^2 of the unscaled gradients, in double.
// Note [SGD arithmetic]: the operations and their order are PyTorch's, each rounded to f32; the
// compiler must not fuse them (sgd.cc is built with -ffp-contract=off), so every placement and
// world size computes the same bits, and PyTorch's within its own rounding.
// Thread-safety: one caller at a time (uses the OpenMP team).
#pragma once

#include <cstddef>

#include "zerone/core/dtype.h"
#include "zerone/kernels/types.h"

namespace zerone::kernels::cpu {

// `momentum` may be null (no momentum buffer), `param` too. No argument overlaps another.
double sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n,
                  const SGDHyper& hyper);

}  // namespace zerone::kernels::cpu
