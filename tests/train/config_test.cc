#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "tests/test_util.h"
#include "zerone/train/config.h"

namespace zerone::train {
namespace {

using zerone::testing::expect_error;
using zerone::testing::TempDir;
using zerone::testing::write_text;
using zerone::testing::write_bytes;

// docs/CONFIG.md's "Every DeepSpeed key, by treatment" is kDeepSpeedKeys: each key is listed on the
// line of its treatment and no other.
TEST(Config, DocumentedDeepSpeedKeysAreTheTable) {
  std::ifstream doc(std::string(ZERONE_SOURCE_DIR) + "/docs/CONFIG.md");
  ASSERT_TRUE(doc) << "docs/CONFIG.md";
  std::map<DeepSpeedKeyTreatment, std::string> line_of;
  const std::pair<const char*, DeepSpeedKeyTreatment> headings[] = {
      {"- **Honoured", DeepSpeedKeyTreatment::honoured},
      {"- **Notice", DeepSpeedKeyTreatment::notice},
      {"- **True: honoured", DeepSpeedKeyTreatment::always_on},
      {"- **Off, disabled or 0", DeepSpeedKeyTreatment::error_when_on},
      {"- **Error", DeepSpeedKeyTreatment::error},
  };
  for (std::string line; std::getline(doc, line);)
    for (const auto& [prefix, treatment] : headings)
      if (line.rfind(prefix, 0) == 0) line_of[treatment] = line;
  ASSERT_EQ(line_of.size(), std::size(headings)) << "a treatment's list is missing from docs/CONFIG.md";
  for (const DeepSpeedKey& k : deepspeed_keys())
    for (const auto& [treatment, line] : line_of) {
      const bool listed = line.find("`" + std::string(k.path) + "`") != std::string::npos;
      EXPECT_EQ(listed, treatment == k.treatment) << k.path << (listed ? " is listed under another treatment"
                                                                        : " is not listed under its treatment");
    }
}

TEST(Config, DeepSpeedKeysFillTheConfigAndFlagsWin) {
  TempDir dir;
  write_text(dir.file("ds.json"), R"({
    "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
    "bf16": {"enabled": false}, "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
    "loss_scale_window": 500, "hysteresis": 3, "min_loss_scale": 2}, "steps_per_print": 10,
    "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 50}},
    "zero_optimization": {"stage": 0},
    "model": "gpt2:layers=2", "steps": 7 })");
  TrainConfig c;
  c.micro_batch = 2;
  c.given.insert("--micro-batch");  // given on the command line: the file must not override it
  apply_json_config(dir.file("ds.json"), c);
  EXPECT_EQ(c.micro_batch, 2);
  EXPECT_EQ(c.grad_accum, 4);
  EXPECT_FLOAT_EQ(c.grad_clip, 1.0f);
  EXPECT_EQ(c.precision, "fp16");
  EXPECT_EQ(c.initial_scale_power, 12);
  EXPECT_EQ(c.loss_scale_window, 500);
  EXPECT_EQ(c.hysteresis, 3);
  EXPECT_EQ(c.min_loss_scale, 2.0);
  EXPECT_FLOAT_EQ(c.lr, 6e-4f);
  EXPECT_FLOAT_EQ(c.beta1, 0.8f);
  EXPECT_FLOAT_EQ(c.beta2, 0.95f);
  EXPECT_FLOAT_EQ(c.weight_decay, 0.1f);
  EXPECT_EQ(c.warmup, 50);
  EXPECT_EQ(c.lr_schedule, "warmup-lr");
  EXPECT_EQ(c.model, "gpt2:layers=2");
  EXPECT_EQ(c.steps, 7);
  EXPECT_TRUE(c.is_given("--lr"));
  validate(c);
}

