// The planner (zero/planner.h): for GPT-2 124M..13B and LLaMA 1B..8B shapes at world 1, 2 and 4
// under several budgets, the chosen plan fits by the estimate (recomputed here from the choice
// alone), and a budget a few percent below its need is refused or gets another plan that fits it.
#include <gtest/gtest.h>

#include "zerone/comm/comm_choice.h"
#include "zerone/core/error.h"
#include "zerone/nn/model.h"
#include "zerone/train/config.h"
#include "zerone/train/plan.h"
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

}  // namespace
}  // namespace zerone::zero
