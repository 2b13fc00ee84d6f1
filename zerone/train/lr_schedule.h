// Learning-rate schedules: zerone's own (constant or cosine after a linear warmup) and DeepSpeed's
// WarmupLR, WarmupDecayLR and WarmupCosineLR with DeepSpeed's formulas and step bookkeeping
// (Note [DeepSpeed LR schedules] in lr_schedule.cc).
//
// Ownership: plain values. Failure: parse_lr_schedule and lr_schedule_config throw Error naming the
// flag; LrSchedule itself never fails. Thread-safety: one thread per LrSchedule.
#pragma once

#include <cstdint>
#include <string>

#include "zerone/train/config.h"

namespace zerone::train {

enum class LrScheduleKind {
  constant,       // linear warmup from 0 over warmup_steps, then lr
  cosine,         // linear warmup, then cosine decay to lr * min_lr_frac at total_steps
  warmup_lr,      // DeepSpeed WarmupLR
  warmup_decay,   // DeepSpeed WarmupDecayLR
  warmup_cosine,  // DeepSpeed WarmupCosineLR
};

// "constant", "cosine", "warmup-lr", "warmup-decay", "warmup-cosine"; throws Error otherwise.
LrScheduleKind parse_lr_schedule(const std::string& name);
const char* lr_schedule_name(LrScheduleKind kind);
bool is_deepspeed_schedule(LrScheduleKind kind);

struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::constant;
  double lr = 3e-4;               // peak: --lr (DeepSpeed: warmup_max_lr, or the optimizer's lr for WarmupCosineLR)
  int64_t warmup_steps = 0;       // --warmup (DeepSpeed: warmup_num_steps, used as max(2, n))
  int64_t total_steps = 1;        // cosine: the run's steps; DeepSpeed: total_num_steps
  double min_lr_frac = 0.0;       // cosine floor; WarmupCosineLR: cos_min_ratio
  double warmup_min_lr = 0.0;     // WarmupLR, WarmupDecayLR: warmup_min_lr
  double warmup_min_ratio = 0.0;  // WarmupCosineLR: warmup_min_ratio
  bool warmup_log = true;         // DeepSpeed warmup_type: log (its default) or linear
};

// The schedule a run's settings describe: --lr-schedule with --lr, --warmup, --min-lr-frac
// (WarmupCosineLR's cos_min_ratio, DeepSpeed's 1e-4 unless given), --warmup-min-lr,
// --warmup-min-ratio, --warmup-type and --total-steps (0: --steps).
LrScheduleConfig lr_schedule_config(const TrainConfig& cfg);

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleConfig& config) : config_(config) {}

  // The learning rate of the optimizer step about to run.
  double lr() const { return lr_after(advances_); }
  // Call after every optimizer step; `applied` is false for a step skipped because fp16
  // gradients overflowed. zerone's schedules count every step; DeepSpeed's count only applied
  // steps (its engine calls lr_scheduler.step() only then).
  void advance(bool applied) {
    if (applied || !is_deepspeed_schedule(config_.kind)) ++advances_;
  }

  // The learning rate of the optimizer step that follows `advances` counted steps: zerone's
  // schedules give the value at 1-based step advances + 1; DeepSpeed's the value its scheduler
  // holds after `advances` calls of lr_scheduler.step().
  double lr_after(int64_t advances) const;

  // The schedule's position, for checkpoints.
  int64_t advances() const { return advances_; }
  void set_advances(int64_t advances) { advances_ = advances; }

 private:
  LrScheduleConfig config_;
  int64_t advances_ = 0;
};

}  // namespace zerone::train