TEST(Config, BrokenFilesNameTheProblem) {
  TempDir dir;
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("missing.json"), c); }, "--config: cannot open");
  write_text(dir.file("bad.json"), "{\"steps\": 3,");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("bad.json"), c); }, "not valid JSON");
  write_text(dir.file("unknown.json"), "{\"stpes\": 3}");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("unknown.json"), c); }, "key 'stpes' is unknown");
  write_text(dir.file("type.json"), "{\"steps\": \"many\"}");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("type.json"), c); }, "expected an integer");
  write_text(dir.file("opt.json"), "{\"optimizer\": {\"type\": \"Lion\"}}");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("opt.json"), c); },
               "key 'optimizer.type' is \"Lion\": optimizer Lion (zerone has Adam, AdamW and SGD) is not implemented");
}

TEST(Config, DeepSpeedSgd) {
  // DeepSpeed hands SGD's params to torch.optim.SGD (issue 11).
  TempDir dir;
  write_text(dir.file("sgd.json"), R"({"optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9,
      "dampening": 0.1, "weight_decay": 5e-4, "nesterov": false}}, "epochs": 3})");
  TrainConfig c;
  apply_json_config(dir.file("sgd.json"), c);
  EXPECT_EQ(c.optimizer, "sgd");
  EXPECT_FLOAT_EQ(c.lr, 0.05f);
  EXPECT_FLOAT_EQ(c.momentum, 0.9f);
  EXPECT_FLOAT_EQ(c.dampening, 0.1f);
  EXPECT_FLOAT_EQ(c.weight_decay, 5e-4f);
  EXPECT_FALSE(c.nesterov);
  EXPECT_EQ(c.epochs, 3);
  validate(c);
  // The command line wins over the file.
  TrainConfig flags;
  flags.optimizer = "adamw";
  flags.given.insert("--optimizer");
  write_text(dir.file("sgd2.json"), R"({"optimizer": {"type": "sgd", "params": {"momentum": 0.5}}})");
  apply_json_config(dir.file("sgd2.json"), flags);
  EXPECT_EQ(flags.optimizer, "adamw");
  expect_error([&] { validate(flags); }, "key 'optimizer.params.momentum' applies to --optimizer sgd");
  write_text(dir.file("nesterov.json"), R"({"optimizer": {"type": "SGD", "params": {"nesterov": true, "dampening": 0.5, "momentum": 0.9}}})");
  expect_error([&] { TrainConfig n; apply_json_config(dir.file("nesterov.json"), n); validate(n); },
               "needs a momentum above 0 and zero dampening");
}

// A config file written to a temporary directory and read into a fresh TrainConfig (with `flags`
// given on the command line first).
TrainConfig read_config(const std::string& text, std::function<void(TrainConfig&)> flags = nullptr) {
  TempDir dir;
  write_text(dir.file("c.json"), text);
  TrainConfig c;
  if (flags) flags(c);
  apply_json_config(dir.file("c.json"), c);
  return c;
}
void expect_config_error(const std::string& text, const std::string& needle) {
  expect_error([&] { read_config(text); }, needle);
}

TEST(Config, ExplicitPrecisionIsObeyedAndContradictionsAreErrors) {
  // bf16.enabled false alone is fp32, not zerone's default (bf16 where the CPU has it).
  EXPECT_EQ(read_config(R"({"bf16": {"enabled": false}})").precision, "fp32");
  EXPECT_EQ(read_config(R"({"fp16": {"enabled": false}})").precision, "fp32");
  EXPECT_EQ(read_config(R"({"bf16": {"enabled": false}, "fp16": {"enabled": true}})").precision, "fp16");
  EXPECT_EQ(read_config(R"({"bfloat16": {"enabled": true}})").precision, "bf16");  // DeepSpeed's old name
  EXPECT_EQ(read_config(R"({"fp16": {"loss_scale": 0}})").precision, "fp32");    // enabled defaults to false
  // "auto" and no block at all leave zerone's default.
  EXPECT_EQ(read_config(R"({"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}})").precision, "");
  EXPECT_FALSE(read_config(R"({"bf16": {"enabled": "auto"}})").is_given("--precision"));
  EXPECT_EQ(read_config("{}").precision, "");
  // The command line wins.
  TrainConfig flagged = read_config(R"({"bf16": {"enabled": false}})", [](TrainConfig& c) {
    c.precision = "bf16";
    c.given.insert("--precision");
  });
  EXPECT_EQ(flagged.precision, "bf16");
  expect_config_error(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})",
                      "bf16.enabled and fp16.enabled are both true");
  expect_config_error(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})", "key 'bfloat16' repeats 'bf16'");
  expect_config_error(R"({"precision": "bf16", "bf16": {"enabled": false}})", "but the bf16 block says fp32");
  expect_config_error(R"({"bf16": {"enabled": 1}})", "key 'bf16.enabled' is 1, expected true or false");
}

