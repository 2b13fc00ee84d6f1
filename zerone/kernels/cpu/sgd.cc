#include "zerone/kernels/cpu/sgd.h"

namespace zerone::kernels::cpu {
namespace {

// Note [SGD arithmetic] (sgd.h). One loop per combination, so that none branches per element and
// all vectorize.
template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst>
double update_loop(const float* grad, float* master, float* momentum, size_t n, const SGDHyper& h) {
  double sumsq = 0.0;
  const float keep = 1.0f - h.dampening, mu = h.momentum, wd = h.weight_decay, lr = h.lr, grad_scale = h.grad_scale;
#pragma omp parallel for simd reduction(+ : sumsq) schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    sumsq += static_cast<double>(g) * g;
    float d = g * grad_scale;
    if constexpr (kDecay) d = d + wd * master[i];
    if constexpr (kMomentum) {
      const float b = kFirst ? d : momentum[i] * mu + keep * d;
      momentum[i] = b;
      d = kNesterov ? d + mu * b : b;
    }
    master[i] = master[i] - lr * d;
  }
  return sumsq;
}

}  // namespace

double sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n,
                  const SGDHyper& hyper) {
  using Loop = double (*)(const float*, float*, float*, size_t, const SGDHyper&);
  static constexpr Loop loops[16] = {
      update_loop<false, false, false, false>, update_loop<false, false, false, true>,
      update_loop<false, false, true, false>,  update_loop<false, false, true, true>,
      update_loop<false, true, false, false>,  update_loop<false, true, false, true>,
      update_loop<false, true, true, false>,   update_loop<false, true, true, true>,
      update_loop<true, false, false, false>,  update_loop<true, false, false, true>,
      update_loop<true, false, true, false>,   update_loop<true, false, true, true>,
      update_loop<true, true, false, false>,   update_loop<true, true, false, true>,
      update_loop<true, true, true, false>,    update_loop<true, true, true, true>};
  const bool with_momentum = momentum != nullptr;
  const int which = (hyper.weight_decay != 0.0f ? 8 : 0) | (with_momentum ? 4 : 0) |
                    (with_momentum && hyper.nesterov ? 2 : 0) | (hyper.first ? 1 : 0);
  const double sumsq = loops[which](grad, master, momentum, n, hyper);
  if (param) convert_from_f32(master, param, param_dtype, n);
  return sumsq;
}

}  // namespace zerone::kernels::cpu
