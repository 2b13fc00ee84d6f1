#include "zerone/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "zerone/core/error.h"

namespace zerone::train {

// Note [DeepSpeed LR schedules]
// Read from DeepSpeed's deepspeed/runtime/lr_schedules.py (WarmupLR, WarmupDecayLR, WarmupCosineLR)
// and deepspeed/runtime/engine.py (_take_model_step, _configure_lr_scheduler). With
// W = max(2, warmup_num_steps), T = total_num_steps and i = the scheduler's last_batch_iteration:
//
//   warmup fraction g(i) = ln(i + 1) / ln(W)   (warmup_type "log", the default)
//                        = i / W               (warmup_type "linear")
//   WarmupLR:       lr(i) = min_lr + (max_lr - min_lr) * (i < W ? g(i) : 1)
//   WarmupDecayLR:  lr(i) = min_lr + (max_lr - min_lr) * (i < W ? g(i) : max(0, (T - i) / max(1, T - W)))
//   WarmupCosineLR: lr(i) = lr0 * r(i), with lr0 the optimizer's lr and
//                   r(i) = i < W ? wmr + (1 - wmr) * g(i)
//                                : max(0, cmr + (1 - cmr) * (1 + cos(pi * (i - W + 1) / (T - W))) / 2)
//                   (wmr = warmup_min_ratio, cmr = cos_min_ratio)
//
// Indexing: a scheduler starts at i = -1 and its constructor writes its value at i = -1 into the
// optimizer: min_lr for WarmupLR/WarmupDecayLR, 0 for WarmupCosineLR. The engine calls
// lr_scheduler.step() (i += 1) after each optimizer step whose gradients did not overflow, and
// never at start-up. So the first optimizer step runs at the i = -1 value, the second at i = 0 (for
// WarmupLR that is min_lr again, since g(0) = 0), and optimizer step s runs at i = a - 1, where a
// is the number of earlier applied (not skipped) steps. Values and indexing are checked against
// tests/train/deepspeed_lr_schedules.py, which restates these formulas in Python.
//
// zerone's own schedules run at 1-based step s (every step counts): linear warmup lr * s / warmup
// for s <= warmup, then lr (constant) or lr_min + (lr - lr_min) * (1 + cos(pi * p)) / 2 with
// p = (s - warmup) / (total - warmup) and lr_min = lr * min_lr_frac (cosine).

namespace {

constexpr double kPi = 3.14159265358979323846;

struct ScheduleName {
  LrScheduleKind kind;
  const char* name;
};
constexpr ScheduleName kScheduleNames[] = {{LrScheduleKind::constant, "constant"},
                                           {LrScheduleKind::cosine, "cosine"},
                                           {LrScheduleKind::warmup_lr, "warmup-lr"},
                                           {LrScheduleKind::warmup_decay, "warmup-decay"},
                                           {LrScheduleKind::warmup_cosine, "warmup-cosine"}};

}  // namespace

LrScheduleKind parse_lr_schedule(const std::string& name) {
  for (const ScheduleName& s : kScheduleNames)
    if (name == s.name) return s.kind;
  throw Error(str_cat("--lr-schedule '", name, "': expected constant, cosine, warmup-lr, warmup-decay or warmup-cosine"));
}

const char* lr_schedule_name(LrScheduleKind kind) {
  for (const ScheduleName& s : kScheduleNames)
    if (kind == s.kind) return s.name;
  return "?";
}

bool is_deepspeed_schedule(LrScheduleKind kind) {
  return kind == LrScheduleKind::warmup_lr || kind == LrScheduleKind::warmup_decay ||
         kind == LrScheduleKind::warmup_cosine;
}

LrScheduleConfig lr_schedule_config(const TrainConfig& cfg) {
  LrScheduleConfig c;
  c.kind = parse_lr_schedule(cfg.lr_schedule);
  c.lr = cfg.lr;
  c.warmup_steps = cfg.warmup;
  c.total_steps = is_deepspeed_schedule(c.kind) && cfg.total_steps > 0 ? cfg.total_steps : cfg.steps;
  c.min_lr_frac = cfg.min_lr_frac;
  if (c.kind == LrScheduleKind::warmup_cosine && !cfg.is_given("--min-lr-frac")) c.min_lr_frac = 1e-4;
  c.warmup_min_lr = cfg.warmup_min_lr;
  c.warmup_min_ratio = cfg.warmup_min_ratio;
  c.warmup_log = cfg.warmup_type != "linear";
  return c;
}

double LrSchedule::lr_after(int64_t advances) const {
  const LrScheduleConfig& c = config_;
  if (!is_deepspeed_schedule(c.kind)) {
    const int64_t step = advances + 1;
    if (c.warmup_steps > 0 && step <= c.warmup_steps)
      return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
    if (c.kind == LrScheduleKind::cosine && c.total_steps > c.warmup_steps) {
      double progress = static_cast<double>(step - c.warmup_steps) / static_cast<double>(c.total_steps - c.warmup_steps);
      double coeff = 0.5 * (1.0 + std::cos(kPi * progress));
      double min_lr = c.lr * c.min_lr_frac;
      return min_lr + coeff * (c.lr - min_lr);
    }
    return c.lr;
  }
  // DeepSpeed (Note [DeepSpeed LR schedules]).
  const int64_t i = advances - 1;  // last_batch_iteration
  if (i < 0) return c.kind == LrScheduleKind::warmup_cosine ? 0.0 : c.warmup_min_lr;
  const int64_t W = std::max<int64_t>(2, c.warmup_steps), T = c.total_steps;
  auto warmup_fraction = [&] {
    return c.warmup_log ? std::log(static_cast<double>(i + 1)) / std::log(static_cast<double>(W))
                        : static_cast<double>(i) / static_cast<double>(W);
  };
  if (c.kind == LrScheduleKind::warmup_cosine) {
    double ratio;
    if (i < W) {
      ratio = c.warmup_min_ratio + (1.0 - c.warmup_min_ratio) * warmup_fraction();
    } else {
      // T == W divides by zero in DeepSpeed; validate() refuses runs that reach it.
      double x = static_cast<double>(i - W + 1) / static_cast<double>(T - W);
      ratio = std::max(0.0, c.min_lr_frac + (1.0 - c.min_lr_frac) * (1.0 + std::cos(kPi * x)) / 2.0);
    }
    return c.lr * ratio;
  }
  double gamma = 1.0;
  if (i < W) gamma = warmup_fraction();
  else if (c.kind == LrScheduleKind::warmup_decay)
    gamma = std::max(0.0, static_cast<double>(T - i) / std::max(1.0, static_cast<double>(T - W)));
  return c.warmup_min_lr + (c.lr - c.warmup_min_lr) * gamma;
}

}  // namespace zerone::train
