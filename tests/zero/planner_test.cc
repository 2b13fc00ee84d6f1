// The planner (zero/planner.h): for GPT-2 124M..13B and LLaMA 1B..8B shapes at world 1, 2 and 4
// under several budgets, the chosen plan fits by the estimate (recomputed here from the choice
// alone), and a budget a few percent below its need is refused or gets another plan that fits it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "zerone/comm/comm_choice.h"
#include "zerone/core/error.h"
#include "zerone/core/sysinfo.h"
#include "zerone/nn/model.h"
#include "zerone/train/config.h"
#include "zerone/train/plan.h"
#include "zerone/train/throughput.h"
#include "zerone/train/trainer.h"
#include "zerone/zero/planner.h"

namespace zerone::zero {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

MachineSpeed test_speed() {
  MachineSpeed s;
  s.gemm_flop_per_s = 0.2e12;
  s.memory_bytes_per_s = 10e9;
  s.host_device_bytes_per_s = 10e9;
  s.disk_bytes_per_s = 1e9;
  s.link_bytes_per_s = 5e9;
  return s;
}

PlanRequest request_for(nn::Model& model, int world, MemoryBudget budget) {
  PlanRequest r;
  r.model = &model;
  r.dtype = DType::bf16;
  r.optimizer = optim::AdamWOptions{};
  r.world = world;
  r.seq = std::min(1024, model.max_seq_len());
  r.micro_batch = 2;
  r.grad_accum = 2;
  r.budget = budget;
  r.speed = test_speed();
  return r;
}

// The estimate of `choice` computed afresh, as train would for these settings.
StageEstimate estimate_of(nn::Model& model, const PlanRequest& r, const PlanChoice& c) {
  model.set_activation_checkpointing(c.activation_checkpointing);
  model.set_cpu_checkpointing(c.cpu_checkpointing);
  StageEstimate e =
      estimate(model, r.world, r.dtype, c.micro_batch, r.seq, c.zero, r.optimizer, c.zero.stage, r.collectives)[0];
  model.set_activation_checkpointing(false);
  model.set_cpu_checkpointing(false);
  return e;
}

void check_plans(const std::string& spec) {
  std::unique_ptr<nn::Model> model = nn::make_model(spec, DType::bf16, 64, /*allocate=*/false);
  const int64_t state = static_cast<int64_t>(model->num_parameters()) * 16;  // stage 0, bf16 AdamW
  for (int world : {1, 2, 4}) {
    for (double share : {1.5, 0.5, 0.15}) {
      for (bool nvme : {false, true}) {
        MemoryBudget budget;
        budget.ranks_per_host = world;
        budget.host_bytes = static_cast<int64_t>(share * static_cast<double>(state) * world);
        budget.nvme_bytes = nvme ? 4096 * kGiB : -1;
        const PlanRequest r = request_for(*model, world, budget);
        const Plan plan = make_plan(r);
        SCOPED_TRACE(str_cat(spec, " world ", world, " budget ", human_bytes(static_cast<double>(budget.host_bytes)),
                             nvme ? " with NVMe" : ""));
        if (!plan.best) {
          // Nothing fits: the smallest memory budget named is above the one given, and with it
          // a plan is found.
          ASSERT_TRUE(plan.min_memory_bytes.has_value());
          EXPECT_GT(*plan.min_memory_bytes, budget.host_bytes);
          ASSERT_TRUE(plan.smallest.has_value());
          EXPECT_GT(plan.smallest->need.memory, budget.host_bytes);
          PlanRequest enough = r;
          enough.budget.host_bytes = *plan.min_memory_bytes;
          EXPECT_TRUE(make_plan(enough).best.has_value());
          continue;
        }
        const PlanChoice& c = plan.best->choice;
        if (!nvme) { EXPECT_NE(c.zero.offload_optimizer, OffloadDevice::nvme); }
        const StageEstimate e = estimate_of(*model, r, c);
        EXPECT_EQ(e.total(), plan.best->estimate.total());
        const PlaceNeed need = place_need(e, budget);
        EXPECT_TRUE(overflows(need, budget).empty()) << family_label(c);
        EXPECT_LE(need.memory, budget.host_bytes);
        for (const RunnerUp& ru : plan.runners_up)
          if (ru.candidate.fits()) { EXPECT_GE(ru.candidate.cost.total_s, plan.best->cost.total_s); }
        // A budget 3% below the plan's need: refused, or another plan that fits it.
        PlanRequest tight = r;
        tight.budget.host_bytes = need.memory * 97 / 100;
        const Plan again = make_plan(tight);
        if (again.best) {
          const PlaceNeed n2 = place_need(estimate_of(*model, tight, again.best->choice), tight.budget);
          EXPECT_LE(n2.memory, tight.budget.host_bytes);
          EXPECT_LT(n2.memory, need.memory);
        } else {
          ASSERT_TRUE(again.min_memory_bytes.has_value());
          EXPECT_GT(*again.min_memory_bytes, tight.budget.host_bytes);
          EXPECT_LE(*again.min_memory_bytes, need.memory);
        }
      }
    }
  }
}

// Note [Host memory speed with every core]: the probe's buffers outgrow the last-level cache
// (twice it), within 256 MiB .. 1 GiB and an eighth of the free memory; the machine's own cache
// figure is found.
TEST(Planner, HostMemoryProbeOutgrowsTheCache) {
  constexpr long long kMiB = 1 << 20, kGiB = 1024 * kMiB;
  EXPECT_EQ(train::memory_probe_bytes(0, 0), size_t{256} << 20);  // nothing known
  EXPECT_EQ(train::memory_probe_bytes(32 * kMiB, 64 * kGiB), size_t{256} << 20);
  EXPECT_EQ(train::memory_probe_bytes(384 * kMiB, 64 * kGiB), size_t{768} << 20);  // a 384 MiB cache
  EXPECT_EQ(train::memory_probe_bytes(4096 * kMiB, 64 * kGiB), size_t{1} << 30);
  EXPECT_EQ(train::memory_probe_bytes(384 * kMiB, 2 * kGiB), size_t{256} << 20);  // an eighth of 2 GiB free
  EXPECT_EQ(train::memory_probe_bytes(384 * kMiB, 100 * kMiB), size_t{64} << 20);  // never under 64 MiB
  EXPECT_GT(last_level_cache_bytes(), 0) << "every x86 Linux this runs on reports one";
}

TEST(Planner, Gpt2Shapes) {
  for (const char* spec : {"gpt2-124m", "gpt2-350m", "gpt2-1.5b", "gpt2:layers=32,dim=2560,heads=32,vocab=50257,ctx=1024",
                           "gpt2:layers=40,dim=5120,heads=40,vocab=50257,ctx=1024"})
    check_plans(spec);
}

TEST(Planner, LlamaShapes) {
  for (const char* spec : {"llama-3.2-1b", "llama-3-8b"}) check_plans(spec);
}

TEST(Planner, SeparateDeviceBudget) {
  // A device of 2 GiB per rank beside 64 GiB of host memory: the plan's device bytes fit the
  // device and its host bytes the host.
  std::unique_ptr<nn::Model> model = nn::make_model("gpt2-350m", DType::bf16, 64, false);
  MemoryBudget budget;
  budget.unified = false;
  budget.device_bytes = 2 * kGiB;
  budget.host_bytes = 64 * kGiB;
  PlanRequest r = request_for(*model, 1, budget);
  r.seq = 512;
  const Plan plan = make_plan(r);
  ASSERT_TRUE(plan.best.has_value());
  EXPECT_LE(plan.best->estimate.device(), 2 * kGiB);
  EXPECT_GE(plan.best->choice.zero.stage, 1);
}

TEST(Planner, SplitsTheOptimizerBetweenHostMemoryAndNvme) {
  // Note [Optimizer state on NVMe and in host memory]: Llama-2-13B's shape on an 80 GB GPU, 120 GiB
  // of host memory and 58 GiB of disk. Its 145.5 GiB of master and moments fit neither alone; with
  // transient gradients (one micro-step, Note [Transient gradients]) the plan swaps a share and
  // keeps the rest in host memory, within every budget. Holding every gradient shard it still
  // splits the state (the gradients then fill the device at stage 1, with checkpointing).
  std::unique_ptr<nn::Model> model = nn::make_model("llama-2-13b", DType::bf16, 64, false);
  MemoryBudget budget;
  budget.unified = false;
  budget.device_bytes = 78 * kGiB;
  budget.host_bytes = 120 * kGiB;
  budget.nvme_bytes = 58 * kGiB;
  PlanRequest r = request_for(*model, 1, budget);
  r.seq = 2048;
  r.micro_batch = 1;
  r.grad_accum = 1;
  r.base.transient_gradients = true;
  const Plan plan = make_plan(r);
  ASSERT_TRUE(plan.best.has_value());
  const PlanChoice& c = plan.best->choice;
  EXPECT_EQ(c.zero.offload_optimizer, OffloadDevice::nvme);
  EXPECT_LT(c.zero.offload_optimizer_nvme_ratio, 1.0);
  const StageEstimate e = estimate_of(*model, r, c);
  EXPECT_LE(e.device(), 78 * kGiB);
  EXPECT_LE(e.host(), 120 * kGiB);
  EXPECT_LE(e.nvme(), 58 * kGiB);
  EXPECT_GT(e.model_state.placed.get(MemPlace::host, MemCategory::optim), 0);
  EXPECT_GT(e.model_state.placed.get(MemPlace::nvme, MemCategory::optim), 0);
  r.base.transient_gradients = false;
  const Plan held = make_plan(r);
  ASSERT_TRUE(held.best.has_value());
  EXPECT_LT(held.best->choice.zero.offload_optimizer_nvme_ratio, 1.0);
  EXPECT_LE(estimate_of(*model, r, held.best->choice).device(), 78 * kGiB);
}

TEST(Planner, KeepsGradientSumsOnTheDeviceWhereTheyFit) {
  // Note [Gradient sums on the device]: Llama-2-7B's shape on an 80 GB GPU with its optimizer in
  // host memory and 8 micro-steps a step. Host sums cross the link twice a later micro-step (the
  // cost model's 8 bytes a parameter each), device sums once a step: the plan keeps them on the
  // device, where they fit. On a device too small for them beside the rest, host sums; and a given
  // place is kept.
  std::unique_ptr<nn::Model> model = nn::make_model("llama-2-7b", DType::bf16, 64, false);
  MemoryBudget budget;
  budget.unified = false;
  budget.device_bytes = 78 * kGiB;
  budget.host_bytes = 120 * kGiB;
  PlanRequest r = request_for(*model, 1, budget);
  r.seq = 2048;
  r.micro_batch = 1;
  r.grad_accum = 8;
  r.stage = 2;
  r.offload_optimizer = OffloadDevice::cpu;
  r.offload_optimizer_ratio = 1.0;
  r.activation_checkpointing = true;
  r.speed.device_memory_bytes_per_s = 3e12;
  r.speed.host_device_bytes_per_s = 50e9;
  const Plan plan = make_plan(r);
  ASSERT_TRUE(plan.best.has_value());
  EXPECT_TRUE(plan.best->choice.zero.grad_sums_on_device);
  const StageEstimate e = estimate_of(*model, r, plan.best->choice);
  EXPECT_GT(e.model_state.placed.get(MemPlace::device, MemCategory::grad), 24 * kGiB);
  EXPECT_LE(e.device(), 78 * kGiB);
  PlanChoice host_sums = plan.best->choice;
  host_sums.zero.grad_sums_on_device = false;
  StepWorkload w;
  w.unit_numels = model->unit_numels();
  w.flops_per_token = 6.0 * static_cast<double>(model->num_parameters());
  w.seq = r.seq;
  w.micro_batch = 1;
  w.grad_accum = 8;
  w.dtype = DType::bf16;
  const StepCost device_cost = step_cost(w, plan.best->choice.zero, e, r.speed);
  const StepCost host_cost = step_cost(w, host_sums.zero, estimate_of(*model, r, host_sums), r.speed);
  // 7 later micro-steps x 8 bytes a parameter more over the link.
  EXPECT_NEAR(host_cost.optimizer_s - device_cost.optimizer_s,
              7.0 * 8.0 * static_cast<double>(model->num_parameters()) / r.speed.host_device_bytes_per_s,
              0.01 * host_cost.optimizer_s);

  r.budget.device_bytes = e.device() - 8 * kGiB;
  const Plan small = make_plan(r);
  ASSERT_TRUE(small.best.has_value());
  EXPECT_FALSE(small.best->choice.zero.grad_sums_on_device);
  EXPECT_LE(estimate_of(*model, r, small.best->choice).device(), r.budget.device_bytes);

  r.budget.device_bytes = 78 * kGiB;
  r.grad_sums_on_device = false;
  const Plan given = make_plan(r);
  ASSERT_TRUE(given.best.has_value());
  EXPECT_FALSE(given.best->choice.zero.grad_sums_on_device);
}

TEST(Planner, FixedChoicesAreKept) {
  std::unique_ptr<nn::Model> model = nn::make_model("gpt2-124m", DType::bf16, 64, false);
  MemoryBudget budget;
  budget.host_bytes = 64 * kGiB;
  PlanRequest r = request_for(*model, 2, budget);
  r.stage = 3;
  r.activation_checkpointing = true;
  const Plan plan = make_plan(r);
  ASSERT_TRUE(plan.best.has_value());
  EXPECT_EQ(plan.best->choice.zero.stage, 3);
  EXPECT_TRUE(plan.best->choice.activation_checkpointing);
  for (const RunnerUp& ru : plan.runners_up) EXPECT_EQ(ru.candidate.choice.zero.stage, 3);
}

TEST(Planner, FreeMicroBatchKeepsTheBatch) {
  std::unique_ptr<nn::Model> model = nn::make_model("gpt2-124m", DType::bf16, 64, false);
  MemoryBudget budget;
  budget.host_bytes = 6 * kGiB;
  PlanRequest r = request_for(*model, 1, budget);
  r.micro_batch = 16;
  r.grad_accum = 1;
  r.micro_batch_free = true;
  const Plan plan = make_plan(r);
  ASSERT_TRUE(plan.best.has_value());
  EXPECT_EQ(plan.best->choice.micro_batch * plan.best->choice.grad_accum, 16);
}

TEST(Planner, ModelsWithoutBlocksAreNotCheckpointed) {
  std::unique_ptr<nn::Model> model = nn::make_model("mnist-cnn", DType::f32, 64, false);
  MemoryBudget budget;
  budget.host_bytes = 2 * kGiB;
  PlanRequest r = request_for(*model, 1, budget);
  r.dtype = DType::f32;
  r.seq = 1;
  r.micro_batch = 64;
  const Plan plan = make_plan(r);
  ASSERT_TRUE(plan.best.has_value());
  EXPECT_FALSE(plan.best->choice.activation_checkpointing);
  for (const RunnerUp& ru : plan.runners_up) EXPECT_FALSE(ru.candidate.choice.activation_checkpointing);
}

TEST(Planner, IsDeterministic) {
  std::unique_ptr<nn::Model> model = nn::make_model("llama-3.2-1b", DType::bf16, 64, false);
  MemoryBudget budget;
  budget.host_bytes = 12 * kGiB;
  budget.nvme_bytes = 100 * kGiB;
  const PlanRequest r = request_for(*model, 2, budget);
  const Plan a = make_plan(r), b = make_plan(r);
  ASSERT_TRUE(a.best && b.best);
  EXPECT_EQ(family_label(a.best->choice), family_label(b.best->choice));
  EXPECT_EQ(train::choice_flags(a.best->choice), train::choice_flags(b.best->choice));
}

TEST(Planner, AutoSizesKeepOffloadCheaperThanNone) {
  // Note [Auto sizes]: with the auto sub-group size the NVMe staging is at most an eighth of the
  // state it moves, and the auto bucket the largest padded unit.
  std::unique_ptr<nn::Model> model = nn::make_model("llama-3.2-1b", DType::bf16, 64, false);
  const std::vector<size_t> numels = model->unit_numels();
  train::TrainConfig cfg;
  cfg.zero_stage = 1;  // no gradient swap (Note [Gradient swap]): the staging is the optimizer's alone
  cfg.offload_optimizer = "nvme";
  const ModelStateBytes m = model_state_bytes(numels, 1, 0, DType::bf16, train::zero_config(cfg, DType::bf16, numels, 1), 2);
  const int64_t moved = m.placed.get(MemPlace::nvme, MemCategory::master) + m.placed.get(MemPlace::nvme, MemCategory::optim);
  EXPECT_GT(m.swap, 0);
  EXPECT_LE(m.swap * 8, moved + int64_t{8} * 4 * 3 * 4096);  // up to the 4 KiB rounding of each staged tensor
  cfg.zero_stage = 3;
  cfg.offload_param = "nvme";
  const ZeroConfig z = train::zero_config(cfg, DType::bf16, numels, 1);
  EXPECT_EQ(z.reduce_bucket_numel, auto_bucket_numel(numels, 1));
  cfg.offload_optimizer = cfg.offload_param = "none";
  cfg.zero_stage = 0;
  const ZeroConfig none = train::zero_config(cfg, DType::bf16, numels, 1);
  model->set_activation_checkpointing(true);
  const StageEstimate off = estimate(*model, 1, DType::bf16, 4, 1024, z, optim::AdamWOptions{}, 3)[0];
  const StageEstimate plain = estimate(*model, 1, DType::bf16, 4, 1024, none, optim::AdamWOptions{}, 0)[0];
  EXPECT_LT(off.total(), plain.total());
}

TEST(Planner, TheCommunicatorChoiceDecidesWhatIsStaged) {
  // Note [Choosing NCCL] and Note [Staged collective bytes]: estimate, train's fit check and the
  // planner take the route from the trainer's own choice of library.
  train::TrainConfig cfg;
  cfg.device = "cuda";
  EXPECT_EQ(train::planned_collective_route(cfg, 1), CollectiveRoute::direct) << "alone";
  EXPECT_EQ(train::planned_collective_route(cfg, 2),
            comm::nccl_compiled_in() ? CollectiveRoute::native : CollectiveRoute::staged);
  cfg.comm = "mpi";
  EXPECT_EQ(train::planned_collective_route(cfg, 2), CollectiveRoute::staged);
  cfg.device = "sim";
  EXPECT_EQ(train::planned_collective_route(cfg, 2), CollectiveRoute::staged);
  cfg.device = "cpu";
  EXPECT_EQ(train::planned_collective_route(cfg, 2), CollectiveRoute::direct);
  cfg.comm = "nccl";
  EXPECT_THROW(train::planned_collective_route(cfg, 2), Error) << "--comm nccl on the cpu";
  EXPECT_EQ(collective_route(kernels::DeviceKind::cuda, 2, comm::CommLibrary::nccl), CollectiveRoute::native);
  EXPECT_EQ(collective_route(kernels::DeviceKind::cuda, 2, comm::CommLibrary::mpi), CollectiveRoute::staged);

  // GPT-2 124M at world 2: under NCCL the estimate's host bytes lose exactly what MPI would stage
  // beyond the collectives with a host operand; everything else is the same to the byte.
  std::unique_ptr<nn::Model> model = nn::make_model("gpt2-124m", DType::bf16, 64, false);
  const std::vector<size_t> numels = model->unit_numels();
  for (const char* offload : {"none", "cpu"}) {
    train::TrainConfig t;
    t.offload_optimizer = offload;
    t.zero_stage = 3;
    t.offload_param = offload;
    const ZeroConfig z = train::zero_config(t, DType::bf16, numels, 2);
    const auto mpi = estimate(*model, 2, DType::bf16, 1, 64, z, optim::AdamWOptions{}, std::nullopt, CollectiveRoute::staged);
    const auto nccl = estimate(*model, 2, DType::bf16, 1, 64, z, optim::AdamWOptions{}, std::nullopt, CollectiveRoute::native);
    ASSERT_EQ(mpi.size(), 4u);
    for (size_t s = 0; s < 4; ++s) {
      ZeroConfig zs = z;
      zs.stage = static_cast<int>(s);
      if (s == 0) zs.offload_optimizer = OffloadDevice::none;
      if (s != 3) zs.offload_param = OffloadDevice::none;
      EXPECT_EQ(nccl[s].staged_collectives, staged_collective_bytes(numels, 2, DType::bf16, zs, CollectiveRoute::native));
      EXPECT_EQ(mpi[s].host() - nccl[s].host(), mpi[s].staged_collectives - nccl[s].staged_collectives) << s;
      EXPECT_EQ(mpi[s].device(), nccl[s].device()) << s;
      EXPECT_EQ(mpi[s].model_state.placed.place_total(MemPlace::host), nccl[s].model_state.placed.place_total(MemPlace::host));
      if (s <= 1 || std::string(offload) == "none") {
        EXPECT_EQ(nccl[s].staged_collectives, kStagedScalarBytes) << s;
      } else {
        EXPECT_GT(nccl[s].staged_collectives, kStagedScalarBytes) << s;
      }
    }
    EXPECT_GT(mpi[0].staged_collectives, kStagedScalarBytes);
  }

  // The planner counts the route in every candidate: its best plan's estimate is train's.
  MemoryBudget budget;
  budget.ranks_per_host = 2;
  budget.host_bytes = 64 * kGiB;
  budget.device_bytes = 80 * kGiB;
  budget.unified = false;
  for (CollectiveRoute route : {CollectiveRoute::staged, CollectiveRoute::native}) {
    PlanRequest r = request_for(*model, 2, budget);
    r.collectives = route;
    const Plan plan = make_plan(r);
    ASSERT_TRUE(plan.best.has_value());
    const StageEstimate again = estimate_of(*model, r, plan.best->choice);
    EXPECT_EQ(plan.best->estimate.staged_collectives, again.staged_collectives);
    EXPECT_EQ(plan.best->estimate.host(), again.host());
  }
}

TEST(CostModel, ASeparateDeviceTakesItsOwnSpeeds) {
  // Note [Device speeds]: with device_memory_bytes_per_s given, the memory-bound kernels and the
  // optimizer's on-device share run at the device's bandwidth, the offloaded share at the host's
  // plus the copies over the host link, and parameters offloaded to the host cross that link at
  // every gather. Where the device is host memory nothing of this applies.
  std::unique_ptr<nn::Model> model = nn::make_model("gpt2-350m", DType::bf16, 64, false);
  const std::vector<size_t> numels = model->unit_numels();
  StepWorkload w;
  w.unit_numels = numels;
  w.flops_per_token = 6.0 * static_cast<double>(model->num_parameters());
  w.micro_batch = 4;
  w.seq = 1024;
  w.dtype = DType::bf16;
  w.activation_bytes = int64_t{4} << 30;
  const MachineSpeed host = test_speed();
  MachineSpeed gpu = host;
  gpu.device_memory_bytes_per_s = 20 * host.memory_bytes_per_s;
  gpu.host_device_bytes_per_s = host.memory_bytes_per_s / 4;
  const double bytes_per_element = 30;  // AdamW in bf16 (Note [Cost model])
  for (const char* optimizer_place : {"none", "cpu"}) {
    for (const char* param_place : {"none", "cpu"}) {
      SCOPED_TRACE(str_cat("optimizer ", optimizer_place, ", parameters ", param_place));
      train::TrainConfig cfg;
      cfg.zero_stage = 3;
      cfg.offload_optimizer = optimizer_place;
      cfg.offload_param = param_place;
      ZeroConfig z = train::zero_config(cfg, DType::bf16, numels, 1);
      z.prefetch_numel = 1;  // nothing prefetched: every copy is exposed
      double stepped = 0, padded = 0;
      for (size_t n : numels) {
        stepped += static_cast<double>(unit_shard(n, 1, 0, z).shard_numel);
        padded += static_cast<double>(unit_shard(n, 1, 0, z).padded_numel);
      }
      const StepCost on_host = step_cost(w, z, StageEstimate{}, host);
      const StepCost on_gpu = step_cost(w, z, StageEstimate{}, gpu);
      EXPECT_EQ(on_host.compute_s, on_gpu.compute_s);
      EXPECT_NEAR(on_gpu.memory_s * 20, on_host.memory_s, 1e-12 * on_host.memory_s);
      EXPECT_EQ(on_host.transfer_s, 0.0);
      const bool optimizer_offloaded = std::string(optimizer_place) == "cpu";
      const bool params_offloaded = std::string(param_place) == "cpu";
      // Offloaded: the gradients come over (4 bytes), the parameters go back (2) unless they live
      // on the host, where the host's update writes them.
      const double want_optimizer_s =
          optimizer_offloaded ? stepped * bytes_per_element / host.memory_bytes_per_s +
                                    stepped * (params_offloaded ? 4 : 6) / gpu.host_device_bytes_per_s
                              : stepped * bytes_per_element / gpu.device_memory_bytes_per_s;
      EXPECT_NEAR(on_gpu.optimizer_s, want_optimizer_s, 1e-9 * want_optimizer_s);
      // Two gathers per micro-step (forward, backward), and the shard written back once where the
      // device updated it.
      const double want_transfer_s =
          params_offloaded ? (2 * padded + (optimizer_offloaded ? 0 : stepped)) * 2 / gpu.host_device_bytes_per_s : 0.0;
      EXPECT_NEAR(on_gpu.transfer_s, want_transfer_s, 1e-9 * want_transfer_s + 1e-15);
      EXPECT_NEAR(on_gpu.total_s, on_gpu.compute_s + on_gpu.memory_s + on_gpu.optimizer_s + on_gpu.transfer_s,
                  1e-9 * on_gpu.total_s);
      // Prefetched under a compute longer than the copies: hidden, and the step as without offload
      // (less the parameters' way back from an offloaded optimizer, which the host then keeps).
      z.prefetch_numel = size_t{1} << 40;
      StepWorkload long_compute = w;
      long_compute.micro_batch = 64;
      const StepCost hidden = step_cost(long_compute, z, StageEstimate{}, gpu);
      ZeroConfig kept = z;
      kept.offload_param = OffloadDevice::none;
      EXPECT_EQ(hidden.transfer_s, 0.0);
      const double saved_s = params_offloaded && optimizer_offloaded ? stepped * 2 / gpu.host_device_bytes_per_s : 0.0;
      EXPECT_NEAR(hidden.total_s, step_cost(long_compute, kept, StageEstimate{}, gpu).total_s - saved_s,
                  1e-9 * hidden.total_s);
    }
  }
  // Gradient accumulation with the optimizer offloaded (stages 2-3): on a separate device each
  // later micro-step's shard is added to the host's sum on the device, the sum crossing the link
  // there and back (Note [Host sums added on the device]); where the device is host memory, the
  // optimizer term does not depend on the micro-steps.
  {
    train::TrainConfig cfg;
    cfg.zero_stage = 2;
    cfg.offload_optimizer = "cpu";
    const ZeroConfig z = train::zero_config(cfg, DType::bf16, numels, 1);
    double stepped = 0;
    for (size_t n : numels) stepped += static_cast<double>(unit_shard(n, 1, 0, z).shard_numel);
    StepWorkload accumulated = w;
    accumulated.grad_accum = 4;
    const double extra_s = step_cost(accumulated, z, StageEstimate{}, gpu).optimizer_s -
                           step_cost(w, z, StageEstimate{}, gpu).optimizer_s;
    EXPECT_NEAR(extra_s, stepped * 8 * 3 / gpu.host_device_bytes_per_s, 1e-9 * extra_s);
    EXPECT_EQ(step_cost(accumulated, z, StageEstimate{}, host).optimizer_s,
              step_cost(w, z, StageEstimate{}, host).optimizer_s);
  }
  // Parameters on NVMe: with a host link slower than the disk, the link bounds their reads.
  {
    train::TrainConfig cfg;
    cfg.zero_stage = 3;
    cfg.offload_param = "nvme";
    ZeroConfig z = train::zero_config(cfg, DType::bf16, numels, 1);
    z.prefetch_numel = 1;  // exposed reads
    StageEstimate e;
    e.model_state.placed.at(MemPlace::nvme, MemCategory::param) = int64_t{1} << 30;
    MachineSpeed slow_link = gpu;
    slow_link.disk_bytes_per_s = 8 * slow_link.host_device_bytes_per_s;
    MachineSpeed fast_link = slow_link;
    fast_link.host_device_bytes_per_s = 4 * slow_link.disk_bytes_per_s;
    EXPECT_GT(step_cost(w, z, e, slow_link).total_s, step_cost(w, z, e, fast_link).total_s);
    EXPECT_EQ(step_cost(w, z, e, host).total_s, step_cost(w, z, e, [&] {
                MachineSpeed h = host;
                h.host_device_bytes_per_s /= 100;  // unified: the link plays no part
                return h;
              }()).total_s);
  }
  StepCost copies_bound;
  copies_bound.compute_s = 1;
  copies_bound.transfer_s = 2;
  EXPECT_EQ(copies_bound.bottleneck(), "transfer");
}

class DeviceSpeedsTest : public ::testing::TestWithParam<kernels::DeviceKind> {};

TEST_P(DeviceSpeedsTest, AreMeasuredThroughTheBackend) {
  // Note [Device speeds]: measure_device_speeds reaches the device only through its backend (on
  // sim, a host access to device memory would be a fault); on a GPU the figures are a GPU's.
  const std::vector<kernels::DeviceKind> here = kernels::available_devices();
  if (std::find(here.begin(), here.end(), GetParam()) == here.end()) GTEST_SKIP() << "no such device here";
  const bool gpu = GetParam() == kernels::DeviceKind::cuda;
  const train::DeviceSpeeds s = train::measure_device_speeds(kernels::backend(GetParam()), DType::bf16, gpu ? 8192 : 96,
                                                             gpu ? size_t{256} << 20 : size_t{1} << 20);
  for (double v : {s.gemm_flop_per_s, s.memory_bytes_per_s, s.host_device_bytes_per_s}) {
    EXPECT_GT(v, 0);
    EXPECT_TRUE(std::isfinite(v));
  }
  if (gpu) {
    // Any GPU the CUDA backend is built for (sm_80, sm_90) is far above these.
    EXPECT_GT(s.gemm_flop_per_s, 50e12);
    EXPECT_GT(s.memory_bytes_per_s, 500e9);
    EXPECT_GT(s.host_device_bytes_per_s, 4e9);
    std::printf("GPU speeds: GEMM %.1f TFLOP/s, memory %.0f GB/s, host link %.1f GB/s\n", s.gemm_flop_per_s / 1e12,
                s.memory_bytes_per_s / 1e9, s.host_device_bytes_per_s / 1e9);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceSpeedsTest,
                         ::testing::Values(kernels::DeviceKind::cpu, kernels::DeviceKind::sim, kernels::DeviceKind::cuda),
                         [](const ::testing::TestParamInfo<kernels::DeviceKind>& info) {
                           return std::string(kernels::device_kind_name(info.param));
                         });

}  // namespace
}  // namespace zerone::zero
