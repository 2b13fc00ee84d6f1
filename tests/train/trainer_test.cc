#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "zerone/io/llmc_checkpoint.h"
#include "zerone/io/token_shards.h"
#include "zerone/train/markov_source.h"
#include "zerone/train/metrics.h"
#include "zerone/train/plan.h"
#include "zerone/zero/estimate.h"
#include "zerone/train/trainer.h"

namespace zerone::train {
namespace {

// The summary's split of the steps' time (Note [Exposed time], Note [Device compute itemized]):
// measured compute and "other" on a device that runs kernels on the host; "device compute and
// launches" as the rest on a GPU; the GPU's measured compute and "launches and gaps" under
// --profile there.
TEST(RunSummary, TimeOfStepsNamesWhatTheRestIs) {
  const auto time_line = [](bool compute_is_remainder, const std::string& remainder_name) {
    RunSummary summary;
    for (int step = 1; step <= 3; ++step) {
      StepRecord record;
      record.step = step;
      record.ms = 100.0;
      record.tokens_per_s = 1000.0;
      record.seen = 100 * step;
      summary.add(record);
    }
    summary.profiled_steps = 2;
    summary.profiled_wall_s = 0.2;
    summary.compute_s = 0.15;
    summary.optimizer_s = 0.02;
    summary.compute_is_remainder = compute_is_remainder;
    summary.remainder_name = remainder_name;
    for (const std::string& line : summary.lines())
      if (line.rfind("  time of steps", 0) == 0) return line;
    return std::string();
  };
  const std::string host = time_line(false, "other");
  EXPECT_NE(host.find("time of steps 2..3: compute 75.0%"), std::string::npos) << host;
  EXPECT_NE(host.find(", other 15.0% "), std::string::npos) << host;
  const std::string gpu = time_line(true, "other");
  EXPECT_NE(gpu.find("time of steps 2..3: device compute and launches 90.0% (the rest"), std::string::npos) << gpu;
  EXPECT_EQ(gpu.find("other"), std::string::npos) << gpu;
  const std::string itemized = time_line(false, "launches and gaps");
  EXPECT_NE(itemized.find("time of steps 2..3: compute 75.0%"), std::string::npos) << itemized;
  EXPECT_NE(itemized.find(", launches and gaps 15.0% "), std::string::npos) << itemized;
  EXPECT_EQ(itemized.find("other"), std::string::npos) << itemized;
}

using zerone::testing::expect_error;
using zerone::testing::TempDir;

TrainConfig tiny(const TempDir& dir) {
  io::write_token_shard(dir.file("train.bin"), MarkovSource(5).generate(20000, 1));
  io::write_token_shard(dir.file("val.bin"), MarkovSource(5).generate(4000, 2));
  TrainConfig c;
  c.model = "gpt2:layers=2,dim=32,heads=2,vocab=257,ctx=32";
  c.data = dir.file("train.bin");
  c.val_data = dir.file("val.bin");
  c.micro_batch = 4;
  c.seq = 16;
  c.steps = 30;
  c.lr = 3e-3f;
  c.precision = "fp32";
  c.given = {"--model", "--data", "--steps"};
  return c;
}

// The trainer's runs on every device (tests/test_util.h): the run's --device is the parameter; the
// scope gives the process the cpu device back after it.
class TrainerOn : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  TrainConfig tiny_here(const TempDir& dir) {
    TrainConfig c = tiny(dir);
    c.device = kernels::device_kind_name(GetParam());
    return c;
  }
  zerone::testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, TrainerOn, zerone::testing::every_device(), zerone::testing::device_test_name);

TEST_P(TrainerOn, LearnsAndWritesMetricsPerStep) {
  TempDir dir;
  TrainConfig c = tiny_here(dir);
  c.metrics = dir.file("m.jsonl");
  TrainResult r = run_training(c);
  ASSERT_TRUE(r.final_val_loss.has_value());
  EXPECT_LT(*r.final_val_loss, 4.5f) << "starts near ln(257) = 5.55";
  std::ifstream in(c.metrics);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"], lines + 1);
    for (const char* key : {"loss", "lr", "grad_norm", "ms", "tokens_per_s", "mem"}) EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_GT(j["mem"]["device.param"].get<int64_t>(), 0);
    EXPECT_GT(j["mem"]["device.optim"].get<int64_t>(), 0);
    EXPECT_GT(j["mem"]["peak_rss"].get<int64_t>(), 0);
  }
  EXPECT_EQ(lines, 30);
}

