// How often a training step makes the host wait for the GPU, on the emulated GPU (Note [Emulated
// warps], zerone/kernels/cuda/emulated_gpu.h), whose runtime counts the calls after which a real
// GPU's host would have waited (zerone_emulated_host_waits). Note [Norms read once a step]
// (core/pending_sum.h): the units' sums of squares are read once a step, not once a unit.
#include <gtest/gtest.h>

#include <bit>
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
  std::vector<double> norms;  // every step's
};

struct StepCase {
  int stage = 0;
  float clip = 0.0f;
  DType dtype = DType::bf16;
  optim::OptimizerOptions optimizer = optim::AdamWOptions{};
  bool speculative = false;  // Note [Speculative early step], forced with the state in memory
};

// The host waits of the last of three steps (the first ones warm the caches and plans up).
StepWaits waits_of_a_step(const StepCase& r) {
  comm::SingleProcessCommunicator single;
  std::unique_ptr<nn::Model> model = nn::make_model(kSpec, r.dtype, 64, /*allocate=*/false);
  ZeroConfig config;
  config.stage = r.stage;
  config.persistence_threshold = 0;
  config.speculative_step = r.speculative;
  config.speculate_in_memory = r.speculative;
  ZeroEngine engine(*model, single, config, r.optimizer, [&](int u) { model->init_unit(u, 7); });
  std::vector<int32_t> x(kB * kT), y(kB * kT);
  for (int i = 0; i < kB * kT; ++i) x[i] = (5 * i + 1) % 64, y[i] = (7 * i + 3) % 64;
  StepWaits waits;
  for (int step = 0; step < 3; ++step) {
    model->forward(x.data(), y.data(), kB, kT);
    const uint64_t before_backward = zerone_emulated_host_waits();
    engine.plan_step(1e-3f, r.clip);
    model->backward(1.0f);
    const uint64_t before_step = zerone_emulated_host_waits();
    const StepResult result = engine.step(1e-3f, r.clip);
    waits.backward = before_step - before_backward;
    waits.step = zerone_emulated_host_waits() - before_step;
    waits.norms.push_back(result.norm);
  }
  return waits;
}

// The same norms: to the bit where both add the units' sums in shard order, within 1e-12 where one
// adds them in the order the early step updated the units (Note [Deterministic gradient norm]).
void expect_same_norms(const std::vector<double>& a, const std::vector<double>& b, bool same_order) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_GT(a[i], 0.0);
    if (same_order) EXPECT_EQ(std::bit_cast<uint64_t>(a[i]), std::bit_cast<uint64_t>(b[i])) << "step " << i + 1;
    else EXPECT_NEAR(a[i], b[i], 1e-12 * b[i]) << "step " << i + 1;
  }
}

constexpr float kNeverClips = 1e30f;

class HostWaits : public ::testing::Test {
 protected:
  testing::DeviceScope device_{kernels::DeviceKind::cuda};
};

// Without clipping each unit is updated during the backward (Note [Early optimizer step]) and
// its update's sum of squares is pending: the backward never waits, and step() reads the norm
// once, whatever the number of units (8 here). The norms are those of the step that measures
// them first (a clip that never clips: the same trajectory).
TEST_F(HostWaits, EarlyStepWaitsOnceAStep) {
  for (int stage : {0, 2, 3})
  for (DType dtype : {DType::f32, DType::bf16})
  for (bool sgd : {false, true}) {
    SCOPED_TRACE(std::string("stage ") + std::to_string(stage) + ", " + dtype_name(dtype) + (sgd ? ", sgd" : ""));
    StepCase run{.stage = stage, .dtype = dtype};
    if (sgd) run.optimizer = optim::SGDOptions{0.9f};
    const StepWaits waits = waits_of_a_step(run);
    EXPECT_EQ(waits.backward, 0u);
    EXPECT_EQ(waits.step, 1u);
    run.clip = kNeverClips;
    expect_same_norms(waits.norms, waits_of_a_step(run).norms, /*same_order=*/false);
  }
}

// With clipping the norm is needed before any update: every unit's sum of squares is launched,
// then read once; the updates' own sums are never read.
TEST_F(HostWaits, ClippedStepWaitsOnceForTheNorm) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const StepWaits waits = waits_of_a_step({.stage = stage, .clip = kNeverClips});
    EXPECT_EQ(waits.backward, 0u);
    EXPECT_EQ(waits.step, 1u);
  }
}

// Note [Speculative early step]: the units updated during the backward were measured top down
// and are added in shard order; the norm is read once, validates the speculation, and is the
// norm of the step that measures it first, to the bit.
TEST_F(HostWaits, SpeculativeStepWaitsOnceForTheNorm) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const StepWaits waits = waits_of_a_step({.stage = stage, .clip = kNeverClips, .speculative = true});
    EXPECT_EQ(waits.backward, 0u);
    EXPECT_EQ(waits.step, 1u);
    expect_same_norms(waits.norms, waits_of_a_step({.stage = stage, .clip = kNeverClips}).norms, /*same_order=*/true);
  }
}

}  // namespace
}  // namespace zerone::zero
