// A per-category wall-clock profiler: where a training step's time goes (GEMM, attention,
// elementwise kernels, optimizer, communication, data). Off by default; when off, a scope costs one
// branch. Scopes nest and time is exclusive: an inner scope's time is not counted in the outer one.
//
// Thread-safety: scopes are opened from the thread that drives training (kernels parallelize
// internally); totals are plain counters read after the work. Not for concurrent drivers: a helper
// thread that runs instrumented code beside the training thread (the --delayed-update optimizer)
// calls set_thread_excluded(true) first, and its scopes then cost one branch and record nothing.
#pragma once

#include <array>
#include <chrono>
#include <string>

namespace zerone {

// `swap`: waiting for NVMe swap I/O (the part the pipeline did not hide).
enum class ProfileCategory { gemm, attention, elementwise, optimizer, comm, data, swap, kCount };

class Profiler {
 public:
  static constexpr size_t kCount = static_cast<size_t>(ProfileCategory::kCount);
  static void set_enabled(bool on) { enabled_ = on; }
  // Scopes opened on the calling thread record nothing from now on (see Thread-safety).
  static void set_thread_excluded(bool excluded) { excluded_ = excluded; }
  static bool enabled() { return enabled_; }
  static void reset();
  static double seconds(ProfileCategory category) { return totals_[static_cast<size_t>(category)]; }
  static const char* name(ProfileCategory category);
  // "gemm 61.2% (0.270 s/step), attention ..." over `steps` steps, plus the untracked remainder of `wall_s`.
  static std::string report(double wall_s, int steps);

 private:
  friend class ProfileScope;
  static inline bool enabled_ = false;
  static inline thread_local bool excluded_ = false;
  static inline std::array<double, kCount> totals_{};
};

class ProfileScope {
 public:
  explicit ProfileScope(ProfileCategory category);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  bool active_;
  ProfileCategory category_;
  ProfileScope* parent_ = nullptr;
  Clock::time_point start_;
  static inline thread_local ProfileScope* current_ = nullptr;
};

}  // namespace zerone