TEST_P(TrainerOn, SameSeedSameTrajectoryAndResumeFromSavedModel) {
  TempDir dir;
  TrainConfig c = tiny_here(dir);
  c.steps = 5;
  c.save = dir.file("out.bin");
  TrainResult a = run_training(c);
  c.save.clear();
  TrainResult b = run_training(c);
  EXPECT_EQ(a.final_train_loss, b.final_train_loss) << "runs are deterministic";
  // --init takes the shape from the file; training continues from the saved weights.
  TrainConfig from = tiny_here(dir);
  from.model.clear();
  from.given.erase("--model");
  from.init = dir.file("out.bin");
  from.steps = 1;
  TrainResult r = run_training(from);
  EXPECT_LT(r.final_train_loss, 5.0f);
}

TEST(TrainerDevices, SimGivesTheCpuDevicesBits) {
  // The same run on both devices: the same loss at every step, the same saved weights.
  TempDir dir;
  std::vector<std::string> losses;
  std::vector<std::vector<char>> weights;
  for (const char* device : {"cpu", "sim"}) {
    zerone::testing::DeviceScope scope(kernels::DeviceKind::cpu);  // the cpu device again after the run
    TrainConfig c = tiny(dir);
    c.device = device;
    c.steps = 5;
    c.precision = "bf16";
    c.metrics = dir.file(std::string(device) + ".jsonl");
    c.save = dir.file(std::string(device) + ".bin");
    run_training(c);
    std::string trajectory;
    std::ifstream in(c.metrics);
    for (std::string line; std::getline(in, line);) trajectory += nlohmann::json::parse(line)["loss"].dump() + " ";
    losses.push_back(trajectory);
    weights.push_back(zerone::testing::read_bytes(c.save));
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_FALSE(weights[0].empty());
  EXPECT_TRUE(weights[0] == weights[1]) << "saved weights differ";
}

TEST(Trainer, BadInputsAreClearErrors) {
  TempDir dir;
  TrainConfig c = tiny(dir);
  c.seq = 64;  // > ctx 32
  expect_error([&] { run_training(c); }, "exceeds the model's context length");
  c = tiny(dir);
  c.model = "gpt2:layers=2,dim=32,heads=2,vocab=100,ctx=32";  // bytes >= 100 in the data
  expect_error([&] { run_training(c); }, "out of range for the model's vocabulary of 100");
  c = tiny(dir);
  c.data = dir.file("nothing_*.bin");
  expect_error([&] { run_training(c); }, "no file matches");
  c = tiny(dir);
  io::write_token_shard(dir.file("m.bin"), std::vector<int32_t>(10, 1));
  c.init = dir.file("m.bin");  // a token shard is not a checkpoint
  expect_error([&] { run_training(c); }, "not an llm.c GPT-2 checkpoint");
}

TEST(MarkovSource, EntropyMatchesEmpiricalCrossEntropyOfTheTrueModel) {
  // Order-1 chain: the empirical conditional entropy of a long sample approaches H.
  MarkovSource s(42);
  auto t = s.generate(400000, 9);
  std::vector<double> counts(256 * 256, 0.0), totals(256, 0.0);
  for (size_t i = 1; i < t.size(); ++i) counts[t[i - 1] * 256 + t[i]] += 1, totals[t[i - 1]] += 1;
  double h = 0;
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256; ++b)
      if (counts[a * 256 + b] > 0) h -= counts[a * 256 + b] / (t.size() - 1) * std::log(counts[a * 256 + b] / totals[a]);
  EXPECT_NEAR(h, s.entropy_rate(), 0.01);
}

}  // namespace
}  // namespace zerone::train