TEST(Config, NumbersAreRangeCheckedNotWrapped) {
  expect_config_error(R"({"steps": 4294967298})", "key 'steps' is 4294967298, expected an integer in 1..100000000");
  expect_config_error(R"({"train_micro_batch_size_per_gpu": 4294967298})",
                      "key 'train_micro_batch_size_per_gpu' is 4294967298, expected an integer in 1..65536");
  expect_config_error(R"({"train_micro_batch_size_per_gpu": 2.7})", "is 2.7, expected an integer");
  expect_config_error(R"({"gradient_accumulation_steps": true})", "key 'gradient_accumulation_steps' is true");
  expect_config_error(R"({"optimizer": {"type": "AdamW", "params": {"lr": true}}})",
                      "key 'optimizer.params.lr' is true, expected a number in (0, 10]");
  expect_config_error(R"({"optimizer": {"type": "AdamW", "params": {"lr": "0.1"}}})", "key 'optimizer.params.lr' is \"0.1\"");
  expect_config_error(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.5]}}})",
                      "key 'optimizer.params.betas[1]' is 1.5, expected a number in [0, 1)");
  expect_config_error(R"({"seed": -1})", "key 'seed' is -1, expected an integer in 0..");
  expect_config_error(R"({"zero_optimization": {"stage": 5}})", "key 'zero_optimization.stage' is 5, expected an integer in 0..3");
  expect_config_error(R"({"zero_optimization": {"reduce_bucket_size": 1e12}})", "key 'zero_optimization.reduce_bucket_size'");
  expect_config_error(R"({"gradient_clipping": "lots"})", "key 'gradient_clipping' is \"lots\", expected a number >= 0");
  expect_config_error(R"({"train_batch_size": 0})", "key 'train_batch_size' is 0, expected an integer in 1..");
  // Integral floats are integers (DeepSpeed's examples write bucket sizes as 5e8).
  TrainConfig c = read_config(R"({"zero_optimization": {"reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8},
                                  "steps": 7.0, "seed": 18446744073709551615})");
  EXPECT_EQ(c.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.allgather_bucket_size, 200000000);
  EXPECT_EQ(c.steps, 7);
  EXPECT_EQ(c.seed, 18446744073709551615ull);
}

TEST(Config, AutoLeavesTheFlagOrDefault) {
  // Hugging Face Trainer's zero3 template with device "none".
  const std::string hf = R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none", "pin_memory": true},
      "offload_param": {"device": "none", "pin_memory": true}, "overlap_comm": true, "contiguous_gradients": true,
      "sub_group_size": 1e9, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
      "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false})";
  TrainConfig c = read_config(hf, [](TrainConfig& f) {
    f.lr = 2e-3f;
    f.given.insert("--lr");
  });
  TrainConfig defaults;
  EXPECT_FLOAT_EQ(c.lr, 2e-3f);  // warmup_max_lr and lr "auto": the flag
  EXPECT_EQ(c.micro_batch, defaults.micro_batch);
  EXPECT_EQ(c.grad_accum, defaults.grad_accum);
  EXPECT_EQ(c.train_batch_size, 0);
  EXPECT_EQ(c.warmup, defaults.warmup);
  EXPECT_EQ(c.warmup_min_lr, 0.0f);
  EXPECT_EQ(c.precision, "");
  EXPECT_EQ(c.reduce_bucket_size, defaults.reduce_bucket_size);
  EXPECT_EQ(c.zero_stage, 3);
  EXPECT_EQ(c.lr_schedule, "warmup-lr");
  EXPECT_FALSE(c.is_given("--micro-batch"));
  EXPECT_FALSE(c.is_given("--warmup"));
  ASSERT_EQ(c.notices.size(), 1u);
  EXPECT_EQ(c.notices[0],
            "config keys with no effect here: steps_per_print, wall_clock_breakdown, "
            "zero_optimization.stage3_max_live_parameters, "
            "zero_optimization.stage3_max_reuse_distance");
  validate(c);
}

