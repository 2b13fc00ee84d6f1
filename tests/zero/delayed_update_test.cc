// --delayed-update (Note [Delayed parameter update] in zero/step_scheduler.cc) against a reference that
// applies the delay explicitly: a plain engine whose step s computes its gradients at parameters
// the test swaps in by hand, theta_{max(s-2, 0)}, and then updates theta_{s-1}. The delayed
// engine must reproduce that trajectory bit for bit (losses and final parameters) at every ZeRO
// stage, with clipping, gradient accumulation, weight decay and a learning rate that changes every
// step; a delay of 0 or 2 steps, an update applied to the wrong parameters, or the last update
// missing from the final model all change the bits. The cross-world part (ranks 1-3) is
// tests/zero/delayed_invariance.sh. The same harness checks the asynchronous addition of host
// gradient sums (HostSums, at the end).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "tests/test_util.h"
#include "zerone/comm/communicator.h"
#include "zerone/core/error.h"
#include "zerone/kernels/sim/sim_backend.h"
#include "zerone/nn/model.h"
#include "zerone/optim/optimizer.h"
#include "zerone/zero/engine.h"

namespace zerone::zero {
namespace {

constexpr const char* kSpec = "gpt2:layers=2,dim=40,heads=4,vocab=100,ctx=16";
constexpr int kB = 2, kT = 16;

struct Trajectory {
  std::vector<float> losses;
  std::vector<std::vector<char>> params;  // every unit's full parameters at the end
};

struct Case {
  DType dtype = DType::f32;
  int stage = 0;
  float clip = 0.0f;
  int accum = 1;
  int steps = 6;
  OffloadDevice offload = OffloadDevice::none;  // --offload-optimizer (stages 1-3)
};

// The device tests' case: bf16 with clipping and two micro-steps, `steps` steps.
Case bf16_clipped_accumulated(int steps) {
  Case c;
  c.dtype = DType::bf16;
  c.clip = 0.05f;
  c.accum = 2;
  c.steps = steps;
  return c;
}

void batch(int step, int micro, std::vector<int32_t>& x, std::vector<int32_t>& y) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * step + micro));
  std::uniform_int_distribution<int32_t> tok(0, 99);
  for (size_t i = 0; i < x.size(); ++i) x[i] = tok(gen), y[i] = tok(gen);
}

float lr_at(int step) { return 3e-3f * (1.0f + 0.25f * static_cast<float>(step)); }

// Every unit's parameters, read through the model's backend from wherever they are (device
// memory, or the host copies with_full_params gives on a device the host cannot read).
std::vector<std::vector<char>> snapshot(nn::Model& model) {
  std::vector<std::vector<char>> out;
  for (nn::FlatParam& u : model.units()) {
    out.emplace_back(u.param_bytes());
    model.backend().copy_any(out.back().data(), u.data(), u.param_bytes());
  }
  return out;
}

void restore(nn::Model& model, const std::vector<std::vector<char>>& params) {
  for (size_t u = 0; u < params.size(); ++u)
    model.backend().copy_any(model.units()[u].data(), params[u].data(), params[u].size());
}

