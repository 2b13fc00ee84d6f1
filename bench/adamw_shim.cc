// W2's same-process comparison (bench/pytorch_peer.py w2_interleaved): zerone's CPU AdamW pass
// (kernels/cpu/adamw.cc, compiled into this shared library with the build's flags) behind a C
// entry point that Python's ctypes can call on the storage of torch tensors, so that zerone's pass
// and the peers' optimizers take turns in one process on tensors of the same size. Processes run
// one after another on this shared machine differed by up to 10% with the order they ran in.
#include <cstddef>

#include "zerone/kernels/cpu/adamw.h"

// One f32 AdamW step over n elements (no parameter copy, no gradient scaling); returns the
// gradients' sum of squares as the trainer's pass does.
extern "C" double zerone_adamw_f32(float* master, float* m, float* v, const float* grad, size_t n, float lr, float beta1,
                                   float beta2, float eps, float weight_decay, int step) {
  zerone::kernels::AdamWHyper h;
  h.lr = lr;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.eps = eps;
  h.weight_decay = weight_decay;
  h.step = step;
  h.grad_scale = 1.0f;
  return zerone::kernels::cpu::adamw_update(master, m, v, grad, nullptr, zerone::DType::f32, n, h);
}
