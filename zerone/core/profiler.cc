#include "zerone/core/profiler.h"

#include <cstdio>

namespace zerone {

void Profiler::reset() { totals_.fill(0.0); }

const char* Profiler::name(ProfileCategory category) {
  static const char* names[] = {"gemm", "attention", "elementwise", "optimizer", "comm", "data", "swap"};
  return names[static_cast<size_t>(category)];
}

std::string Profiler::report(double wall_s, int steps) {
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
  std::snprintf(buf, sizeof buf, ", other %.1f%% (%.1f ms/step)", 100.0 * (wall_s - tracked) / wall_s,
                1000.0 * (wall_s - tracked) / steps);
  return out + buf;
}

ProfileScope::ProfileScope(ProfileCategory category) : active_(Profiler::enabled_ && !Profiler::excluded_), category_(category) {
  if (!active_) return;
  Clock::time_point now = Clock::now();
  parent_ = current_;
  if (parent_ != nullptr) Profiler::totals_[static_cast<size_t>(parent_->category_)] +=
      std::chrono::duration<double>(now - parent_->start_).count();
  current_ = this;
  start_ = now;
}

ProfileScope::~ProfileScope() {
  if (!active_) return;
  Clock::time_point now = Clock::now();
  Profiler::totals_[static_cast<size_t>(category_)] += std::chrono::duration<double>(now - start_).count();
  current_ = parent_;
  if (parent_ != nullptr) parent_->start_ = now;
}

}  // namespace zerone
