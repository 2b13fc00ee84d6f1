// LrSchedule against DeepSpeed: the expected values are the output of
// tests/train/deepspeed_lr_schedules.py, which restates DeepSpeed's WarmupLR, WarmupDecayLR and
// WarmupCosineLR and its engine's scheduler bookkeeping in plain Python (Note [DeepSpeed LR
// schedules]). Rerun the script and paste its output when a case changes.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "tests/test_util.h"
#include "zerone/train/lr_schedule.h"

namespace zerone::train {
namespace {

// Runs `schedule` over steps 1..expected.size() (steps in `skipped` overflow) and compares the lr
// each optimizer step runs at.
void expect_lrs(LrScheduleConfig config, const std::vector<double>& expected, std::set<int> skipped = {}) {
  LrSchedule schedule(config);
  for (size_t s = 1; s <= expected.size(); ++s) {
    EXPECT_NEAR(schedule.lr(), expected[s - 1], 1e-12 + 1e-9 * expected[s - 1]) << "optimizer step " << s;
    schedule.advance(!skipped.count(static_cast<int>(s)));
  }
}

LrScheduleConfig deepspeed(LrScheduleKind kind, double lr, int64_t warmup, bool log, int64_t total = 1) {
  LrScheduleConfig c;
  c.kind = kind;
  c.lr = lr;
  c.warmup_steps = warmup;
  c.warmup_log = log;
  c.total_steps = total;
  return c;
}

TEST(LrSchedule, WarmupLRMatchesDeepSpeed) {
  LrScheduleConfig log = deepspeed(LrScheduleKind::warmup_lr, 1e-3, 5, true);
  log.warmup_min_lr = 1e-5;
  expect_lrs(log, {1.0000000000000001e-05, 1.0000000000000001e-05, 0.00043636979249265915, 0.00068578013254112552,
                   0.00086273958498531828, 0.001, 0.001, 0.001});
  expect_lrs(deepspeed(LrScheduleKind::warmup_lr, 2e-3, 4, false), {0, 0, 0.00050000000000000001, 0.001, 0.0015, 0.002, 0.002});
  // warmup_num_steps 0 is DeepSpeed's minimum of 2.
  expect_lrs(deepspeed(LrScheduleKind::warmup_lr, 1e-3, 0, false), {0, 0, 0.00050000000000000001, 0.001});
}

TEST(LrSchedule, WarmupDecayLRMatchesDeepSpeed) {
  LrScheduleConfig linear = deepspeed(LrScheduleKind::warmup_decay, 1e-3, 3, false, 10);
  linear.warmup_min_lr = 1e-4;
  expect_lrs(linear, {0.0001, 0.0001, 0.00039999999999999996, 0.00069999999999999999, 0.001, 0.00087142857142857139,
                      0.00074285714285714287, 0.00061428571428571424, 0.00048571428571428566, 0.00035714285714285709,
                      0.00022857142857142857, 0.0001, 0.0001});
  // fp16 steps 2 and 3 overflowed: DeepSpeed's engine does not step the scheduler for them.
  expect_lrs(deepspeed(LrScheduleKind::warmup_decay, 5e-4, 4, true, 8),
             {0, 0, 0, 0, 0.00025000000000000001, 0.00039624062518028906, 0.00050000000000000001,
              0.00050000000000000001, 0.00037500000000000001, 0.00025000000000000001},
             {2, 3});
}

TEST(LrSchedule, WarmupCosineLRMatchesDeepSpeed) {
  LrScheduleConfig log = deepspeed(LrScheduleKind::warmup_cosine, 3e-3, 4, true, 12);
  log.warmup_min_ratio = 0.1;
  log.min_lr_frac = 0.01;  // cos_min_ratio
  expect_lrs(log, {0, 0.00030000000000000003, 0.0016500000000000002, 0.0024396993759735609, 0.0030000000000000001,
                   0.0028869611057792607, 0.0025650535700620231, 0.0020832848970621584, 0.0015150000000000001,
                   0.00094671510293784184, 0.00046494642993797708, 0.00014303889422073921, 3.0000000000000001e-05,
                   0.00014303889422073902});
  LrScheduleConfig linear = deepspeed(LrScheduleKind::warmup_cosine, 1e-3, 2, false, 6);
  linear.min_lr_frac = 1e-4;  // DeepSpeed's default cos_min_ratio
  expect_lrs(linear, {0, 0, 0.00050000000000000001, 0.00085356803525421445, 0.00050005000000000004,
                      0.0001465319647457856, 1.0000000000000001e-07, 0.00014653196474578547});
}

TEST(LrSchedule, ZeroneSchedulesCountEveryStep) {
  LrScheduleConfig c;
  c.lr = 1.0;
  c.warmup_steps = 10;
  c.total_steps = 100;
  LrSchedule constant(c);
  EXPECT_DOUBLE_EQ(constant.lr_after(0), 0.1);   // step 1
  EXPECT_DOUBLE_EQ(constant.lr_after(9), 1.0);   // step 10
  EXPECT_DOUBLE_EQ(constant.lr_after(49), 1.0);  // step 50: constant
  c.kind = LrScheduleKind::cosine;
  c.min_lr_frac = 0.1;
  LrSchedule cosine(c);
  EXPECT_DOUBLE_EQ(cosine.lr_after(99), 0.1);  // step 100: the floor
  EXPECT_NEAR(cosine.lr_after(54), 0.55, 1e-12);
  cosine.advance(false);  // a skipped fp16 step still counts for zerone's schedules
  EXPECT_DOUBLE_EQ(cosine.lr(), 0.2);
}

TEST(LrSchedule, ConfigFromFlags) {
  TrainConfig t;
  t.lr_schedule = "warmup-cosine";
  t.steps = 40;
  LrScheduleConfig c = lr_schedule_config(t);
  EXPECT_EQ(c.kind, LrScheduleKind::warmup_cosine);
  EXPECT_EQ(c.total_steps, 40);       // --total-steps 0: --steps
  EXPECT_DOUBLE_EQ(c.min_lr_frac, 1e-4);  // DeepSpeed's cos_min_ratio unless --min-lr-frac is given
  t.total_steps = 70;
  t.min_lr_frac = 0.2f;
  t.given.insert("--min-lr-frac");
  t.warmup_type = "linear";
  c = lr_schedule_config(t);
  EXPECT_EQ(c.total_steps, 70);
  EXPECT_NEAR(c.min_lr_frac, 0.2, 1e-7);
  EXPECT_FALSE(c.warmup_log);
  zerone::testing::expect_error([] { parse_lr_schedule("OneCycle"); }, "--lr-schedule 'OneCycle'");
}

}  // namespace
}  // namespace zerone::train
