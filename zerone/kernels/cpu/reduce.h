// Reductions and element-wise helpers the ZeRO engine runs over flat f32 buffers.
// Thread-safety: one caller at a time (uses the OpenMP team).
#pragma once

#include <cstddef>

namespace zerone::kernels::cpu {

// Note [Deterministic gradient norm]: the sum of squares of x (n), in f64, in fixed blocks of
// kNormBlock elements whose partial sums are added in order, so the result does not depend on the
// number of OpenMP threads or on how their reductions are combined. Every path of the engine that
// measures the norm before an update (the step, the speculative early step, --delayed-update) uses
// it, so they agree to the bit. With `copy_to`, x is also copied there in the same sweep.
constexpr size_t kNormBlock = size_t{1} << 14;
double sum_squares(const float* x, size_t n, float* copy_to = nullptr);
// Sum of x (n) in f64, in index order.
double sum(const float* x, size_t n);
// dst (n) += src (n).
void accumulate(float* dst, const float* src, size_t n);
// True when every x (n) is finite.
bool all_finite(const float* x, size_t n);

}  // namespace zerone::kernels::cpu
