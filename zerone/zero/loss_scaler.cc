#include "zerone/zero/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "zerone/core/error.h"

namespace zerone::zero {

LossScaler::LossScaler(const LossScaleConfig& config)
    : config_(config),
      scale_(config.dynamic ? std::ldexp(1.0, config.initial_scale_power) : config.static_scale),
      hysteresis_left_(config.hysteresis) {
  ZERONE_CHECK(config.window >= 1, "fp16.loss_scale_window ", config.window, " must be at least 1");
  ZERONE_CHECK(config.hysteresis >= 1, "fp16.hysteresis ", config.hysteresis, " must be at least 1");
  ZERONE_CHECK(config.min_scale > 0 && std::isfinite(config.min_scale), "fp16.min_loss_scale must be positive");
  ZERONE_CHECK(config.initial_scale_power >= 0 && config.initial_scale_power <= 64,
               "fp16.initial_scale_power ", config.initial_scale_power, " is out of range: expected 0..64");
  ZERONE_CHECK(config.dynamic || (config.static_scale > 0 && std::isfinite(config.static_scale)),
               "fp16.loss_scale must be positive (0 selects dynamic scaling)");
}

void LossScaler::update(bool overflow) {
  if (config_.dynamic) {
    if (overflow) {
      if (config_.hysteresis == 1 || hysteresis_left_ == 1) scale_ = std::max(scale_ / 2.0, config_.min_scale);
      else --hysteresis_left_;
      last_overflow_ = iteration_;
    } else if ((iteration_ - last_overflow_) % config_.window == 0) {
      hysteresis_left_ = config_.hysteresis;
      scale_ *= 2.0;
    }
  }
  ++iteration_;
}

}  // namespace zerone::zero