TEST(Config, KeysThatWouldChangeResultsAreErrorsNamingTheKey) {
  expect_config_error(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 1.5}}})",
                      "key 'zero_optimization.offload_optimizer.ratio' is 1.5, expected a number in [0, 1]");
  expect_config_error(R"({"zero_optimization": {"offload_param": {"device": "gpu"}}})", "expected \"none\", \"cpu\" or \"nvme\"");
  expect_config_error(R"({"zero_optimization": {"load_from_fp32_weights": false}})",
                      "key 'zero_optimization.load_from_fp32_weights' is false: resuming the master weights");
  expect_config_error(R"({"zero_optimization": {"cpu_offload": true, "offload_optimizer": {"device": "nvme"}}})",
                      "key 'zero_optimization.cpu_offload' is true, but zero_optimization.offload_optimizer.device is \"nvme\"");
  expect_config_error(R"({"zero_optimization": {"zero_quantized_nontrainable_weights": true}})",
                      "zero_quantized_nontrainable_weights");
  expect_config_error(R"({"elasticity": {"enabled": true, "max_train_batch_size": 64}})", "key 'elasticity.enabled' is true");
  expect_config_error(R"({"communication_data_type": "fp16"})", "key 'communication_data_type' is \"fp16\"");
  expect_config_error(R"({"data_types": {"grad_accum_dtype": "bf16"}})", "key 'data_types.grad_accum_dtype' is \"bf16\"");
  expect_config_error(R"({"fp16": {"enabled": true, "consecutive_hysteresis": true}})", "fp16.consecutive_hysteresis");
  expect_config_error(R"({"scheduler": {"type": "OneCycle", "params": {}}})",
                      "key 'scheduler.type' is \"OneCycle\": the OneCycle schedule is not implemented");
  expect_config_error(R"({"scheduler": {"type": "StepLR"}})", "key 'scheduler.type' is \"StepLR\", expected WarmupLR");
  expect_config_error(R"({"scheduler": {"params": {"warmup_num_steps": 5}}})", "key 'scheduler' has no 'type'");
  expect_config_error(R"({"scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 5}}})",
                      "key 'scheduler.params.total_num_steps' is not a parameter of WarmupLR");
  expect_config_error(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}}})",
                      "has no total_num_steps, which WarmupDecayLR requires");
  expect_config_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cubic"}}})",
                      "key 'scheduler.params.warmup_type' is \"cubic\", expected \"log\" or \"linear\"");
  expect_config_error(R"({"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 99}}})",
                      "last_batch_iteration");
  expect_config_error(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "weight_decay": 0.1}}})",
                      "Adam with L2 regularisation");
  expect_config_error(R"({"optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}})",
                      "key 'optimizer.params.max_grad_norm' is not an optimizer parameter in DeepSpeed: use the top-level key gradient_clipping");
  expect_config_error(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": true}}})", "AMSGrad");
  expect_config_error(R"({"sparse_attention": {"mode": "fixed"}})", "key 'sparse_attention'");
  // Harmless versions of the same keys are accepted and listed.
  TrainConfig c = read_config(R"({"zero_optimization": {"offload_optimizer": {"device": "none"}, "cpu_offload": false,
      "overlap_comm": false}, "activation_checkpointing": {"partition_activations": false},
      "aio": {"block_size": 1048576}, "elasticity": {"enabled": false}, "communication_data_type": "fp32",
      "optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "weight_decay": 0}}})");
  ASSERT_EQ(c.notices.size(), 1u);
  EXPECT_TRUE(c.activation_checkpointing);  // the block turns it on
  EXPECT_EQ(c.aio_block_size, 1048576);
  EXPECT_NE(c.notices[0].find("zero_optimization.overlap_comm false (zerone always does this)"), std::string::npos);
}

