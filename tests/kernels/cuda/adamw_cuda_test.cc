// The CUDA AdamW kernel against the CPU kernel (the spec). Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "zerone/core/rng.h"
#include "zerone/kernels/cuda/adamw.h"
#include "zerone/kernels/cuda/device.h"

namespace zerone {
namespace {

TEST(CudaAdamW, MatchesCpuKernel) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const size_t n = 100003;
  Rng rng(9);
  std::vector<float> master(n), m(n), v(n), grad(n);
  for (size_t i = 0; i < n; ++i) master[i] = static_cast<float>(rng.normal()), grad[i] = static_cast<float>(rng.normal());
  kernels::AdamWHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  float *dm, *dmm, *dv, *dg;
  unsigned short* dp;
  cudaMalloc(&dm, n * 4); cudaMalloc(&dmm, n * 4); cudaMalloc(&dv, n * 4); cudaMalloc(&dg, n * 4); cudaMalloc(&dp, n * 2);
  cudaMemcpy(dm, master.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemset(dmm, 0, n * 4); cudaMemset(dv, 0, n * 4);
  cudaMemcpy(dg, grad.data(), n * 4, cudaMemcpyHostToDevice);
  cuda::adamw_update(dm, dmm, dv, dg, dp, n, h);
  std::vector<bf16_t> param(n), gpu_param(n);
  kernels::cpu::adamw_update(master.data(), m.data(), v.data(), grad.data(), param.data(), DType::bf16, n, h);
  std::vector<float> gpu_master(n);
  cudaMemcpy(gpu_master.data(), dm, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(gpu_param.data(), dp, n * 2, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(gpu_master[i], master[i], 1e-6f * std::max(1.0f, std::abs(master[i])));
  cudaFree(dm); cudaFree(dmm); cudaFree(dv); cudaFree(dg); cudaFree(dp);
}

}  // namespace
}  // namespace zerone
