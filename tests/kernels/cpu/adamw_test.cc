// The fused AdamW kernel against a double-precision transcription of PyTorch's AdamW.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "zerone/core/rng.h"
#include "zerone/kernels/cpu/adamw.h"

namespace zerone::kernels::cpu {
namespace {

TEST(AdamW, MatchesPyTorchFormulaOverSeveralSteps) {
  const size_t n = 1000;
  Rng rng(3);
  std::vector<float> master(n), m(n), v(n), grad(n);
  std::vector<double> rp(n), rm(n, 0.0), rv(n, 0.0);
  for (size_t i = 0; i < n; ++i) rp[i] = master[i] = static_cast<float>(rng.normal());
  std::vector<bf16_t> param(n);
  AdamWHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  h.grad_scale = 0.5f;
  for (int step = 1; step <= 5; ++step) {
    for (size_t i = 0; i < n; ++i) grad[i] = static_cast<float>(rng.normal());
    h.step = step;
    adamw_update(master.data(), m.data(), v.data(), grad.data(), param.data(), DType::bf16, n, h);
    double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.999, step);
    for (size_t i = 0; i < n; ++i) {
      double g = grad[i] * 0.5;
      rp[i] *= 1 - 1e-2 * 0.1;
      rm[i] = 0.9 * rm[i] + 0.1 * g;
      rv[i] = 0.999 * rv[i] + 0.001 * g * g;
      rp[i] -= 1e-2 / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + 1e-8);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(master[i], rp[i], 1e-5 * std::max(1.0, std::abs(rp[i]))) << i;
    ASSERT_NEAR(m[i], rm[i], 1e-6) << i;
    ASSERT_NEAR(v[i], rv[i], 1e-6) << i;
    ASSERT_EQ(param[i], f32_to_bf16(master[i])) << "bf16 copy must be the RNE rounding of the master";
  }
}

TEST(AdamW, FusedPassReturnsSumOfSquaresAndLeavesGradientsAlone) {
  std::vector<float> master(300, 1.0f), m(300), v(300), grad(300);
  double want = 0.0;
  for (size_t i = 0; i < grad.size(); ++i) {
    grad[i] = 0.01f * static_cast<float>(i) - 1.0f;
    want += static_cast<double>(grad[i]) * grad[i];
  }
  AdamWHyper h;
  h.grad_scale = 0.25f;  // the returned sum is of the unscaled gradients
  const std::vector<float> before = grad;
  double got = adamw_update(master.data(), m.data(), v.data(), grad.data(), nullptr, DType::f32, grad.size(), h);
  EXPECT_NEAR(got, want, 1e-9 * want);
  EXPECT_EQ(grad, before);  // the next backward overwrites them (Note [Fresh gradients])
}

TEST(AdamW, F32WithoutParamCopyUpdatesMasterOnly) {
  std::vector<float> master = {1.0f, -2.0f}, m(2), v(2), grad = {0.5f, -0.5f};
  AdamWHyper h;
  adamw_update(master.data(), m.data(), v.data(), grad.data(), nullptr, DType::f32, 2, h);
  // First Adam step moves each weight by lr against the gradient sign (|m_hat / sqrt(v_hat)| = 1).
  EXPECT_NEAR(master[0], 1.0f - 1e-3f, 1e-6);
  EXPECT_NEAR(master[1], -2.0f + 1e-3f, 1e-6);
}

}  // namespace
}  // namespace zerone::kernels::cpu
