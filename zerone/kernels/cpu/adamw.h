// AdamW update over flat f32 arrays: one fused, bandwidth-bound pass.
//
// For each element i (PyTorch's AdamW, decoupled weight decay):
//   g        = grad[i] * grad_scale                  (grad_scale folds in clipping / loss scale)
//   master  *= 1 - lr * weight_decay
//   m        = beta1 m + (1 - beta1) g
//   v        = beta2 v + (1 - beta2) g^2
//   master  -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)   with bc_k = 1 - beta_k^step
//   param[i] = master rounded to `param_dtype` (RNE), when param is non-null
// and returns sum_i grad[i]^2 of the (unscaled) gradients, in double. The gradients are only read:
// the next backward overwrites them (Note [Fresh gradients] in nn/flat_param.h), so zeroing them
// here would be a wasted write stream.
//
// Note [Fused optimizer pass]: the step is bound by memory bandwidth, so measuring the gradient
// norm rides along in the same sweep instead of costing another pass over the gradients.
// Memory traffic per element: read master, m, v, grad; write master, m, v (+ param): 28 bytes,
// 30 with a bf16 param copy. Thread-safety: one caller at a time.
#pragma once

#include <cstddef>

#include "zerone/core/dtype.h"
#include "zerone/kernels/types.h"

namespace zerone::kernels::cpu {


// `param` may be null (f32 training keeps the master as the parameter) or point at n elements of
// `param_dtype`. master, m, v and grad must not overlap.
double adamw_update(float* master, float* m, float* v, const float* grad, void* param, DType param_dtype, size_t n,
                    const AdamWHyper& hyper);

// Which pass adamw_update runs (Note [AdamW lanes], adamw.cc): the AVX-512 one where the CPU has
// it (automatic, the default) or the loop for CPUs without it (portable). For tests, which compare
// the two on a CPU that has both; call it while no update runs.
enum class AdamWPass { automatic, portable };
void set_adamw_pass(AdamWPass pass);

}  // namespace zerone::kernels::cpu
