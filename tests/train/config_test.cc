#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_util.h"
#include "zerone/train/config.h"

namespace zerone::train {
namespace {

using zerone::testing::expect_error;
using zerone::testing::TempDir;
using zerone::testing::write_bytes;

void write_text(const std::string& path, const std::string& text) { write_bytes(path, text.data(), text.size()); }

TEST(Config, DeepSpeedKeysFillTheConfigAndFlagsWin) {
  TempDir dir;
  write_text(dir.file("ds.json"), R"({
    "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
    "bf16": {"enabled": false}, "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
    "loss_scale_window": 500, "hysteresis": 3, "min_loss_scale": 2}, "steps_per_print": 10,
    "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
    "scheduler": {"params": {"warmup_num_steps": 50}},
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
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("unknown.json"), c); }, "unknown key 'stpes'");
  write_text(dir.file("type.json"), "{\"steps\": \"many\"}");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("type.json"), c); }, "expected an integer");
  write_text(dir.file("opt.json"), "{\"optimizer\": {\"type\": \"Lion\"}}");
  expect_error([&] { TrainConfig c; apply_json_config(dir.file("opt.json"), c); }, "not supported");
}

TEST(Config, AbsurdValuesAreRejectedByName) {
  auto bad = [](auto mutate, const std::string& needle) {
    TrainConfig c;
    mutate(c);
    expect_error([&] { validate(c); }, needle);
  };
  bad([](TrainConfig& c) { c.micro_batch = 0; }, "--micro-batch 0");
  bad([](TrainConfig& c) { c.lr = -1; }, "--lr");
  bad([](TrainConfig& c) { c.lr = NAN; }, "--lr");
  bad([](TrainConfig& c) { c.beta2 = 1.0f; }, "--beta2");
  bad([](TrainConfig& c) { c.grad_accum = 0; }, "--grad-accum");
  bad([](TrainConfig& c) { c.steps = -3; }, "--steps");
  bad([](TrainConfig& c) { c.precision = "int4"; }, "--precision 'int4'");
  bad([](TrainConfig& c) { c.loss_scale = -1; }, "--loss-scale -1");
  bad([](TrainConfig& c) { c.hysteresis = 0; }, "--hysteresis 0");
  bad([](TrainConfig& c) { c.initial_scale_power = 99; }, "--initial-scale-power 99");
  bad([](TrainConfig& c) { c.zero_stage = 7; }, "--zero-stage 7");
  bad([](TrainConfig& c) { c.lr_schedule = "linear"; }, "--lr-schedule");
}

TEST(Config, LearningRateScheduleWarmsUpThenDecays) {
  TrainConfig c;
  c.lr = 1.0f;
  c.warmup = 10;
  EXPECT_FLOAT_EQ(learning_rate(c, 1, 100), 0.1f);
  EXPECT_FLOAT_EQ(learning_rate(c, 10, 100), 1.0f);
  EXPECT_FLOAT_EQ(learning_rate(c, 50, 100), 1.0f);  // constant by default
  c.lr_schedule = "cosine";
  c.min_lr_frac = 0.1f;
  EXPECT_FLOAT_EQ(learning_rate(c, 100, 100), 0.1f);
  EXPECT_NEAR(learning_rate(c, 55, 100), 0.55f, 1e-6);
}

}  // namespace
}  // namespace zerone::train
