#include <gtest/gtest.h>

#include "tests/test_util.h"
#include "zerone/comm/communicator.h"
#include "zerone/nn/gpt2.h"
#include "zerone/train/trainer.h"
#include "zerone/zero/engine.h"
#include "zerone/zero/estimate.h"
#include "zerone/zero/zeropp.h"

namespace zerone::zero {
namespace {

TEST(Partition, ShardsCoverThePaddedUnitEqually) {
  ZeroConfig config;
  for (int world : {1, 2, 3, 4, 7}) {
    for (size_t numel : {size_t{1}, size_t{63}, size_t{64}, size_t{1000}, size_t{19720}}) {
      size_t covered = 0;
      for (int r = 0; r < world; ++r) {
        UnitShard s = unit_shard(numel, world, r, config);
        EXPECT_EQ(s.padded_numel % (64 * world), 0u);
        EXPECT_GE(s.padded_numel, numel);
        EXPECT_LT(s.padded_numel - numel, 64u * world);
        EXPECT_EQ(s.shard_begin, covered);
        covered += s.shard_numel;
      }
      EXPECT_EQ(covered, padded_numel(numel, world));
    }
  }
}

TEST(Partition, ModelStateFollowsTheZeroFormulas) {
  // Psi parameters, bf16: P = 2 Psi, G = 4 Psi, O = 12 Psi (master + m + v), N = 4.
  std::vector<size_t> units = {256 * 1000, 256 * 2000};
  const double psi = 256 * 3000, N = 4;
  ZeroConfig config;
  config.persistence_threshold = 0;
  double P = 2 * psi, G = 4 * psi, O = 12 * psi;
  double want[4] = {P + G + O, P + G + O / N, P + (G + O) / N, (P + G + O) / N};
  for (int stage = 0; stage <= 3; ++stage) {
    config.stage = stage;
    EXPECT_DOUBLE_EQ(static_cast<double>(model_state_bytes(units, 4, 0, DType::bf16, config, 2).total()), want[stage])
        << "stage " << stage;
    // SGD with momentum: master + momentum buffer (8 Psi); without momentum, the master only.
    const double O_sgd = 8 * psi, O_plain = 4 * psi;
    const double sgd[4] = {P + G + O_sgd, P + G + O_sgd / N, P + (G + O_sgd) / N, (P + G + O_sgd) / N};
    const double plain[4] = {P + G + O_plain, P + G + O_plain / N, P + (G + O_plain) / N, (P + G + O_plain) / N};
    EXPECT_DOUBLE_EQ(static_cast<double>(model_state_bytes(units, 4, 0, DType::bf16, config, 1).total()), sgd[stage]);
    EXPECT_DOUBLE_EQ(static_cast<double>(model_state_bytes(units, 4, 0, DType::bf16, config, 0).total()), plain[stage]);
    // f32 parameters are their own master: SGD without momentum keeps no optimizer state at all.
    const ModelStateBytes f32_plain = model_state_bytes(units, 4, 0, DType::f32, config, 0);
    EXPECT_EQ(f32_plain.master + f32_plain.optim, 0) << "stage " << stage;
  }
}

TEST(Partition, PartialOffloadTakesTheFirstSubGroupsAsDeepSpeedCountsThem) {
  // Shards of 2, 5 and 2 sub-groups of 500: int(0.5 * 9) = 4 sub-groups, all of the first shard
  // and two of the second.
  EXPECT_EQ(offloaded_prefix({1000, 2500, 700}, 500, 0.5), (std::vector<size_t>{1000, 1000, 0}));
  EXPECT_EQ(offloaded_prefix({1000, 2500, 700}, 500, 1.0), (std::vector<size_t>{1000, 2500, 700}));
  EXPECT_EQ(offloaded_prefix({1000, 2500, 700}, 500, 0.0), (std::vector<size_t>{0, 0, 0}));
  EXPECT_EQ(offloaded_prefix({1000, 2500, 700}, 500, 0.99), (std::vector<size_t>{1000, 2500, 500}));  // int(8.91)
  // Python's int(0.29 * 100) is 28 (0.29 * 100 = 28.999999999999996): the same truncation.
  EXPECT_EQ(offloaded_prefix({100}, 1, 0.29), (std::vector<size_t>{28}));

  // The bytes split between the device and the offloaded place, summing to the whole offload's.
  std::vector<size_t> units = {256 * 1000, 256 * 2000, 256 * 500};
  ZeroConfig config;
  config.stage = 2;
  config.offload_optimizer = OffloadDevice::cpu;
  config.sub_group_numel = 64000;
  ModelStateBytes whole = model_state_bytes(units, 2, 0, DType::bf16, config, 2);
  config.offload_optimizer_ratio = 0.5;  // 7 sub-groups of 64000 per rank: 3 offloaded, the first unit's 2 and one more
  ModelStateBytes part = model_state_bytes(units, 2, 0, DType::bf16, config, 2);
  EXPECT_EQ(part.total(), whole.total());
  EXPECT_EQ(part.placed.get(MemPlace::host, MemCategory::optim), int64_t{3} * 64000 * 8);
  EXPECT_EQ(part.placed.get(MemPlace::device, MemCategory::optim), int64_t{4} * 64000 * 8);
  EXPECT_EQ(part.placed.get(MemPlace::host, MemCategory::master), int64_t{3} * 64000 * 4);
  // Gradient shards: the first two units have offloaded sub-groups (host), the third none.
  EXPECT_EQ(part.placed.get(MemPlace::host, MemCategory::grad), int64_t{6} * 64000 * 4);
  EXPECT_EQ(part.placed.get(MemPlace::device, MemCategory::grad), int64_t{1} * 64000 * 4);
  // --delayed-update: a gradient and a parameter copy of every optimizer shard, where it steps.
  config.delayed_update = true;
  ModelStateBytes dpu = model_state_bytes(units, 2, 0, DType::bf16, config, 2);
  EXPECT_EQ(dpu.grad - part.grad, int64_t{7} * 64000 * 4);
  EXPECT_EQ(dpu.param - part.param, int64_t{7} * 64000 * 2);
  EXPECT_EQ(dpu.placed.get(MemPlace::device, MemCategory::param) - part.placed.get(MemPlace::device, MemCategory::param),
            int64_t{64000} * 2);
  // Note [Speculative early step]: never with a partial offload (no undo copies, no spare slots).
  ZeroConfig spec;
  spec.stage = 2;
  spec.offload_optimizer = OffloadDevice::nvme;
  spec.speculative_step = true;
  EXPECT_TRUE(speculates(spec));
  spec.offload_optimizer_ratio = 0.5;
  EXPECT_FALSE(speculates(spec));
  EXPECT_EQ(model_state_bytes(units, 2, 0, DType::bf16, spec, 2).speculation, 0);
}

TEST(Partition, GradientShardsGoToNvmeWithTheWholeOptimizer) {
  // Note [Gradient swap]: stages 2-3, the whole optimizer on NVMe, no delayed update.
  std::vector<size_t> units = {256 * 1000, 256 * 2000, 300};
  ZeroConfig config;
  config.stage = 2;
  config.offload_optimizer = OffloadDevice::nvme;
  config.offload_buffer_count = 3;
  ASSERT_TRUE(gradients_swapped(units, 2, 0, config));
  ModelStateBytes b = model_state_bytes(units, 2, 0, DType::bf16, config, 2);
  // Slots of 128000, 256000 and 192 (300 padded to 384, halved) f32 elements, each rounded up to 4 KiB.
  const int64_t slots = static_cast<int64_t>(optim::swap_tensor_bytes(128000) + optim::swap_tensor_bytes(256000) + optim::swap_tensor_bytes(192));
  EXPECT_EQ(b.placed.get(MemPlace::nvme, MemCategory::grad), slots);
  EXPECT_EQ(b.placed.get(MemPlace::host, MemCategory::grad), 0);
  EXPECT_EQ(b.grad, slots);
  const int64_t optimizer_staging = int64_t{3} * 3 * static_cast<int64_t>(optim::swap_tensor_bytes(256000));
  EXPECT_EQ(b.placed.get(MemPlace::host, MemCategory::swap), optimizer_staging + 3 * int64_t{1024000});
  // Not at stage 1, not with a partial offload, not with the delayed update: in memory as before.
  for (auto change : {+[](ZeroConfig& c) { c.stage = 1; }, +[](ZeroConfig& c) { c.offload_optimizer_ratio = 0.5; },
                      +[](ZeroConfig& c) { c.delayed_update = true; }, +[](ZeroConfig& c) { c.offload_optimizer = OffloadDevice::cpu; }}) {
    ZeroConfig other = config;
    change(other);
    EXPECT_FALSE(gradients_swapped(units, 2, 0, other));
    EXPECT_EQ(model_state_bytes(units, 2, 0, DType::bf16, other, 2).placed.get(MemPlace::nvme, MemCategory::grad), 0);
  }
}

TEST(Partition, TransientGradientsAreTwoBuffersOfTheLargestShard) {
  // Note [Transient gradients]: shards of 128000, 256000 and 192 elements at world 2.
  std::vector<size_t> units = {256 * 1000, 256 * 2000, 300, 256 * 2000};
  ZeroConfig config;
  config.stage = 2;
  config.transient_gradients = true;
  for (OffloadDevice opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
    config.offload_optimizer = opt;
    ASSERT_TRUE(gradients_transient(units, 2, config));
    EXPECT_FALSE(gradients_swapped(units, 2, 0, config));  // it saves the swap's I/O too
    ModelStateBytes b = model_state_bytes(units, 2, 0, DType::bf16, config, 2);
    const MemPlace place = opt == OffloadDevice::none ? MemPlace::device : MemPlace::host;
    EXPECT_EQ(b.placed.get(place, MemCategory::grad), 2 * 256000 * 4);
    EXPECT_EQ(b.grad, 2 * 256000 * 4);
    EXPECT_EQ(b.placed.get(MemPlace::nvme, MemCategory::grad), 0);
  }
  // Not below stage 2, with a partial offload, the delayed update, without the early step or a
  // speculating one, nor where two of the largest outweigh all the shards.
  config.offload_optimizer = OffloadDevice::cpu;
  for (auto change : {+[](ZeroConfig& c) { c.stage = 1; }, +[](ZeroConfig& c) { c.offload_optimizer_ratio = 0.5; },
                      +[](ZeroConfig& c) { c.delayed_update = true; }, +[](ZeroConfig& c) { c.early_step = false; },
                      +[](ZeroConfig& c) { c.speculative_step = true; }, +[](ZeroConfig& c) { c.transient_gradients = false; }}) {
    ZeroConfig other = config;
    change(other);
    EXPECT_FALSE(gradients_transient(units, 2, other));
  }
  EXPECT_FALSE(gradients_transient({256 * 4000, 256 * 1000, 256 * 1000}, 2, config));
  EXPECT_TRUE(gradients_transient({256 * 2000, 256 * 1000, 256 * 1000, 256}, 2, config));
}

TEST(Partition, WorkingSetBoundFollowsTheBucketsAndTheLargestUnits) {
  // Units of 4096, 8192 and 1024 elements at world 2 (already multiples of 128: P = numel).
  std::vector<size_t> units = {4096, 8192, 1024};
  ZeroConfig config;
  config.persistence_threshold = 2000;  // the 1024-element unit stays whole at stage 3
  config.reduce_bucket_numel = 100;     // below the largest unit: max(B, P_1) = 8192
  config.prefetch_numel = 5000;
  for (int stage : {0, 1}) {
    config.stage = stage;
    EXPECT_EQ(working_set_bytes(units, 2, DType::bf16, config).total(), 0) << "stage " << stage;
  }
  config.stage = 2;
  WorkingSetBytes w = working_set_bytes(units, 2, DType::bf16, config);
  EXPECT_EQ(w.param, 0);
  EXPECT_EQ(w.grad, int64_t{13312} * 4);        // min(13312, 8192 + 8192 + 4096)
  EXPECT_EQ(w.comm, int64_t{13312} / 2 * 4);    // min(13312, 8192 + 8192) / 2
  config.stage = 3;
  w = working_set_bytes(units, 2, DType::bf16, config);
  EXPECT_EQ(w.param, int64_t{12288} * 2);       // sharded units only: min(12288, 8192 + 4096 + 5000)
  config.reduce_bucket_numel = 1000;
  config.prefetch_numel = 0;
  units = {64 * 1000, 64 * 10, 64 * 10, 64 * 10};
  config.persistence_threshold = 0;
  w = working_set_bytes(units, 1, DType::f32, config);
  EXPECT_EQ(w.param, int64_t{64 * 1010} * 4);  // the two largest, no prefetch
  EXPECT_EQ(w.grad, int64_t{64 * 1030} * 4);   // everything (< max(B, P_1) + P_1 + P_2)
}

TEST(Partition, HpzSecondaryPartitionIsModelStateOnTheDevice) {
  // Units of 4096, 8192 and 1024 elements at world 4 (P = numel rounded to 256): the 1024-element
  // unit is persistent (no secondary copy); the others keep P / H elements each.
  std::vector<size_t> units = {4096, 8192, 1000};
  ZeroConfig config;
  config.stage = 3;
  config.persistence_threshold = 2000;
  const ModelStateBytes plain = model_state_bytes(units, 4, 0, DType::bf16, config, 2);
  config.hpz_partition_size = 2;
  const ModelStateBytes hpz = model_state_bytes(units, 4, 0, DType::bf16, config, 2);
  const int64_t secondary = (4096 + 8192) / 2 * 2;
  EXPECT_EQ(static_cast<int64_t>(secondary_partition_bytes(units, 4, DType::bf16, config)), secondary);
  EXPECT_EQ(hpz.param - plain.param, secondary);
  EXPECT_EQ(hpz.placed.get(MemPlace::device, MemCategory::param) - plain.placed.get(MemPlace::device, MemCategory::param),
            secondary);
  EXPECT_EQ(hpz.grad + hpz.master + hpz.optim, plain.grad + plain.master + plain.optim);
  config.offload_param = OffloadDevice::cpu;  // the secondary copy stays on the device (with the persistent unit)
  EXPECT_EQ(model_state_bytes(units, 4, 0, DType::bf16, config, 2).placed.get(MemPlace::device, MemCategory::param),
            secondary + 1024 * 2);
  config.stage = 2;  // hpZ is stage 3's
  EXPECT_EQ(secondary_partition_bytes(units, 4, DType::bf16, config), 0u);
}

TEST(Partition, ZeroPlusPlusWorkingSetBoundsTheQuantizedBuffers) {
  // Note [ZeRO++ working set]: per unit (P padded, S = P / W), W quantized int8 shards fit in
  // 17/16 P bytes and a qgZ all-to-all's send and receive (2 W Q_b(S)) in (2b + 1) P / 8, for every
  // padded size: checked against the packed form's own size.
  for (size_t W : {1, 2, 3, 4, 8, 16})
    for (size_t P = 64 * W; P <= 64 * W * 300; P += 64 * W) {
      const size_t S = P / W;
      EXPECT_LE(W * kernels::quantized_bytes(S, 8, kQuantBlock) * 16, 17 * P) << "W " << W << " P " << P;
      for (size_t bits : {4, 8})
        EXPECT_LE(2 * W * kernels::quantized_bytes(S, static_cast<int>(bits), kQuantBlock) * 8, (2 * bits + 1) * P)
            << "W " << W << " P " << P << " bits " << bits;
    }
  std::vector<size_t> units = {4096, 8192, 1024};
  ZeroConfig config;
  config.stage = 3;
  config.persistence_threshold = 2000;
  config.reduce_bucket_numel = 100;
  config.prefetch_numel = 5000;
  const WorkingSetBytes plain = working_set_bytes(units, 2, DType::bf16, config);
  EXPECT_EQ(zeropp_working_set_bytes(units, 2, DType::bf16, config).total(), 0);
  config.hpz_partition_size = 2;  // hpZ moves no quantized bytes
  EXPECT_EQ(zeropp_working_set_bytes(units, 2, DType::bf16, config).total(), 0);
  config.quantized_weights = true;
  WorkingSetBytes z = zeropp_working_set_bytes(units, 2, DType::bf16, config);
  // G = min(12288, 8192 + 4096 + 5000) = 12288: ceil(17 G / 16) on the device, ceil(17 G / 32) for the own shard.
  EXPECT_EQ(z.comm, 13056 + 6528);
  EXPECT_EQ(z.host, 0);
  config.offload_param = OffloadDevice::cpu;
  z = zeropp_working_set_bytes(units, 2, DType::bf16, config);
  EXPECT_EQ(z.comm, 13056);
  EXPECT_EQ(z.host, 6528);
  config.offload_param = OffloadDevice::none;
  config.quantized_weights = false;
  config.quantized_gradients_bits = 4;
  z = zeropp_working_set_bytes(units, 2, DType::bf16, config);
  // R = min(13312, 8192 + 8192) = 13312: 9 R / 8 + 4 R / 2, and the within-host step 9 P_1 / 8 + 2 P_1.
  EXPECT_EQ(z.comm, 14976 + 26624 + 9216 + 16384);
  const WorkingSetBytes with = working_set_bytes(units, 2, DType::bf16, config);
  EXPECT_EQ(with.comm - plain.comm, z.comm);
  EXPECT_EQ(with.param, plain.param);
  EXPECT_EQ(with.grad, plain.grad);
  config.stage = 2;
  EXPECT_EQ(zeropp_working_set_bytes(units, 2, DType::bf16, config).total(), 0);
}

TEST(Partition, StagedCollectivesFollowTheCollectivesInFlight) {
  // Note [Staged collective bytes], units of 4096, 8192 and 1024 elements at world 2 (P = numel).
  const std::vector<size_t> units = {4096, 8192, 1024};
  const int64_t sum_p = 13312;
  ZeroConfig config;
  config.persistence_threshold = 2000;
  config.reduce_bucket_numel = 100;
  config.prefetch_numel = 5000;
  for (int stage = 0; stage <= 3; ++stage) {
    config.stage = stage;
    EXPECT_EQ(staged_collective_bytes(units, 1, DType::bf16, config), 0) << "alone, nothing is staged";
  }
  config.stage = 0;
  EXPECT_EQ(staged_collective_bytes(units, 2, DType::bf16, config), 4 * sum_p + kStagedScalarBytes);  // all-reduces
  config.stage = 1;
  EXPECT_EQ(staged_collective_bytes(units, 2, DType::bf16, config), 4 * sum_p + kStagedScalarBytes);  // reduce-scatters
  config.stage = 2;  // the gathers after the step (2 sum P) are below the full gradients (4 x 13312 here)
  WorkingSetBytes w = working_set_bytes(units, 2, DType::bf16, config);
  EXPECT_EQ(staged_collective_bytes(units, 2, DType::bf16, config), std::max(w.grad, 2 * sum_p) + kStagedScalarBytes);
  config.stage = 3;
  w = working_set_bytes(units, 2, DType::bf16, config);
  EXPECT_EQ(staged_collective_bytes(units, 2, DType::bf16, config), w.param + w.grad + kStagedScalarBytes);
  for (int stage = 0; stage <= 3; ++stage) {
    config.stage = stage;
    EXPECT_EQ(staged_collective_bytes(units, 2, DType::bf16, config, CollectiveRoute::direct), 0)
        << "host-addressable device memory stages nothing";
  }
}

TEST(Partition, UnderNcclOnlyCollectivesWithAHostOperandAreStaged) {
  // Note [Staged collective bytes], route native: device-only collectives go to NCCL.
  const std::vector<size_t> units = {4096, 8192, 1024};
  ZeroConfig config;
  config.persistence_threshold = 2000;
  config.reduce_bucket_numel = 100;
  config.prefetch_numel = 5000;
  auto native = [&] { return staged_collective_bytes(units, 2, DType::bf16, config, CollectiveRoute::native); };
  for (int stage = 0; stage <= 3; ++stage) {
    config.stage = stage;
    EXPECT_EQ(native(), kStagedScalarBytes) << "stage " << stage << " without offload: only the host scalars";
    EXPECT_EQ(staged_collective_bytes(units, 1, DType::bf16, config, CollectiveRoute::native), 0) << "alone";
  }
  config.offload_optimizer = OffloadDevice::cpu;
  config.stage = 1;  // reduced in place on the device; the optimizer copies its shard itself
  EXPECT_EQ(native(), kStagedScalarBytes);
  for (int stage : {2, 3}) {  // reduce-scatters into host accumulators
    config.stage = stage;
    EXPECT_EQ(native(), working_set_bytes(units, 2, DType::bf16, config).grad + kStagedScalarBytes) << stage;
  }
  config.offload_param = OffloadDevice::cpu;  // and stage 3's gathers from host shards
  const WorkingSetBytes w = working_set_bytes(units, 2, DType::bf16, config);
  EXPECT_EQ(native(), w.param + w.grad + kStagedScalarBytes);
  EXPECT_EQ(native(), staged_collective_bytes(units, 2, DType::bf16, config, CollectiveRoute::staged));
  config.offload_optimizer = OffloadDevice::none;
  EXPECT_EQ(native(), w.param + kStagedScalarBytes);
}

class Engine : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  zerone::testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, Engine, zerone::testing::every_device(), zerone::testing::device_test_name);

TEST_P(Engine, EveryStageMatchesTheLedgerAndEstimateAtWorldOne) {
  // In process at world 1, on every device: the ledger after a step equals estimate's model-state bytes, for the
  // optimizer's own state: AdamW (master for bf16, m, v), SGD with momentum (master for bf16, the
  // momentum buffer) and without (bf16: the master only; f32: nothing).
  nn::GPT2Config c = nn::parse_model_spec("gpt2:layers=2,dim=40,heads=4,vocab=100,ctx=16");
  const std::pair<const char*, optim::OptimizerOptions> optimizers[] = {
      {"adamw", optim::AdamWOptions{}}, {"sgd momentum 0.9", optim::SGDOptions{0.9f}}, {"sgd", optim::SGDOptions{}}};
  for (const auto& [name, optimizer] : optimizers)
  for (DType dtype : {DType::bf16, DType::f32})
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(::testing::Message() << name << ", " << dtype_name(dtype) << ", stage " << stage);
    MemoryLedger& ledger = MemoryLedger::global();
    auto before = [&](MemCategory cat) { return ledger.current(MemPlace::device, cat); };
    int64_t p0 = before(MemCategory::param), g0 = before(MemCategory::grad), m0 = before(MemCategory::master),
            o0 = before(MemCategory::optim), c0 = before(MemCategory::comm);
    {
      comm::SingleProcessCommunicator single;
      nn::GPT2 model(c, dtype, 64, /*allocate=*/false);
      ZeroConfig config;
      config.stage = stage;
      config.persistence_threshold = 0;
      ZeroEngine engine(model, single, config, optimizer, [&](int u) { model.init_unit(u, 1); });
      std::vector<int32_t> x(2 * 16, 3), y(2 * 16, 4);
      for (int step = 0; step < 2; ++step) {
        model.forward(x.data(), y.data(), 2, 16);
        model.backward(1.0f);
        engine.step(1e-3f, 0.0f);
      }
      StageEstimate e = estimate(model, 1, dtype, 2, 16, config, optimizer, stage)[0];
      auto want = e.model_state;
      if (std::string(name) == "sgd" && dtype == DType::f32) {
        EXPECT_EQ(want.master + want.optim, 0);
      } else {
        EXPECT_GT(want.optim + want.master, 0);
      }
      // Stages 2-3 keep their working set pooled (idle buffers under `comm`), within the bound.
      EXPECT_LE(before(MemCategory::comm) - c0, e.working_set.total()) << "stage " << stage;
      if (stage >= 2) {
        EXPECT_GT(before(MemCategory::comm) - c0, 0) << "stage " << stage;
      }
      EXPECT_EQ(before(MemCategory::param) - p0, want.param) << "stage " << stage;
      EXPECT_EQ(before(MemCategory::grad) - g0, want.grad) << "stage " << stage;
      EXPECT_EQ(before(MemCategory::master) - m0, want.master) << "stage " << stage;
      EXPECT_EQ(before(MemCategory::optim) - o0, want.optim) << "stage " << stage;
    }
    EXPECT_EQ(before(MemCategory::comm), c0) << "stage " << stage << ": the pool returns everything";
  }
}

}  // namespace
}  // namespace zerone::zero