// `delayed`: the engine's --delayed-update. `explicit_delay`: a plain engine with the delay
// applied by hand as the Note states it (1 is DPU, 0 the plain trajectory); it swaps whole units,
// so it runs stage 3 as stage 2, which at world 1 computes the same bits (stages 0-1 accumulate
// micro-steps inside the backward's GEMMs, stages 2-3 add reduced shards: not the same bits).
Trajectory run(const Case& c, bool delayed, int explicit_delay = 0) {
  comm::SingleProcessCommunicator single;
  std::unique_ptr<nn::Model> model = nn::make_model(kSpec, c.dtype, 64, /*allocate=*/false);
  ZeroConfig config;
  config.stage = explicit_delay > 0 ? std::min(c.stage, 2) : c.stage;
  config.persistence_threshold = 0;  // stage 3 shards every unit
  config.delayed_update = delayed;
  config.offload_optimizer = c.stage > 0 ? c.offload : OffloadDevice::none;
  ZeroEngine engine(*model, single, config, optim::AdamWOptions{0.9f, 0.95f, 1e-8f, 0.1f},
                    [&](int u) { model->init_unit(u, 7); });
  std::vector<int32_t> x(kB * kT), y(kB * kT);
  std::vector<std::vector<std::vector<char>>> history;  // theta_0, theta_1, ...
  if (explicit_delay > 0) history.push_back(snapshot(*model));
  Trajectory t;
  for (int s = 1; s <= c.steps; ++s) {
    if (explicit_delay > 0) restore(*model, history[std::max(s - 1 - explicit_delay, 0)]);
    double loss = 0.0;
    for (int m = 0; m < c.accum; ++m) {
      batch(s, m, x, y);
      loss += model->forward(x.data(), y.data(), kB, kT);
      engine.set_last_micro_step(m == c.accum - 1);
      model->backward(1.0f / static_cast<float>(c.accum));
    }
    t.losses.push_back(static_cast<float>(loss));
    if (explicit_delay > 0) restore(*model, history.back());  // the update applies to theta_{s-1}
    engine.step(lr_at(s), c.clip);
    if (explicit_delay > 0) history.push_back(snapshot(*model));
  }
  engine.finish_delayed_update();
  engine.with_full_params([&] { t.params = snapshot(*model); });
  return t;
}

void expect_same(const Trajectory& a, const Trajectory& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_EQ(a.losses[i], b.losses[i]) << what << ": loss of step " << i + 1;
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t u = 0; u < a.params.size(); ++u) EXPECT_TRUE(a.params[u] == b.params[u]) << what << ": unit " << u;
}

// Each test on every device (tests/test_util.h): the engine and the model touch device memory only
// through the backend, so the simulated device runs them too.
class OnDevice : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  testing::DeviceScope device_{GetParam()};
};
using DelayedUpdate = OnDevice;
using EarlyStep = OnDevice;
INSTANTIATE_TEST_SUITE_P(Devices, DelayedUpdate, testing::every_device(), testing::device_test_name);
INSTANTIATE_TEST_SUITE_P(Devices, EarlyStep, testing::every_device(), testing::device_test_name);

TEST_P(DelayedUpdate, ReproducesTheExplicitlyDelayedTrajectoryAtEveryStage) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (float clip : {0.0f, 0.05f}) {
      Case c;
      c.dtype = dtype;
      c.clip = clip;
      c.accum = clip > 0.0f ? 2 : 1;
      Trajectory reference = run(c, false, /*explicit_delay=*/1);
      const Trajectory plain = run(c, false);
      // Step 1 runs at theta_0 either way; step 2 too when delayed, theta_1 when not. The oracle
      // tells delays of 0, 1 and 2 steps apart.
      EXPECT_EQ(reference.losses[0], plain.losses[0]);
      EXPECT_NE(reference.losses[1], plain.losses[1]);
      EXPECT_NE(reference.losses[2], run(c, false, /*explicit_delay=*/2).losses[2]);
      for (int stage = 0; stage <= 3; ++stage) {
        c.stage = stage;
        if (stage == 2) reference = run(c, false, /*explicit_delay=*/1);
        expect_same(run(c, true), reference,
                    str_cat(dtype_name(dtype), " clip ", clip, " accum ", c.accum, " stage ", stage));
      }
    }
  }
}

TEST_P(DelayedUpdate, OneStepRunHoldsItsUpdate) {
  // The last update is installed at the end: a 1-step delayed run ends where a 1-step plain run does.
  Case c;
  c.steps = 1;
  expect_same(run(c, true), run(c, false), "1 step");
}