namespace zerone::train {
namespace {

class TrainerFp16On : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  zerone::testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, TrainerFp16On, zerone::testing::every_device(), zerone::testing::device_test_name);

TEST_P(TrainerFp16On, OverflowSkipsStepsLowersTheScaleThenLearns) {
  // A loss scale of 2^40 makes the scaled output gradients overflow fp16 (max 65504): those steps
  // must be skipped (parameters untouched, "skipped" in the metrics) and the scale must fall, by
  // half per overflow once the hysteresis (2) is used up, until training proceeds.
  TempDir dir;
  TrainConfig c = tiny(dir);
  c.device = kernels::device_kind_name(GetParam());
  c.precision = "fp16";
  c.initial_scale_power = 40;
  c.steps = 40;
  c.metrics = dir.file("m.jsonl");
  TrainResult r = run_training(c);
  std::ifstream in(c.metrics);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 40u);
  EXPECT_TRUE(lines[0].value("skipped", false));
  EXPECT_EQ(lines[0]["loss_scale"].get<double>(), std::ldexp(1.0, 40));
  EXPECT_EQ(lines[1]["loss_scale"].get<double>(), std::ldexp(1.0, 40)) << "hysteresis absorbs the first overflow";
  EXPECT_EQ(lines[2]["loss_scale"].get<double>(), std::ldexp(1.0, 39));
  int skipped = 0;
  for (auto& l : lines) skipped += l.value("skipped", false);
  EXPECT_GE(skipped, 3);
  EXPECT_LT(skipped, 30);
  EXPECT_FALSE(lines.back().value("skipped", false));
  EXPECT_LT(lines.back()["loss_scale"].get<double>(), std::ldexp(1.0, 30));
  ASSERT_TRUE(r.final_val_loss.has_value());
  EXPECT_LT(*r.final_val_loss, 5.0f) << "learns once the scale fits";
}

// Note [Attention's saved state]: the one rule, for backends and shape models alike.
TEST(DeviceMemory, AttentionSavedIsAFunctionOfDeviceAndOptions) {
  using kernels::AttentionSaved;
  using kernels::CudaAttention;
  using kernels::DeviceKind;
  const kernels::DeviceOptions flash{.cuda_attention = CudaAttention::flash}, plain{.cuda_attention = CudaAttention::plain};
  EXPECT_EQ(kernels::attention_saved(DeviceKind::cuda, flash), AttentionSaved::logsumexp);
  EXPECT_EQ(kernels::attention_saved(DeviceKind::cuda, plain), AttentionSaved::probabilities);
  for (DeviceKind d : {DeviceKind::cpu, DeviceKind::sim})
    for (const auto& o : {flash, plain}) EXPECT_EQ(kernels::attention_saved(d, o), AttentionSaved::probabilities);
  for (DeviceKind d : {DeviceKind::cpu, DeviceKind::sim})
    EXPECT_EQ(kernels::backend(d).attention_saved(), kernels::attention_saved(d, kernels::backend(d).device_options()));
}

// The estimate for a cuda run counts flash attention's (B, NH, T) logsumexp where plain (and cpu)
// count (B, NH, T, T) probabilities: L * B * NH * T * (T - 1) floats fewer, per checkpointing slot.
TEST(DeviceMemory, EstimateCountsTheRunDevicesAttention) {
  const int B = 3, T = 24, NH = 4, L = 3;
  for (const char* spec : {"gpt2:layers=3,dim=32,heads=4,vocab=257,ctx=32",
                           "llama:layers=3,dim=32,heads=4,kv_heads=2,ffn=64,vocab=257,ctx=32"})
    for (bool ckpt : {false, true}) {
      TrainConfig cfg;
      cfg.model = spec;
      cfg.device = "cuda";
      auto activations = [&](const char* attention) {
        cfg.cuda_attention = attention;
        auto shape = nn::make_model(spec, DType::f32, 64, /*allocate=*/false);
        shape->set_activation_checkpointing(ckpt);
        count_for_run_device(*shape, cfg);
        const zero::ZeroConfig z = zero_config(cfg, DType::f32, shape->unit_numels(), 1);
        return zero::estimate(*shape, 1, DType::f32, B, T, z, optimizer_options(cfg), 0)[0].activations;
      };
      const int64_t slots = ckpt ? 1 : L;
      const auto cpu = nn::make_model(spec, DType::f32, 64, false);  // this process's device: cpu
      cpu->set_activation_checkpointing(ckpt);
      EXPECT_EQ(activations("plain"), static_cast<int64_t>(cpu->activation_bytes(B, T))) << spec;
      EXPECT_EQ(activations("plain") - activations("flash"), slots * B * NH * T * (T - 1) * 4) << spec;
    }
}