TEST(Config, DeepSpeedsOldOffloadNamesAreHonoured) {
  TrainConfig c = read_config(R"({"zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_params": true}})");
  EXPECT_EQ(c.offload_optimizer, "cpu");
  EXPECT_EQ(c.offload_param, "cpu");
  TrainConfig d = read_config(R"({"hybrid_engine": {"enabled": false}, "graph_harvesting": false,
      "use_data_before_expert_parallelism": false, "zero_optimization": {"load_from_fp32_weights": true}})");
  ASSERT_EQ(d.notices.size(), 1u);
  EXPECT_NE(d.notices[0].find("graph_harvesting"), std::string::npos);
  EXPECT_NE(d.notices[0].find("hybrid_engine"), std::string::npos);
}

TEST(Config, DeepSpeedOptimizerAndSchedulerMeanWhatTheyMeanThere) {
  // Absent params take DeepSpeed's defaults (FusedAdam's lr 1e-3).
  EXPECT_FLOAT_EQ(read_config(R"({"optimizer": {"type": "adam"}})").lr, 1e-3f);
  EXPECT_FLOAT_EQ(read_config(R"({"optimizer": {"type": "AdamW", "params": {"torch_adam": true}}})").weight_decay, 0.01f);
  // WarmupDecayLR's warmup_max_lr replaces the optimizer's lr; absent, it is DeepSpeed's 1e-3.
  TrainConfig d = read_config(R"({"optimizer": {"type": "Adam", "params": {"lr": 5e-4}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_min_lr": 1e-5,
                    "warmup_max_lr": 2e-4, "warmup_num_steps": 10, "warmup_type": "linear"}}})");
  EXPECT_EQ(d.lr_schedule, "warmup-decay");
  EXPECT_FLOAT_EQ(d.lr, 2e-4f);
  EXPECT_FLOAT_EQ(d.warmup_min_lr, 1e-5f);
  EXPECT_EQ(d.warmup, 10);
  EXPECT_EQ(d.total_steps, 100);
  EXPECT_EQ(d.warmup_type, "linear");
  EXPECT_FLOAT_EQ(read_config(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 9}}})").lr, 1e-3f);
  TrainConfig w = read_config(R"({"scheduler": {"type": "WarmupLR"}})");
  EXPECT_EQ(w.warmup, 1000);  // DeepSpeed's default warmup_num_steps
  EXPECT_EQ(w.warmup_type, "log");
  TrainConfig cos = read_config(R"({"optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 50, "warmup_min_ratio": 0.1,
                    "cos_min_ratio": 0.01, "warmup_num_steps": 4}}})");
  EXPECT_EQ(cos.lr_schedule, "warmup-cosine");
  EXPECT_FLOAT_EQ(cos.lr, 3e-3f);
  EXPECT_FLOAT_EQ(cos.warmup_min_ratio, 0.1f);
  EXPECT_FLOAT_EQ(cos.min_lr_frac, 0.01f);
  // --lr-schedule on the command line replaces the file's scheduler block, with a notice.
  TrainConfig flagged = read_config(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 9}}})",
                                    [](TrainConfig& f) {
                                      f.lr_schedule = "cosine";
                                      f.given.insert("--lr-schedule");
                                    });
  EXPECT_EQ(flagged.lr_schedule, "cosine");
  EXPECT_EQ(flagged.warmup, 0);
  ASSERT_EQ(flagged.notices.size(), 1u);
  EXPECT_NE(flagged.notices[0].find("--lr-schedule cosine replaces the scheduler"), std::string::npos);
}

