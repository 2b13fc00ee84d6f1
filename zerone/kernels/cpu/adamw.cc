#include "zerone/kernels/cpu/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "zerone/core/error.h"

namespace zerone::kernels::cpu {
namespace {

// Note [AdamW lanes]: one element's update, the arithmetic every path computes, with every
// multiply-add spelled as a fused one and every other operation rounded on its own: the AVX-512
// body below, its scalar tail, the loop for CPUs without AVX-512 and the CUDA kernel
// (kernels/cuda/engine.cu) all compute this function, so that an element's result depends neither
// on where the range it is updated in starts or ends (a shard split anywhere: ZeRO stages, world
// sizes, the early per-unit step) nor on which device or build updates it (the GPU, or the host
// with --offload-optimizer). The constants come from adamw_scalars (kernels/types.h).
inline float update_element(float& master, float& m, float& v, float raw, const AdamWScalars& c) {
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

template <DType D>
using ParamT = std::conditional_t<D == DType::f32, float, uint16_t>;

template <DType D>
inline ParamT<D> rounded(float p) {
  if constexpr (D == DType::f32) return p;
  else if constexpr (D == DType::bf16) return f32_to_bf16(p);
  else return f32_to_f16(p);
}

// Elements [lo, hi) through update_element, vectorized by the compiler where the build's target
// has FMA (one library call per fused operation where it has not: slow, the same bits); returns
// their gradients' sum of squares.
template <DType D, bool kWriteParam>
inline double update_elements(float* __restrict master, float* __restrict m, float* __restrict v,
                              const float* __restrict grad, ParamT<D>* __restrict param, size_t lo, size_t hi,
                              const AdamWScalars& c) {
  double sumsq = 0.0;
#pragma omp simd reduction(+ : sumsq)
  for (size_t i = lo; i < hi; ++i) {
    const float raw = grad[i];
    sumsq += static_cast<double>(raw) * raw;
    const float p = update_element(master[i], m[i], v[i], raw, c);
    if constexpr (kWriteParam) param[i] = rounded<D>(p);
  }
  return sumsq;
}

#if defined(__x86_64__)
// With AVX-512 (chosen at run time, so that a portable build gets it too on a CPU that has it):
// 8 vectors (128 elements) an iteration, loads first, so that each core keeps many cache lines in
// flight (the compiler's loop of one vector an iteration reached 3% less bandwidth, W2). The
// gradients' squares are summed in double per lane (two accumulators of 8).
constexpr size_t kLaneVectors = 8, kBlock = 16 * kLaneVectors;

// GCC 12's AVX-512 headers start some intrinsics from a deliberately undefined vector, which its
// -Wmaybe-uninitialized reports at every use (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// Blocks [b0, b1) of kBlock elements on the calling thread; returns their sum of squares.
template <DType D, bool kWriteParam>
__attribute__((target("avx512f,fma"))) double update_blocks_avx512(float* __restrict master, float* __restrict m,
                                                                   float* __restrict v, const float* __restrict grad,
                                                                   ParamT<D>* __restrict param, size_t b0, size_t b1,
                                                                   const AdamWScalars& c) {
  const __m512 beta1 = _mm512_set1_ps(c.beta1), beta2 = _mm512_set1_ps(c.beta2);
  const __m512 one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1), one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 decay = _mm512_set1_ps(c.decay), step_size = _mm512_set1_ps(c.step_size);
  const __m512 inv_sqrt_bc2 = _mm512_set1_ps(c.inv_sqrt_bc2), eps = _mm512_set1_ps(c.eps);
  const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
  __m512d low_sum = _mm512_setzero_pd(), high_sum = _mm512_setzero_pd();
  for (size_t b = b0; b < b1; ++b) {
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
  double sumsq = 0.0;
  for (double lane : lanes) sumsq += lane;
  return sumsq;
}
#pragma GCC diagnostic pop

#endif

AdamWPass g_pass = AdamWPass::automatic;

bool use_avx512() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  return has && g_pass == AdamWPass::automatic;
#else
  return false;
#endif
}

// The calling OpenMP thread's part of `count` items: contiguous and equal (schedule(static)'s).
std::pair<size_t, size_t> thread_share(size_t count) {
  const size_t threads = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
  const size_t per = count / threads, extra = count % threads;
  const size_t lo = t * per + std::min(t, extra);
  return {lo, lo + per + (t < extra ? 1 : 0)};
}

template <DType D, bool kWriteParam>
double update(float* __restrict master, float* __restrict m, float* __restrict v, const float* __restrict grad,
              void* __restrict param_out, size_t n, const AdamWHyper& h) {
  ParamT<D>* __restrict param = static_cast<ParamT<D>*>(param_out);
  const AdamWScalars c = adamw_scalars(h);
  // With AVX-512 the threads share the whole blocks and the rest follows one element at a time;
  // without it they share the elements.
#if defined(__x86_64__)
  const size_t blocks = use_avx512() ? n / kBlock : 0;
#else
  const size_t blocks = 0;
#endif
  double sumsq = 0.0;
#pragma omp parallel reduction(+ : sumsq)
  {
#if defined(__x86_64__)
    if (blocks > 0) {
      const auto [b0, b1] = thread_share(blocks);
      sumsq += update_blocks_avx512<D, kWriteParam>(master, m, v, grad, param, b0, b1, c);
    }
#endif
    if (blocks == 0) {
      const auto [lo, hi] = thread_share(n);
      sumsq += update_elements<D, kWriteParam>(master, m, v, grad, param, lo, hi, c);
    }
  }
  if (blocks > 0) sumsq += update_elements<D, kWriteParam>(master, m, v, grad, param, blocks * kBlock, n, c);
  return sumsq;
}

}  // namespace

void set_adamw_pass(AdamWPass pass) { g_pass = pass; }

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
