#include "zerone/kernels/cpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace zerone::kernels::cpu {

double sum_squares(const float* x, size_t n, float* copy_to) {
  const size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  auto block = [&](size_t b) {
    const size_t lo = b * kNormBlock, hi = std::min(n, lo + kNormBlock);
    double s = 0.0;
    if (copy_to) std::memcpy(copy_to + lo, x + lo, (hi - lo) * sizeof(float));
#pragma omp simd reduction(+ : s)
    for (size_t k = lo; k < hi; ++k) s += static_cast<double>(x[k]) * x[k];
    return s;
  };
  if (blocks <= 1) return blocks == 1 ? block(0) : 0.0;
  std::vector<double> part(blocks);
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (size_t b = 0; b < blocks; ++b) part[b] = block(b);
  double total = 0.0;
  for (double p : part) total += p;
  return total;
}

double sum(const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += x[i];
  return s;
}

void accumulate(float* dst, const float* src, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

bool all_finite(const float* x, size_t n) {
  bool finite = true;
#pragma omp parallel for reduction(&& : finite) schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) finite = finite && std::isfinite(x[i]);
  return finite;
}

}  // namespace zerone::kernels::cpu