TEST(Config, TrainBatchSizeFollowsDeepSpeedsArithmetic) {
  auto resolved = [](int64_t total, std::optional<int> micro, std::optional<int> accum, int world) {
    TrainConfig c;
    c.train_batch_size = total;
    if (micro) c.micro_batch = *micro, c.given.insert("--micro-batch");
    if (accum) c.grad_accum = *accum, c.given.insert("--grad-accum");
    resolve_batch_sizes(c, world);
    return std::pair<int, int>(c.micro_batch, c.grad_accum);
  };
  EXPECT_EQ(resolved(32, 4, std::nullopt, 2), std::make_pair(4, 4));  // accumulation derived
  EXPECT_EQ(resolved(32, std::nullopt, 2, 2), std::make_pair(8, 2));  // micro-batch derived
  EXPECT_EQ(resolved(32, std::nullopt, std::nullopt, 4), std::make_pair(8, 1));  // neither: accumulation 1
  EXPECT_EQ(resolved(24, 3, 4, 2), std::make_pair(3, 4));  // all three agree
  expect_error([&] { resolved(10, 3, std::nullopt, 1); },
               "train_batch_size 10 is not micro-batch 3 x gradient accumulation 3 x world size 1 (= 9)");
  expect_error([&] { resolved(24, 3, 2, 2); }, "train_batch_size 24 is not micro-batch 3 x gradient accumulation 2 x world size 2 (= 12)");
  expect_error([&] { resolved(2, std::nullopt, std::nullopt, 4); }, "micro-batch 0");
  TrainConfig none;
  resolve_batch_sizes(none, 8);  // no train_batch_size: nothing to derive
  EXPECT_EQ(none.micro_batch, 4);
}

TEST(Config, SettingsThatWouldDoNothingAreErrorsOrNotices) {
  auto given = [](std::initializer_list<const char*> flags) {
    TrainConfig c;
    for (const char* f : flags) c.given.insert(f);
    return c;
  };
  TrainConfig frac = given({"--min-lr-frac"});
  expect_error([&] { check_settings_take_effect(frac, false, true); },
               "--min-lr-frac applies only to --lr-schedule cosine or warmup-cosine; this run's schedule is constant");
  TrainConfig total = given({"--total-steps"});
  total.lr_schedule = "warmup-lr";
  expect_error([&] { check_settings_take_effect(total, false, true); }, "--total-steps applies only to");
  TrainConfig val = given({"--val-every"});
  expect_error([&] { check_settings_take_effect(val, false, false); }, "--val-every has nothing to validate on");
  check_settings_take_effect(val, false, true);  // with validation data it is fine

  TrainConfig scale = given({"--loss-scale-window", "--hysteresis", "--stage3-prefetch-bucket-size"});
  check_settings_take_effect(scale, /*fp16=*/false, true);
  ASSERT_EQ(scale.notices.size(), 2u);
  EXPECT_EQ(scale.notices[0], "--loss-scale-window, --hysteresis: no effect, loss scaling applies to fp16 only");
  EXPECT_EQ(scale.notices[1], "--stage3-prefetch-bucket-size: no effect below ZeRO stage 3");
  TrainConfig fp16 = given({"--hysteresis", "--stage3-prefetch-bucket-size"});
  fp16.zero_stage = 3;
  check_settings_take_effect(fp16, /*fp16=*/true, true);
  EXPECT_TRUE(fp16.notices.empty());
  // --early-step asked for where the engine steps at the end anyway.
  TrainConfig early = given({"--early-step"});
  early.delayed_update = true;
  check_settings_take_effect(early, false, true);
  ASSERT_EQ(early.notices.size(), 1u);
  EXPECT_EQ(early.notices[0], "--early-step: no effect with --delayed-update (the update runs on its own thread); the "
                              "optimizer steps at the end, with the same results");
  // With clipping or fp16 loss scaling it speculates where state is on NVMe (Note [Speculative
  // early step]): no notice there; with the state in memory it steps at the end, and says so.
  TrainConfig early_clip = given({"--early-step"});
  early_clip.grad_clip = 1.0f;
  early_clip.offload_optimizer = "nvme";
  check_settings_take_effect(early_clip, false, true);
  EXPECT_TRUE(early_clip.notices.empty());
  TrainConfig early_fp16 = given({"--early-step"});
  early_fp16.offload_param = "nvme";
  check_settings_take_effect(early_fp16, /*fp16=*/true, true);
  EXPECT_TRUE(early_fp16.notices.empty());
  TrainConfig early_clip_memory = given({"--early-step"});
  early_clip_memory.grad_clip = 1.0f;
  check_settings_take_effect(early_clip_memory, false, true);
  ASSERT_EQ(early_clip_memory.notices.size(), 1u);
  EXPECT_EQ(early_clip_memory.notices[0],
            "--early-step: no effect with --grad-clip without NVMe offload (it would speculate, which costs time and "
            "memory and hides no I/O when the state is in memory); the optimizer steps at the end, with the same results");
  TrainConfig early_ok = given({"--early-step"});
  check_settings_take_effect(early_ok, false, true);
  EXPECT_TRUE(early_ok.notices.empty());
  // A setting from the file is named by its key.
  TrainConfig from_file = read_config(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-5}}})",
                                      [](TrainConfig& f) {
                                        f.lr_schedule = "constant";
                                        f.given.insert("--lr-schedule");
                                      });
  EXPECT_FALSE(from_file.is_given("--warmup-min-lr"));  // the whole block was replaced
}