#include "zerone/core/error.h"
#include "zerone/zero/loss_scaler.h"

namespace zerone::zero {
namespace {

TEST(LossScaler, DeepSpeedDefaultsHysteresisWindowAndFloor) {
  LossScaler s(LossScaleConfig{});  // 2^16, window 1000, hysteresis 2, min 1
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(true);  // first overflow uses up the hysteresis
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(true);  // second halves
  EXPECT_EQ(s.scale(), 32768.0);
  s.update(true);  // hysteresis stays spent until a window passes: halves again
  EXPECT_EQ(s.scale(), 16384.0);
  for (int i = 0; i < 999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 16384.0);
  s.update(false);  // 1000 clean steps since the last overflow: doubles, hysteresis restored
  EXPECT_EQ(s.scale(), 32768.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 32768.0);

  LossScaleConfig floor;
  floor.initial_scale_power = 1;
  floor.hysteresis = 1;
  LossScaler f(floor);
  for (int i = 0; i < 5; ++i) f.update(true);
  EXPECT_EQ(f.scale(), 1.0);  // never below min_scale

  LossScaleConfig fixed;
  fixed.dynamic = false;
  fixed.static_scale = 128.0;
  LossScaler st(fixed);
  st.update(true);
  for (int i = 0; i < 2000; ++i) st.update(false);
  EXPECT_EQ(st.scale(), 128.0);
}

TEST(LossScaler, BadSettingsAreErrors) {
  LossScaleConfig c;
  c.window = 0;
  EXPECT_THROW(LossScaler{c}, zerone::Error);
  c = LossScaleConfig{};
  c.min_scale = 0;
  EXPECT_THROW(LossScaler{c}, zerone::Error);
}

}  // namespace
}  // namespace zerone::zero
