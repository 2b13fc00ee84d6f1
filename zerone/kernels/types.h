// Backend-neutral parameter types of the kernels: plain values that every backend (kernels/cpu,
// kernels/sim, kernels/cuda) and their callers share. No behaviour lives here.
// Thread-safety: plain values.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <tuple>

#include "zerone/core/host_device.h"

namespace zerone::kernels {

// AdamW hyper-parameters of one update (kernels/cpu/adamw.h is the executable spec).
struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int step = 1;             // 1-based step number, for bias correction
  float grad_scale = 1.0f;  // multiplies every gradient before use
};

// One range of an AdamW update over several (a unit's weight-decay and no-decay runs: Backend::
// adamw_update_ranges), each with its own hyperparameters. `param` may be null.
struct AdamWRange {
  float* master;
  float* m;
  float* v;
  const float* grad;
  void* param;
  size_t n;
  AdamWHyper hyper;
};

// The constants of one AdamW update, formed on the host the same way for every backend (Note
// [AdamW lanes], kernels/cpu/adamw.cc): the bias corrections in double, the decay factor
// 1 - lr x weight_decay as one fused operation (so that no compiler's contraction choice changes it).
struct AdamWScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, decay, step_size, inv_sqrt_bc2, eps, grad_scale;
};
inline AdamWScalars adamw_scalars(const AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), h.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), h.step);
  return {h.beta1,
          h.beta2,
          1.0f - h.beta1,
          1.0f - h.beta2,
          std::fma(-h.lr, h.weight_decay, 1.0f),
          static_cast<float>(h.lr / bc1),
          static_cast<float>(1.0 / std::sqrt(bc2)),
          h.eps,
          h.grad_scale};
}

// SGD hyper-parameters of one update (kernels/cpu/sgd.h is the executable spec; torch.optim.SGD).
struct SGDHyper {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;  // multiplies every gradient before use
  bool first = false;       // the first step: the momentum buffer starts as the gradient
};

// Rotary embedding frequency scaling (Hugging Face's `rope_type: llama3`); factor 0: none.
struct RopeScaling {
  float factor = 0.0f;  // 0: no scaling
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;
};

// Layout of image activations: plain NCHW, or a backend's channel-blocked layout (on the CPU
// oneDNN's nChw16c / nChw8c, channels padded to the block with zeros).
enum class ActLayout : uint8_t { plain, blocked };

struct Conv2dShape {
  int N = 1, C = 1, H = 1, W = 1;      // input
  int OC = 1, KH = 1, KW = 1;          // filters
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  ActLayout src_layout = ActLayout::plain, dst_layout = ActLayout::plain;  // input / output (and gradients)
  ZERONE_HOST_DEVICE int OH() const { return (H + 2 * pad_h - KH) / stride_h + 1; }
  ZERONE_HOST_DEVICE int OW() const { return (W + 2 * pad_w - KW) / stride_w + 1; }
  auto tie() const {
    return std::tie(N, C, H, W, OC, KH, KW, stride_h, stride_w, pad_h, pad_w, src_layout, dst_layout);
  }
  bool operator<(const Conv2dShape& o) const { return tie() < o.tie(); }
};

struct Pool2dShape {
  int N = 1, C = 1, H = 1, W = 1;
  int KH = 1, KW = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  ActLayout layout = ActLayout::plain;  // input and output (and their gradients)
  ZERONE_HOST_DEVICE int OH() const { return (H + 2 * pad_h - KH) / stride_h + 1; }
  ZERONE_HOST_DEVICE int OW() const { return (W + 2 * pad_w - KW) / stride_w + 1; }
  auto tie() const { return std::tie(N, C, H, W, KH, KW, stride_h, stride_w, pad_h, pad_w, layout); }
  bool operator<(const Pool2dShape& o) const { return tie() < o.tie(); }
};

// Note [Dropout keys]: the keep/drop decision of element e of sample s is a pure function of
// (seed, key, s, e) through the counter-based generator of core/rng.h: kept iff
// uniform(seed, mix(key, s), e) >= p. The trainer passes as `key` the layer and the step, and as s
// the sample's position in the step's global batch, so the mask is the same at every world size,
// accumulation split and thread count, and backward recomputes it instead of storing it.
struct DropoutKey {
  uint64_t seed = 0;
  uint64_t key = 0;           // layer and step
  uint64_t first_sample = 0;  // position of sample 0 of this micro-batch in the global batch
};

// Inverse frequencies (hs/2) of rotary embeddings: 1 / theta^(2i/hs), computed in f32 as Hugging
// Face does. With llama3 scaling (factor > 0): Hugging Face's `rope_type: llama3` rule (wavelengths
// above original_max_position / low_freq_factor divided by factor, below original / high_freq_factor
// kept, smoothly interpolated between).
// A host computation (the model copies the table to its device); defined with the cpu kernels.
void rope_inv_freq(float* inv_freq, int hs, float theta, const RopeScaling& scaling = {});

}  // namespace zerone::kernels
