// One row of the classifiers' softmax cross-entropy (kernels/cpu/classifier.h is the spec), shared
// by the cpu kernel and the CUDA kernel so that both compute the same bits in the same order.
// Thread-safety: a pure function of its arguments.
#pragma once

#include <cmath>
#include <cstdint>

#include "zerone/core/host_device.h"

namespace zerone::kernels {

struct SoftmaxRow {
  float loss;  // -log softmax(x)[label]
  int argmax;  // the first index of the largest logit
};

// y (K) = softmax(x (K)), summed in double from the row's maximum. The loss is computed as
// log(z) - (x[label] - max): exact for tiny probabilities too.
ZERONE_HOST_DEVICE inline SoftmaxRow softmax_row(float* y, const float* x, int K, int32_t label) {
  int arg = 0;
  for (int k = 1; k < K; ++k)
    if (x[k] > x[arg]) arg = k;
  const float mx = x[arg];
  double z = 0.0;
  for (int k = 0; k < K; ++k) z += (y[k] = expf(x[k] - mx));
  const float inv = static_cast<float>(1.0 / z);
  for (int k = 0; k < K; ++k) y[k] *= inv;
  return {static_cast<float>(log(z) - (x[label] - mx)), arg};
}

}  // namespace zerone::kernels
