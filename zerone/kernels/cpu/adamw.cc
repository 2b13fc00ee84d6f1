#include "zerone/kernels/cpu/adamw.h"

#include <cmath>

#include "zerone/core/error.h"

namespace zerone::kernels::cpu {
namespace {

template <typename P, bool kWriteParam>
void update(float* __restrict master, float* __restrict m, float* __restrict v, const float* __restrict grad,
            P* __restrict param, size_t n, const AdamWHyper& h) {
  const float b1 = h.beta1, b2 = h.beta2, one_b1 = 1.0f - h.beta1, one_b2 = 1.0f - h.beta2;
  const float decay = 1.0f - h.lr * h.weight_decay;
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), h.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), h.step);
  const float step_size = static_cast<float>(h.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = h.eps, gs = h.grad_scale;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    float g = grad[i] * gs;
    float mi = b1 * m[i] + one_b1 * g;
    float vi = b2 * v[i] + one_b2 * g * g;
    float p = master[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if constexpr (kWriteParam) {
      if constexpr (std::is_same_v<P, float>) {
        param[i] = p;
      } else {
        param[i] = f32_to_bf16(p);
      }
    }
  }
}

}  // namespace

void adamw_update(float* master, float* m, float* v, const float* grad, void* param, DType param_dtype, size_t n,
                  const AdamWHyper& hyper) {
  ZERONE_ASSERT(hyper.step >= 1, "AdamW step must be 1-based, got ", hyper.step);
  if (param == nullptr) {
    update<float, false>(master, m, v, grad, nullptr, n, hyper);
    return;
  }
  switch (param_dtype) {
    case DType::f32: update<float, true>(master, m, v, grad, static_cast<float*>(param), n, hyper); return;
    case DType::bf16: update<bf16_t, true>(master, m, v, grad, static_cast<bf16_t*>(param), n, hyper); return;
    case DType::f16: break;
  }
  throw Error("AdamW: fp16 parameter copies are not supported on the CPU; use bf16 or fp32");
}

}  // namespace zerone::kernels::cpu
