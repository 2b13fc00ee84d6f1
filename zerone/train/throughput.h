// Model FLOPs and the peak they are measured against, for the TFLOP/s and MFU of the metrics and
// the end-of-run summary.
//
// Note [Model FLOPs]: MFU counts the FLOPs the model needs, not what the engine executes
// (activation recomputation is not counted, as in PaLM's definition): per trained token,
// 6 x parameters (forward 2, backward 4 per weight; the tied head counted once, through the
// embedding) plus 12 x layers x width x sequence for attention's two (T, T) products. Known for the
// transformers (gpt2:, llama:); the image classifiers' convolutions reuse weights across positions,
// so their FLOPs are not 6 x parameters and no figure is given for them.
// Thread-safety: pure functions; measure_gemm_peak runs GEMMs on the calling thread's OpenMP team;
// measure_device_speeds uses the device as the training thread does (not beside a run).
#pragma once

#include <optional>
#include <string>

#include "zerone/core/dtype.h"
#include "zerone/kernels/backend.h"
#include "zerone/nn/model.h"

namespace zerone::train {

// Model FLOPs per trained token at sequence length `seq` (Note [Model FLOPs]); nullopt for
// classifiers and any model whose spec does not name its layers and width.
std::optional<double> model_flops_per_token(const nn::Model& model, int seq);

// The GEMM throughput this rank reaches in `dtype` (bf16: bf16 GEMMs; otherwise f32), in TFLOP/s:
// the best of several 1024^3 products after a warm-up, about 0.1 s on 2 cores.
double measure_gemm_peak_tflop_per_s(DType dtype);

// Note [Device speeds] (zero/cost_model.h): what a device of its own (a GPU) does per second,
// measured through its backend: a (gemm_n x gemm_n) x (gemm_n x gemm_n) linear_forward in `dtype`'s
// parameter precision (FLOP/s), a device-to-device copy of `copy_bytes` (bytes read + written per
// second), and the slower direction of a `copy_bytes` copy between the backend's host memory
// (pinned on a GPU) and the device. The best of a few timed runs after a warm-up, each closed by
// synchronizing the streams the work ran on. Allocates about 3 gemm_n^2 x 4 + 3 x copy_bytes of
// device and host memory for the duration (device Buffers from device.device_arena()) and returns
// what the backend then caches to the device (Backend::release_cached_memory); throws Error where
// the device cannot allocate them.
struct DeviceSpeeds {
  double gemm_flop_per_s = 0;
  double memory_bytes_per_s = 0;
  double host_device_bytes_per_s = 0;
};
DeviceSpeeds measure_device_speeds(kernels::Backend& device, DType dtype, int gemm_n = 8192,
                                   size_t copy_bytes = size_t{256} << 20);

}  // namespace zerone::train
