// The trainer's part of a checkpoint (train/checkpoint.h): the manifest's "trainer" object round
// trips, records every setting that changes results, and an older checkpoint's micro-batch
// position (next_chunk) reads as samples (Note [Resume position]).
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/test_util.h"
#include "zerone/train/checkpoint.h"
#include "zerone/train/settings.h"

namespace zerone::train {
namespace {

using testing::expect_error;

TrainerState example_state() {
  TrainerState s;
  s.step = 7;
  s.consumed_samples = 84;
  s.epoch_samples = 1000;
  s.micro_batch = 3;
  s.seq = 16;
  s.grad_accum = 2;
  s.world_size = 2;
  s.seed = 18446744073709551615ull;
  s.shuffle = true;
  s.lr_advances = 6;
  s.loss_scaler.scale = 1024.0;
  s.skipped_steps = 1;
  TrainConfig cfg;
  cfg.lr = 2e-3f;
  s.settings = result_settings(cfg);
  return s;
}

TEST(TrainerState, RoundTripsThroughTheManifest) {
  const TrainerState s = example_state();
  const TrainerState back = trainer_state_from_json(trainer_state_to_json(s), "test");
  EXPECT_EQ(back.step, s.step);
  EXPECT_EQ(back.consumed_samples, s.consumed_samples);
  EXPECT_EQ(back.epoch_samples, s.epoch_samples);
  EXPECT_FALSE(back.position_in_chunks);
  EXPECT_EQ(back.micro_batch, s.micro_batch);
  EXPECT_EQ(back.seed, s.seed);
  EXPECT_EQ(back.lr_advances, s.lr_advances);
  EXPECT_EQ(back.skipped_steps, s.skipped_steps);
  // The manifest keeps the settings by key (its order may differ): every one, same value.
  ASSERT_EQ(back.settings.size(), s.settings.size());
  for (const auto& [key, value] : s.settings) {
    auto it = std::find_if(back.settings.begin(), back.settings.end(), [&](const auto& kv) { return kv.first == key; });
    ASSERT_NE(it, back.settings.end()) << key;
    EXPECT_EQ(it->second, value) << key;
  }
}

TEST(TrainerState, RecordsEverySettingThatChangesResults) {
  const TrainerState s = example_state();
  size_t rows = 0;
  for (const Setting& row : settings()) rows += row.changes_results ? 1 : 0;
  EXPECT_EQ(s.settings.size(), rows);
  auto value = [&](const std::string& key) {
    for (const auto& [k, v] : s.settings)
      if (k == key) return v;
    return std::string("(absent)");
  };
  EXPECT_EQ(value("lr"), "0.002");
  EXPECT_NE(value("beta2"), "(absent)");
  EXPECT_NE(value("grad_clip"), "(absent)");
  EXPECT_NE(value("loss_scale_window"), "(absent)");
  EXPECT_EQ(value("zero_stage"), "(absent)") << "the stage does not change results";
  EXPECT_EQ(value("threads"), "(absent)");
}

TEST(TrainerState, AnOlderCheckpointsChunkIndexIsSamples) {
  nlohmann::json j = trainer_state_to_json(example_state());
  j.erase("consumed_samples");
  j.erase("epoch_samples");
  j.erase("settings");
  j["next_chunk"] = 28;  // 28 global micro-batches of 3 samples
  const TrainerState back = trainer_state_from_json(j, "test");
  EXPECT_TRUE(back.position_in_chunks);
  EXPECT_EQ(back.consumed_samples, 84u);
  EXPECT_TRUE(back.settings.empty());
  j["next_chunk"] = 5;  // fewer chunks than steps
  expect_error([&] { trainer_state_from_json(j, "test"); }, "trainer state \"next_chunk\" 5 is out of range");
}

TEST(TrainerState, APositionBeforeItsStepIsRefused) {
  nlohmann::json j = trainer_state_to_json(example_state());
  j["consumed_samples"] = 6;  // 7 steps read at least 7 samples
  expect_error([&] { trainer_state_from_json(j, "ck"); }, "ck: trainer state \"consumed_samples\" 6 is out of range");
}

}  // namespace
}  // namespace zerone::train
