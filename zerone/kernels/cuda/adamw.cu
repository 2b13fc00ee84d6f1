#include <cuda_bf16.h>

#include <cmath>

#include "zerone/kernels/cuda/adamw.h"
#include "zerone/kernels/cuda/check.h"
#include "zerone/kernels/cuda/device.h"

namespace zerone::cuda {
namespace {

__global__ void adamw_kernel(float* __restrict__ master, float* __restrict__ m, float* __restrict__ v,
                             const float* __restrict__ grad, __nv_bfloat16* __restrict__ param, size_t n,
                             float beta1, float beta2, float decay, float step_size, float inv_sqrt_bc2, float eps,
                             float grad_scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float g = grad[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    float p = master[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if (param != nullptr) param[i] = __float2bfloat16_rn(p);
  }
}

}  // namespace

void adamw_update(float* master, float* m, float* v, const float* grad, unsigned short* param_bf16, size_t n,
                  const kernels::AdamWHyper& h) {
  ZERONE_CHECK(device_count() > 0, "CUDA AdamW: no CUDA device is present");
  double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), h.step);
  double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), h.step);
  int threads = 256;
  int blocks = static_cast<int>(std::min<size_t>((n + threads - 1) / threads, 65535));
  adamw_kernel<<<blocks, threads>>>(master, m, v, grad, reinterpret_cast<__nv_bfloat16*>(param_bf16), n, h.beta1,
                                    h.beta2, 1.0f - h.lr * h.weight_decay, static_cast<float>(h.lr / bc1),
                                    static_cast<float>(1.0 / std::sqrt(bc2)), h.eps, h.grad_scale);
  ZERONE_CUDA_CHECK(cudaGetLastError());
  ZERONE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace zerone::cuda