TEST_P(EarlyStep, UpdatesTheTopUnitDuringTheBackwardAndWithClippingOnlyWhenSpeculating) {
  // Note [Early optimizer step]: with plan_step() the head unit (unit 3 of 4; the embedding is
  // tied to it, so it is final before the embedding is) is updated before step() is called;
  // with clipping only when the engine may speculate (Note [Speculative early step]), because the
  // clip factor is not known yet. tests/zero/early_step.sh checks that the trajectories are
  // bitwise those of the step at the end.
  for (bool speculative : {false, true}) {
  for (float clip : {0.0f, 1.0f}) {
    for (int stage : {0, 2, 3}) {
      comm::SingleProcessCommunicator single;
      std::unique_ptr<nn::Model> model = nn::make_model(kSpec, DType::f32, 64, /*allocate=*/false);
      ZeroConfig config;
      config.stage = stage;
      config.persistence_threshold = 0;
      config.speculative_step = speculative;
      config.speculate_in_memory = true;  // the state is in memory here
      ZeroEngine engine(*model, single, config, optim::AdamWOptions{}, [&](int u) { model->init_unit(u, 7); });
      std::vector<int32_t> x(kB * kT), y(kB * kT);
      batch(1, 0, x, y);
      std::vector<std::vector<char>> before, after;
      engine.with_full_params([&] { before = snapshot(*model); });
      engine.plan_step(1e-2f, clip);
      model->forward(x.data(), y.data(), kB, kT);
      model->backward(1.0f);
      engine.with_full_params([&] { after = snapshot(*model); });
      const int top = model->num_units() - 1;
      EXPECT_EQ(before[top] != after[top], clip == 0.0f || speculative)
          << "stage " << stage << " clip " << clip << " speculative " << speculative;
      EXPECT_TRUE(before[0] == after[0]) << "the embedding is final only after its own backward";
      engine.step(1e-2f, clip);
      engine.with_full_params([&] { after = snapshot(*model); });
      EXPECT_TRUE(before[0] != after[0]);
    }
  }
  }
}

// The same bits on both devices: the delayed trajectory at every stage, bf16 with clipping and
// accumulation, on the cpu device and on sim.
TEST(DelayedUpdateDevices, SimGivesTheCpuDevicesBits) {
  Case c = bf16_clipped_accumulated(3);
  for (int stage = 0; stage <= 3; ++stage) {
    c.stage = stage;
    Trajectory on_cpu, on_sim;
    {
      testing::DeviceScope device(kernels::DeviceKind::cpu);
      on_cpu = run(c, true);
    }
    {
      testing::DeviceScope device(kernels::DeviceKind::sim);
      on_sim = run(c, true);
    }
    expect_same(on_sim, on_cpu, str_cat("stage ", stage));
  }
}

// Note [Installing the update behind the gradients' copy]: with the optimizer on the host, the
// update is installed by asynchronous copies, which the simulated device defers (their
// destination NaN until a wait): the trajectory is still the cpu device's, and the plain engine's
// with the delay applied by hand, at stages 1-3, with clipping, accumulation and an fp16-free
// bf16 run; and the copies were deferred (the asynchronous path was taken, one per unit and step).
TEST(DelayedUpdateDevices, InstallsFromTheHostAsynchronouslyWithTheCpuDevicesBits) {
  Case c = bf16_clipped_accumulated(4);
  c.offload = OffloadDevice::cpu;
  auto& sim = dynamic_cast<kernels::sim::SimBackend&>(kernels::backend(kernels::DeviceKind::sim));
  for (int stage = 1; stage <= 3; ++stage) {
    c.stage = stage;
    Trajectory on_cpu, on_sim, reference;
    {
      testing::DeviceScope device(kernels::DeviceKind::cpu);
      on_cpu = run(c, true);
      reference = run(c, false, /*explicit_delay=*/1);
    }
    uint64_t deferred = 0, deferred_plain = 0;
    {
      testing::DeviceScope device(kernels::DeviceKind::sim);
      uint64_t before = sim.copies_deferred();
      on_sim = run(c, true);
      deferred = sim.copies_deferred() - before;
      before = sim.copies_deferred();
      const uint64_t plain_installs_before = optim::installs_launched();
      run(c, false);
      // The plain engine's own installs (Note [Installing staged operands], optim/adamw.cc) are
      // not the delayed engine's.
      deferred_plain = sim.copies_deferred() - before - (optim::installs_launched() - plain_installs_before);
    }
    expect_same(on_sim, on_cpu, str_cat("offload cpu, stage ", stage));
    if (stage < 3) expect_same(on_cpu, reference, str_cat("offload cpu, stage ", stage, " against the explicit delay"));
    // 4 steps install 3 updates during steps 2-4 and the last at the end, 4 units each: copies
    // the plain engine (the same other paths) does not make.
    EXPECT_EQ(deferred, deferred_plain + 4u * 4u) << "stage " << stage;
  }
}

