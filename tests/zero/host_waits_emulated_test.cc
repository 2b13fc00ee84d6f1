// How often a training step makes the host wait for the GPU, on the emulated GPU (Note [Emulated
// warps], zerone/kernels/cuda/emulated_gpu.h), whose runtime counts the calls after which a real
// GPU's host would have waited (zerone_emulated_host_waits). Note [Norms read once a step]
// (core/pending_sum.h): the units' sums of squares are read once a step, not once a unit.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "zerone/comm/communicator.h"
#include "zerone/nn/model.h"
#include "zerone/optim/optimizer.h"
#include "zerone/zero/engine.h"

extern "C" uint64_t zerone_emulated_host_waits(void);

namespace zerone::zero {
namespace {

constexpr const char* kSpec = "gpt2:layers=6,dim=32,heads=2,vocab=64,ctx=16";
constexpr int kB = 2, kT = 16;

struct StepWaits {
  uint64_t backward = 0;  // plan_step and the backward (the early step's updates run in it)
  uint64_t step = 0;      // the engine's step()
};

// The host waits of the last of three steps (the first ones warm the caches and plans up).
StepWaits waits_of_a_step(int stage, float clip, DType dtype, const optim::OptimizerOptions& optimizer) {
  comm::SingleProcessCommunicator single;
  std::unique_ptr<nn::Model> model = nn::make_model(kSpec, dtype, 64, /*allocate=*/false);
  ZeroConfig config;
  config.stage = stage;
  config.persistence_threshold = 0;
  ZeroEngine engine(*model, single, config, optimizer, [&](int u) { model->init_unit(u, 7); });
  std::vector<int32_t> x(kB * kT), y(kB * kT);
  for (int i = 0; i < kB * kT; ++i) x[i] = (5 * i + 1) % 64, y[i] = (7 * i + 3) % 64;
  StepWaits waits;
  for (int step = 0; step < 3; ++step) {
    model->forward(x.data(), y.data(), kB, kT);
    const uint64_t before_backward = zerone_emulated_host_waits();
    engine.plan_step(1e-3f, clip);
    model->backward(1.0f);
    const uint64_t before_step = zerone_emulated_host_waits();
    const StepResult result = engine.step(1e-3f, clip);
    EXPECT_GT(result.norm, 0.0);
    waits = {before_step - before_backward, zerone_emulated_host_waits() - before_step};
  }
  return waits;
}

class HostWaits : public ::testing::Test {
 protected:
  testing::DeviceScope device_{kernels::DeviceKind::cuda};
};

// Without clipping each unit is updated during the backward (Note [Early optimizer step]) and
// its update's sum of squares is pending: the backward never waits, and step() reads the norm
// once, whatever the number of units (8 here).
TEST_F(HostWaits, EarlyStepWaitsOnceAStep) {
  for (int stage : {0, 2, 3})
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string("stage ") + std::to_string(stage) + ", " + dtype_name(dtype));
    const StepWaits waits = waits_of_a_step(stage, 0.0f, dtype, optim::AdamWOptions{});
    EXPECT_EQ(waits.backward, 0u);
    EXPECT_EQ(waits.step, 1u);
  }
  const StepWaits sgd = waits_of_a_step(2, 0.0f, DType::bf16, optim::SGDOptions{0.9f});
  EXPECT_EQ(sgd.backward, 0u);
  EXPECT_EQ(sgd.step, 1u);
}

// With clipping the norm is needed before any update: every unit's sum of squares is launched,
// then read once; the updates' own sums are never read.
TEST_F(HostWaits, ClippedStepWaitsOnceForTheNorm) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const StepWaits waits = waits_of_a_step(stage, 1.0f, DType::bf16, optim::AdamWOptions{});
    EXPECT_EQ(waits.backward, 0u);
    EXPECT_EQ(waits.step, 1u);
  }
}

}  // namespace
}  // namespace zerone::zero