// Note [Device budget]: cpu and sim are capped by --device-mem-limit alone; cuda by the GPU's usable
// memory too (Note [Device memory the ledger cannot see]).
TEST(DeviceMemory, DeviceBudget) {
  using kernels::DeviceKind;
  constexpr int64_t GiB = int64_t{1} << 30;
  const kernels::DeviceMemory gpu{80 * GiB, 79 * GiB};
  EXPECT_EQ(device_budget(DeviceKind::cpu, 0, std::nullopt).bytes, 0);
  EXPECT_EQ(device_budget(DeviceKind::sim, 2, gpu).bytes, 2 * GiB) << "sim's device is host memory";
  const DeviceBudget measured = device_budget(DeviceKind::cuda, 0, gpu);
  EXPECT_EQ(measured.bytes, 79 * GiB) << "cuBLASLt's workspace is in the estimate's backend scratch";
  EXPECT_NE(measured.source.find("the GPU's"), std::string::npos) << measured.source;
  const DeviceBudget before = device_budget(DeviceKind::cuda, 0, kernels::DeviceMemory::before_context(80 * GiB));
  EXPECT_EQ(before.bytes, 80 * GiB - kernels::kCudaContextReserveBytes);
  EXPECT_NE(before.source.find("CUDA context"), std::string::npos) << before.source;
  EXPECT_EQ(device_budget(DeviceKind::cuda, 2, gpu).bytes, 2 * GiB) << "the smaller: the limit";
  EXPECT_EQ(device_budget(DeviceKind::cuda, 100, gpu).bytes, measured.bytes) << "the smaller: the GPU";
  EXPECT_EQ(device_budget(DeviceKind::cuda, 2, std::nullopt).bytes, 2 * GiB) << "no GPU here: the limit alone";
  EXPECT_EQ(device_budget(DeviceKind::cuda, 0, std::nullopt).bytes, 0);
  EXPECT_EQ(device_budget(DeviceKind::cuda, 0, kernels::DeviceMemory{GiB, 0}).bytes, 1) << "a full GPU still caps";
}

// The start-up check's cuda branch, with the GPU's memory given as data: a model that cannot fit
// the GPU is refused naming the bytes needed and the GPU's; one that fits passes (its host bytes
// alone are checked against the host).
TEST(DeviceMemory, StartupCheckReadsTheGpu) {
  TrainConfig cfg;
  cfg.model = "gpt2:layers=2,dim=64,heads=4,vocab=257,ctx=64";
  cfg.device = "cuda";
  cfg.micro_batch = 4;
  cfg.seq = 64;
  cfg.precision = "fp32";
  auto shape = nn::make_model(cfg.model, DType::f32, 64, /*allocate=*/false);
  count_for_run_device(*shape, cfg);
  const zero::ZeroConfig z = zero_config(cfg, DType::f32, shape->unit_numels(), 1);
  const int64_t need =
      zero::estimate(*shape, 1, DType::f32, cfg.micro_batch, cfg.seq, z, optimizer_options(cfg), 0)[0].device();
  const int64_t usable_free = need;  // exactly enough (the backend's scratch is in `need`)
  const kernels::DeviceKind cuda = kernels::DeviceKind::cuda;
  EXPECT_NO_THROW(check_memory_fits(*shape, DType::f32, cfg, z, 1, cuda, kernels::DeviceMemory{int64_t{1} << 34, usable_free}, zero::CollectiveRoute::direct));
  expect_error([&] { check_memory_fits(*shape, DType::f32, cfg, z, 1, cuda, kernels::DeviceMemory{int64_t{1} << 34, usable_free - 1}, zero::CollectiveRoute::direct); },
               "of cuda device memory per rank, over the GPU's");
  // The limit still names itself when it is the smaller cap.
  cfg.device_mem_limit = 0.0001;
  expect_error([&] { check_memory_fits(*shape, DType::f32, cfg, z, 1, cuda, kernels::DeviceMemory{int64_t{1} << 34, usable_free}, zero::CollectiveRoute::direct); },
               "over --device-mem-limit 0.0001 GiB");
}

}  // namespace
}  // namespace zerone::train