// Note [Installing staged operands] (optim/adamw.cc): with the optimizer offloaded (stages 1-3),
// each unit's update goes back to the device by an asynchronous copy that the simulated device
// defers: the trajectory is the cpu device's bit for bit, one install per unit and step (no
// clipping: no speculative update taken back and redone), each a deferred copy; their staging is
// made in the first step and reused after.
TEST(OffloadedUpdates, InstallAsynchronouslyWithTheCpuDevicesBits) {
  auto& sim = dynamic_cast<kernels::sim::SimBackend&>(kernels::backend(kernels::DeviceKind::sim));
  for (int stage = 1; stage <= 3; ++stage) {
    Case c = bf16_clipped_accumulated(4);
    c.clip = 0.0f;
    c.offload = OffloadDevice::cpu;
    c.stage = stage;
    Trajectory on_cpu, on_sim;
    {
      testing::DeviceScope device(kernels::DeviceKind::cpu);
      on_cpu = run(c, false);
    }
    uint64_t installs = 0, deferred = 0;
    {
      testing::DeviceScope device(kernels::DeviceKind::sim);
      const uint64_t installs_before = optim::installs_launched(), deferred_before = sim.copies_deferred();
      on_sim = run(c, false);
      installs = optim::installs_launched() - installs_before;
      deferred = sim.copies_deferred() - deferred_before;
    }
    expect_same(on_sim, on_cpu, str_cat("offload cpu, stage ", stage));
    EXPECT_EQ(installs, 4u * 4u) << "stage " << stage << ": 4 steps, 4 units";
    EXPECT_GE(deferred, installs) << "stage " << stage;
    // The staging is kept from step to step: a run of 4 steps makes as many buffers as one of 1.
    uint64_t made_in_one = 0, made_in_four = 0;
    {
      testing::DeviceScope device(kernels::DeviceKind::sim);
      Case one = c;
      one.steps = 1;
      uint64_t before = optim::staging_allocations();
      run(one, false);
      made_in_one = optim::staging_allocations() - before;
      before = optim::staging_allocations();
      run(c, false);
      made_in_four = optim::staging_allocations() - before;
    }
    EXPECT_GT(made_in_one, 0u) << "stage " << stage;
    EXPECT_EQ(made_in_four, made_in_one) << "stage " << stage;
  }
}

// Note [Host sums added on the device] (zero/grad_reducer.cc): with the optimizer offloaded at
// stages 2-3, later micro-steps add their reduced shards to the host accumulators on the device,
// through two asynchronous copies that the simulated device defers (NaN until waited for): the
// trajectory is the cpu device's bit for bit, and each later micro-step of each unit made its two
// copies (the asynchronous path was taken).
TEST(HostSums, AreAddedOnTheDeviceAsynchronouslyWithTheCpuDevicesBits) {
  auto& sim = dynamic_cast<kernels::sim::SimBackend&>(kernels::backend(kernels::DeviceKind::sim));
  for (int stage = 2; stage <= 3; ++stage) {
    Case c = bf16_clipped_accumulated(3);
    c.offload = OffloadDevice::cpu;
    c.stage = stage;
    c.accum = 3;
    Trajectory on_cpu, on_sim;
    {
      testing::DeviceScope device(kernels::DeviceKind::cpu);
      on_cpu = run(c, false);
    }
    uint64_t deferred = 0, deferred_one_micro_step = 0;
    {
      testing::DeviceScope device(kernels::DeviceKind::sim);
      uint64_t before = sim.copies_deferred();
      on_sim = run(c, false);
      deferred = sim.copies_deferred() - before;
      Case single = c;
      single.accum = 1;
      before = sim.copies_deferred();
      run(single, false);
      deferred_one_micro_step = sim.copies_deferred() - before;
    }
    expect_same(on_sim, on_cpu, str_cat("offload cpu, stage ", stage, ", 3 micro-steps"));
    // 3 steps x 4 units x 2 later micro-steps, two copies each.
    EXPECT_EQ(deferred, deferred_one_micro_step + 3u * 4u * 2u * 2u) << "stage " << stage;
  }
}

}  // namespace
}  // namespace zerone::zero