TEST(Config, AbsurdValuesAreRejectedByName) {
  auto bad = [](auto mutate, const std::string& needle) {
    TrainConfig c;
    mutate(c);
    expect_error([&] { validate(c); }, needle);
  };
  bad([](TrainConfig& c) { c.micro_batch = 0; }, "--micro-batch 0 is out of range: expected an integer in 1..65536");
  bad([](TrainConfig& c) { c.lr = -1; }, "--lr -1 is out of range: expected a number in (0, 10]");
  bad([](TrainConfig& c) { c.lr = NAN; }, "--lr");
  bad([](TrainConfig& c) { c.beta2 = 1.0f; }, "--beta2");
  bad([](TrainConfig& c) { c.grad_accum = 0; }, "--grad-accum");
  bad([](TrainConfig& c) { c.steps = -3; }, "--steps");
  bad([](TrainConfig& c) { c.precision = "int4"; }, "--precision 'int4'");
  bad([](TrainConfig& c) { c.loss_scale = -1; }, "--loss-scale -1");
  bad([](TrainConfig& c) { c.hysteresis = 0; }, "--hysteresis 0");
  bad([](TrainConfig& c) { c.initial_scale_power = 99; }, "--initial-scale-power 99");
  bad([](TrainConfig& c) { c.zero_stage = 7; }, "--zero-stage 7");
  bad([](TrainConfig& c) { c.lr_schedule = "linear"; }, "--lr-schedule 'linear'");
  bad([](TrainConfig& c) { c.warmup_type = "cubic"; }, "--warmup-type 'cubic'");
  bad([](TrainConfig& c) { c.warmup_min_ratio = 2; }, "--warmup-min-ratio 2");
  bad([](TrainConfig& c) {
    c.lr_schedule = "warmup-cosine";
    c.steps = 10;
    c.warmup = 4;
    c.total_steps = 4;
  }, "WarmupCosineLR's decay would divide by zero");
}

}  // namespace
}  // namespace zerone::train

namespace zerone::train {
// ZeRO++ (issue 21): DeepSpeed's keys reach the settings; a flag on the command line wins.
TEST(Config, ZeroPlusPlusKeys) {
  const TrainConfig c = read_config(
      R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2, "zero_quantized_weights": true,
                                "zero_quantized_gradients": true}})");
  EXPECT_EQ(c.hpz_partition_size, 2);
  EXPECT_TRUE(c.quantized_weights);
  EXPECT_EQ(c.quantized_gradients, 8);
  EXPECT_EQ(read_config(R"({"zero_optimization": {"zero_quantized_gradients": false}})").quantized_gradients, 0);
  expect_config_error(R"({"zero_optimization": {"zero_hpz_partition_size": 0}})", "zero_hpz_partition_size");
}
}  // namespace zerone::train
