#include "zerone/kernels/cpu/classifier.h"

#include <omp.h>

#include <cmath>

#include "zerone/core/profiler.h"
#include "zerone/core/rng.h"
#include "zerone/kernels/softmax_row.h"

namespace zerone::kernels::cpu {
namespace {

// Note [Dropout keys]. The scale is applied to kept elements; dropped ones are 0.
template <typename F>
void for_each_mask(int N, size_t per_sample, float p, const DropoutKey& key, F&& f) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
  for (int b = 0; b < N; ++b) {
    // uniform_at(seed, stream, e) with the stream's key hoisted out of the loop.
    const uint64_t stream = mix64(key.key ^ mix64(key.first_sample + static_cast<uint64_t>(b)));
    const uint64_t k = Rng::key(key.seed, stream);
    const size_t base = static_cast<size_t>(b) * per_sample;
    for (size_t e = 0; e < per_sample; ++e) {
      const bool keep = Rng::to_uniform(Rng::at(k, e)) >= static_cast<double>(p);
      f(base + e, keep ? scale : 0.0f);
    }
  }
}

}  // namespace

void relu_forward(float* out, const float* inp, size_t n) {
  ProfileScope profile(ProfileCategory::elementwise);
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (size_t i = 0; i < n; ++i) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void relu_backward(float* dinp, const float* dout, const float* out, size_t n) {
  ProfileScope profile(ProfileCategory::elementwise);
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (size_t i = 0; i < n; ++i) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

void dropout_forward(float* out, const float* inp, int N, size_t per_sample, float p, const DropoutKey& key) {
  ProfileScope profile(ProfileCategory::elementwise);
  for_each_mask(N, per_sample, p, key, [&](size_t i, float m) { out[i] = inp[i] * m; });
}

void dropout_backward(float* dinp, const float* dout, int N, size_t per_sample, float p, const DropoutKey& key) {
  ProfileScope profile(ProfileCategory::elementwise);
  for_each_mask(N, per_sample, p, key, [&](size_t i, float m) { dinp[i] = dout[i] * m; });
}

float softmax_cross_entropy_forward(float* probs, float* losses, const float* logits, const int32_t* labels, int N,
                                    int K, int64_t* correct) {
  ProfileScope profile(ProfileCategory::elementwise);
  double total = 0.0;
  int64_t hits = 0;
#pragma omp parallel for schedule(static) reduction(+ : total, hits) if (N * K > 16384)
  for (int n = 0; n < N; ++n) {
    const SoftmaxRow r = softmax_row(probs + static_cast<size_t>(n) * K, logits + static_cast<size_t>(n) * K, K,
                                     labels[n]);
    const float loss = r.loss;
    losses[n] = loss;
    total += loss;
    hits += r.argmax == labels[n] ? 1 : 0;
  }
  if (correct) *correct = hits;
  return static_cast<float>(total / N);
}

void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K,
                                    float scale) {
  ProfileScope profile(ProfileCategory::elementwise);
  const float s = scale / static_cast<float>(N);
#pragma omp parallel for schedule(static) if (N * K > 16384)
  for (int n = 0; n < N; ++n) {
    const size_t row = static_cast<size_t>(n) * K;
    for (int k = 0; k < K; ++k) dlogits[row + k] = (probs[row + k] - (k == labels[n] ? 1.0f : 0.0f)) * s;
  }
}

}  // namespace zerone::kernels::cpu
