#include "zerone/core/profiler.h"

#include <cstdio>

namespace zerone {

void Profiler::set_device_timeline(DeviceTimeline* timeline) {
  settle();
  timeline_ = timeline;
}

void Profiler::settle(size_t max_pending) {
  if (pending_.size() <= max_pending) return;
  for (const Span& span : pending_)
    totals_[static_cast<size_t>(span.category)] += timeline_->seconds_between(span.earlier, span.later);
  pending_.clear();
  timeline_->clear();
}

void Profiler::reset() {
  pending_.clear();
  if (timeline_ != nullptr) timeline_->clear();
  totals_.fill(0.0);
}

const char* Profiler::name(ProfileCategory category) {
  static const char* names[] = {"gemm", "attention", "elementwise", "optimizer", "comm", "data", "swap", "transfer"};
  static_assert(sizeof(names) / sizeof(names[0]) == kCount);
  return names[static_cast<size_t>(category)];
}

std::string Profiler::report(double wall_s, int steps, const char* remainder) {
  settle();
  std::string out;
  double tracked = 0.0;
  char buf[128];
  for (size_t c = 0; c < kCount; ++c) {
    double s = totals_[c];
    tracked += s;
    if (s == 0.0) continue;
    std::snprintf(buf, sizeof buf, "%s%s %.1f%% (%.1f ms/step)", out.empty() ? "" : ", ",
                  name(static_cast<ProfileCategory>(c)), 100.0 * s / wall_s, 1000.0 * s / steps);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, ", %s %.1f%% (%.1f ms/step)", remainder, 100.0 * (wall_s - tracked) / wall_s,
                1000.0 * (wall_s - tracked) / steps);
  return out + buf;
}

void ProfileScope::close_span(ProfileScope& scope, Clock::time_point now, uint32_t point) {
  if (Profiler::timeline_ != nullptr) {
    Profiler::pending_.push_back({scope.category_, scope.start_point_, point});
    scope.start_point_ = point;
  } else {
    Profiler::totals_[static_cast<size_t>(scope.category_)] += std::chrono::duration<double>(now - scope.start_).count();
    scope.start_ = now;
  }
}

ProfileScope::ProfileScope(ProfileCategory category) : active_(Profiler::enabled_ && Profiler::driver_), category_(category) {
  if (!active_) return;
  const Clock::time_point now = Profiler::timeline_ == nullptr ? Clock::now() : Clock::time_point();
  const uint32_t point = Profiler::timeline_ == nullptr ? 0 : Profiler::timeline_->mark();
  parent_ = current_;
  if (parent_ != nullptr) close_span(*parent_, now, point);
  current_ = this;
  start_ = now;
  start_point_ = point;
}

ProfileScope::~ProfileScope() {
  if (!active_) return;
  const Clock::time_point now = Profiler::timeline_ == nullptr ? Clock::now() : Clock::time_point();
  const uint32_t point = Profiler::timeline_ == nullptr ? 0 : Profiler::timeline_->mark();
  close_span(*this, now, point);
  current_ = parent_;
  if (parent_ != nullptr) {
    parent_->start_ = now;
    parent_->start_point_ = point;
  }
}

}  // namespace zerone
