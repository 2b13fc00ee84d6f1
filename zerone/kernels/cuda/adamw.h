// AdamW on the GPU: the same update as kernels/cpu/adamw.h (the CPU kernel is the spec), over
// device pointers. Throws Error when no device is present. Runs on the default stream and waits.
#pragma once

#include <cstddef>

#include "zerone/kernels/cpu/adamw.h"

namespace zerone::cuda {

// Device arrays of n elements; `param_bf16` (bf16 bits) may be null.
void adamw_update(float* master, float* m, float* v, const float* grad, unsigned short* param_bf16, size_t n,
                  const kernels::AdamWHyper& hyper);

}  // namespace zerone::cuda
