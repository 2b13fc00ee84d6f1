// Loss scaling for fp16 training, with DeepSpeed's dynamic semantics and defaults.
//
// The loss is multiplied by scale() before backward so that small gradients survive fp16; the
// optimizer divides it out. If the gradients overflowed (a non-finite global norm), the step is
// skipped and update(true) lowers the scale: with hysteresis h, the first h-1 consecutive
// overflows only use up the hysteresis, the next one halves the scale (never below min_scale).
// After `window` steps without overflow the scale doubles and the hysteresis is restored.
// A static scale (dynamic = false) never changes. Thread-safety: plain value type.
#pragma once

#include <cstdint>

namespace zerone::zero {

struct LossScaleConfig {
  bool dynamic = true;
  double static_scale = 1.0;      // used when !dynamic (fp16.loss_scale > 0)
  int initial_scale_power = 16;   // fp16.initial_scale_power
  int window = 1000;              // fp16.loss_scale_window
  int hysteresis = 2;             // fp16.hysteresis
  double min_scale = 1.0;         // fp16.min_loss_scale
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& config);
  double scale() const { return scale_; }
  // Call once per optimizer step with whether its gradients overflowed.
  void update(bool overflow);

  // The scaler's whole state, for checkpoints.
  struct State {
    double scale = 1.0;
    int hysteresis_left = 0;
    int64_t iteration = 0, last_overflow = -1;
  };
  State state() const { return {scale_, hysteresis_left_, iteration_, last_overflow_}; }
  void set_state(const State& s) {
    scale_ = s.scale;
    hysteresis_left_ = s.hysteresis_left;
    iteration_ = s.iteration;
    last_overflow_ = s.last_overflow;
  }

 private:
  LossScaleConfig config_;
  double scale_;
  int hysteresis_left_;
  int64_t iteration_ = 0, last_overflow_ = -1;
};

}  // namespace zerone::zero
