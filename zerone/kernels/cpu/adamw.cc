#include "zerone/kernels/cpu/adamw.h"

#include <cmath>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "zerone/core/error.h"

namespace zerone::kernels::cpu {
namespace {

// The step's per-element constants (adamw.h).
struct Coefficients {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, decay, step_size, inv_sqrt_bc2, eps, grad_scale;
  explicit Coefficients(const AdamWHyper& h) {
    beta1 = h.beta1;
    beta2 = h.beta2;
    one_minus_beta1 = 1.0f - h.beta1;
    one_minus_beta2 = 1.0f - h.beta2;
    decay = 1.0f - h.lr * h.weight_decay;
    const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), h.step);
    const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), h.step);
    step_size = static_cast<float>(h.lr / bc1);
    inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    eps = h.eps;
    grad_scale = h.grad_scale;
  }
};

template <DType D>
using ParamT = std::conditional_t<D == DType::f32, float, uint16_t>;

template <DType D>
inline ParamT<D> rounded(float p) {
  if constexpr (D == DType::f32) return p;
  else if constexpr (D == DType::bf16) return f32_to_bf16(p);
  else return f32_to_f16(p);
}

#if defined(__AVX512F__)
// Note [AdamW lanes]: with AVX-512 the pass runs 8 vectors (128 elements) per iteration, loads
// first, so that each core keeps many cache lines in flight (a loop of one vector per iteration,
// as the compiler writes it, reached 3-8% less bandwidth; DeepSpeed's CPU Adam unrolls the same
// way). Every multiply-add is spelled as a fused one, in the vector body and in the scalar
// element below alike, so that an element's result does not depend on which of the two computes
// it: a shard split anywhere (ZeRO stages, world sizes, the early per-unit step) updates each
// parameter to the same bits. The gradients' squares are summed in double per lane (two
// accumulators of 8), then across lanes and threads.
inline float update_element(float& master, float& m, float& v, float raw, const Coefficients& c) {
  const float g = raw * c.grad_scale;
  const float mi = std::fma(c.one_minus_beta1, g, c.beta1 * m);
  const float vi = std::fma(c.one_minus_beta2 * g, g, c.beta2 * v);
  const float q = (c.step_size * mi) / std::fma(std::sqrt(vi), c.inv_sqrt_bc2, c.eps);
  const float p = std::fma(master, c.decay, -q);
  m = mi;
  v = vi;
  master = p;
  return p;
}

constexpr size_t kLaneVectors = 8, kBlock = 16 * kLaneVectors;

// GCC 12's AVX-512 headers start some intrinsics from a deliberately undefined vector, which its
// -Wmaybe-uninitialized reports at every use (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

template <DType D, bool kWriteParam>
double update(float* __restrict master, float* __restrict m, float* __restrict v, const float* __restrict grad,
              void* __restrict param_out, size_t n, const AdamWHyper& h) {
  ParamT<D>* __restrict param = static_cast<ParamT<D>*>(param_out);
  const Coefficients c(h);
  const size_t blocks = n / kBlock;
  double sumsq = 0.0;
#pragma omp parallel reduction(+ : sumsq)
  {
    const __m512 beta1 = _mm512_set1_ps(c.beta1), beta2 = _mm512_set1_ps(c.beta2);
    const __m512 one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1), one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
    const __m512 decay = _mm512_set1_ps(c.decay), step_size = _mm512_set1_ps(c.step_size);
    const __m512 inv_sqrt_bc2 = _mm512_set1_ps(c.inv_sqrt_bc2), eps = _mm512_set1_ps(c.eps);
    const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
    __m512d low_sum = _mm512_setzero_pd(), high_sum = _mm512_setzero_pd();
#pragma omp for schedule(static)
    for (size_t b = 0; b < blocks; ++b) {
      const size_t i0 = b * kBlock;
      __m512 gv[kLaneVectors], mv[kLaneVectors], vv[kLaneVectors], pv[kLaneVectors];
      for (size_t u = 0; u < kLaneVectors; ++u) {
        gv[u] = _mm512_loadu_ps(grad + i0 + 16 * u);
        mv[u] = _mm512_loadu_ps(m + i0 + 16 * u);
        vv[u] = _mm512_loadu_ps(v + i0 + 16 * u);
        pv[u] = _mm512_loadu_ps(master + i0 + 16 * u);
      }
      for (size_t u = 0; u < kLaneVectors; ++u) {
        const __m512d low = _mm512_cvtps_pd(_mm512_castps512_ps256(gv[u]));
        const __m512d high = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_shuffle_f32x4(gv[u], gv[u], _MM_SHUFFLE(3, 2, 3, 2))));
        low_sum = _mm512_fmadd_pd(low, low, low_sum);
        high_sum = _mm512_fmadd_pd(high, high, high_sum);
        const __m512 g = _mm512_mul_ps(gv[u], grad_scale);
        mv[u] = _mm512_fmadd_ps(one_minus_beta1, g, _mm512_mul_ps(beta1, mv[u]));
        vv[u] = _mm512_fmadd_ps(_mm512_mul_ps(one_minus_beta2, g), g, _mm512_mul_ps(beta2, vv[u]));
        const __m512 q = _mm512_div_ps(_mm512_mul_ps(step_size, mv[u]),
                                       _mm512_fmadd_ps(_mm512_sqrt_ps(vv[u]), inv_sqrt_bc2, eps));
        pv[u] = _mm512_fmsub_ps(pv[u], decay, q);
      }
      for (size_t u = 0; u < kLaneVectors; ++u) {
        _mm512_storeu_ps(m + i0 + 16 * u, mv[u]);
        _mm512_storeu_ps(v + i0 + 16 * u, vv[u]);
        _mm512_storeu_ps(master + i0 + 16 * u, pv[u]);
      }
      if constexpr (kWriteParam) {
#pragma omp simd
        for (size_t k = i0; k < i0 + kBlock; ++k) param[k] = rounded<D>(master[k]);
      }
    }
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, _mm512_add_pd(low_sum, high_sum));
    for (double lane : lanes) sumsq += lane;
  }
  for (size_t i = blocks * kBlock; i < n; ++i) {
    const float raw = grad[i];
    sumsq += static_cast<double>(raw) * raw;
    const float p = update_element(master[i], m[i], v[i], raw, c);
    if constexpr (kWriteParam) param[i] = rounded<D>(p);
  }
  return sumsq;
}
#pragma GCC diagnostic pop
#else
// Without AVX-512 at compile time (a portable build): the compiler's vector loop.
template <DType D, bool kWriteParam>
double update(float* __restrict master, float* __restrict m, float* __restrict v, const float* __restrict grad,
              void* __restrict param_out, size_t n, const AdamWHyper& h) {
  ParamT<D>* __restrict param = static_cast<ParamT<D>*>(param_out);
  const Coefficients c(h);
  double sumsq = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : sumsq)
  for (size_t i = 0; i < n; ++i) {
    float raw = grad[i];
    sumsq += static_cast<double>(raw) * raw;
    float g = raw * c.grad_scale;
    float mi = c.beta1 * m[i] + c.one_minus_beta1 * g;
    float vi = c.beta2 * v[i] + c.one_minus_beta2 * g * g;
    float p = master[i] * c.decay - c.step_size * mi / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if constexpr (kWriteParam) param[i] = rounded<D>(p);
  }
  return sumsq;
}
#endif

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
