#include "zerone/kernels/cpu/adamw.h"

#include <cmath>
#include <type_traits>

#include "zerone/core/error.h"

namespace zerone::kernels::cpu {
namespace {

template <DType D, bool kWriteParam>
double update(float* __restrict master, float* __restrict m, float* __restrict v, const float* __restrict grad,
              void* __restrict param_out, size_t n, const AdamWHyper& h) {
  using P = std::conditional_t<D == DType::f32, float, uint16_t>;
  P* __restrict param = static_cast<P*>(param_out);
  const float b1 = h.beta1, b2 = h.beta2, one_b1 = 1.0f - h.beta1, one_b2 = 1.0f - h.beta2;
  const float decay = 1.0f - h.lr * h.weight_decay;
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), h.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), h.step);
  const float step_size = static_cast<float>(h.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = h.eps, gs = h.grad_scale;
  double sumsq = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : sumsq)
  for (size_t i = 0; i < n; ++i) {
    float raw = grad[i];
    sumsq += static_cast<double>(raw) * raw;
    float g = raw * gs;
    float mi = b1 * m[i] + one_b1 * g;
    float vi = b2 * v[i] + one_b2 * g * g;
    float p = master[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if constexpr (kWriteParam) {
      if constexpr (D == DType::f32) param[i] = p;
      else if constexpr (D == DType::bf16) param[i] = f32_to_bf16(p);
      else param[i] = f32_to_f16(p);
    }
  }
  return sumsq;
}

}  // namespace

double adamw_update(float* master, float* m, float* v, const float* grad, void* param, DType param_dtype, size_t n,
                    const AdamWHyper& hyper) {
  ZERONE_ASSERT(hyper.step >= 1, "AdamW step must be 1-based, got ", hyper.step);
  if (param == nullptr) return update<DType::f32, false>(master, m, v, grad, nullptr, n, hyper);
  switch (param_dtype) {
    case DType::f32: return update<DType::f32, true>(master, m, v, grad, param, n, hyper);
    case DType::bf16: return update<DType::bf16, true>(master, m, v, grad, param, n, hyper);
    case DType::f16: return update<DType::f16, true>(master, m, v, grad, param, n, hyper);
  }
  ZERONE_ASSERT(false, "unknown parameter dtype");
}

}  // namespace zerone::kernels::cpu
