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

void Profiler::wait_to_settle(size_t max_pending) {
  if (pending_.size() > max_pending) timeline_->wait_for(pending_.back().later);
}

void Profiler::reset() {
  pending_.clear();
  if (timeline_ != nullptr) timeline_->clear();
  totals_.fill(0.0);
  work_totals_.fill(0.0);
  reset_at_ = std::chrono::steady_clock::now();
}

double Profiler::hidden_share(ProfileCategory category) {
  const double exposed = seconds(category), work = work_seconds(category);
  return work > exposed ? (work - exposed) / work : 0.0;
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
    if (s == 0.0 && work_totals_[c] == 0.0) continue;  // a hidden optimizer still shows its work
    std::snprintf(buf, sizeof buf, "%s%s %.1f%% (%.1f ms/step", out.empty() ? "" : ", ",
                  name(static_cast<ProfileCategory>(c)), 100.0 * s / wall_s, 1000.0 * s / steps);
    out += buf;
    const double hidden = hidden_share(static_cast<ProfileCategory>(c));
    if (hidden >= 0.0005) {
      std::snprintf(buf, sizeof buf, "; %.1f%% of its %.1f ms/step of work hidden", 100.0 * hidden,
                    1000.0 * work_totals_[c] / steps);
      out += buf;
    }
    out += ")";
  }
  std::snprintf(buf, sizeof buf, ", %s %.1f%% (%.1f ms/step)", remainder, 100.0 * (wall_s - tracked) / wall_s,
                1000.0 * (wall_s - tracked) / steps);
  return out + buf;
}

void ProfileScope::close_span(ProfileScope& scope, Clock::time_point now, uint32_t point) {
  const size_t c = static_cast<size_t>(scope.category_);
  const double host_s = std::chrono::duration<double>(now - scope.start_).count();
  if (!scope.waits_for_work_) Profiler::work_totals_[c] += host_s;
  if (Profiler::timeline_ != nullptr) {
    Profiler::pending_.push_back({scope.category_, scope.start_point_, point});
  } else {
    Profiler::totals_[c] += host_s;
  }
  scope.start_ = now;
  scope.start_point_ = point;
}

ProfileScope::ProfileScope(ProfileCategory category, bool waits_for_work)
    // driver_ first: another thread reads nothing the driver writes.
    : active_(Profiler::driver_ && Profiler::enabled_), waits_for_work_(waits_for_work), category_(category) {
  if (!active_) return;
  const Clock::time_point now = Clock::now();
  const uint32_t point = Profiler::timeline_ == nullptr ? 0 : Profiler::timeline_->mark();
  parent_ = current_;
  if (parent_ != nullptr) close_span(*parent_, now, point);
  current_ = this;
  start_ = now;
  start_point_ = point;
}

ProfileScope::~ProfileScope() {
  if (!active_) return;
  const Clock::time_point now = Clock::now();
  const uint32_t point = Profiler::timeline_ == nullptr ? 0 : Profiler::timeline_->mark();
  close_span(*this, now, point);
  current_ = parent_;
  if (parent_ != nullptr) {
    parent_->start_ = now;
    parent_->start_point_ = point;
  }
}

}  // namespace zerone
