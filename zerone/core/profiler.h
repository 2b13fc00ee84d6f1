// A per-category wall-clock profiler: where a training step's time goes (GEMM, attention,
// elementwise kernels, optimizer, communication, data, swap, host-device transfers). Off by
// default; when off, a scope costs one branch. Scopes nest and time is exclusive: an inner scope's
// time is not counted in the outer one.
//
// Note [Exposed time]
// Where the device is the host (cpu, sim), scopes are timed by the host's clock, and the compute
// categories time the kernels, which run on the calling thread. A GPU's kernels return before
// they ran, and the host's clock cannot say how much of a scope the GPU spent waiting: the CPU
// optimizer of an offloaded step runs while the GPU still works through the backward queued
// before it. So where the backend has a DeviceTimeline, each scope is timed on the device's
// compute stream instead: a point marked there as the scope opens is reached when the GPU has
// done the work queued before it, one marked as it closes when the host got there too, and the
// span between them is the time the GPU waited on the scope's work: its exposed time (nothing
// where the GPU was busy throughout). Scopes then open only around host work and waits (the cuda
// backend opens no compute scope), and what is left of the steps' wall time is the device's
// compute and the launches ("device compute and launches" in the summary and --profile). A copy
// between host and device memory waits for the kernels queued before it; the cuda backend waits
// for those first, unscoped, then for the copy as a `transfer`.
// Note [Device compute itemized]: with --profile (Profiler::set_itemize_device_work) a backend
// whose kernels run asynchronously also opens a DeviceWorkScope around each of its operations, of
// the operation's category (the cuda backend: its GEMMs gemm, the attention kernels attention,
// AdamW and SGD optimizer, the rest elementwise). On the device timeline such a scope's span runs
// from the point where the GPU finished what was queued before the operation to the point where
// it finished the operation's kernels: the GPU's time on them, GPU idle inside the operation
// included. Nested scopes split it exclusively (a linear's GEMMs are gemm, its bias pass
// elementwise). The rest of the step is then the GPU idle between operations and what no scope
// covers ("launches and gaps"). It costs two timed events an operation, which is why only
// --profile asks for it; the summary's split (always on) keeps the device compute as the rest.
// Kernels another thread puts on the compute stream (--delayed-update's optimizer, for shards
// kept on the GPU) fall in the span of whichever operation the driver timed around them.
// Beside what was exposed, the profiler keeps the work: each scope's time by the host's clock,
// and what a helper thread reports through its driver (the --delayed-update optimizer's step). The
// share of a category's work that the exposed time does not account for is what the overlap hid
// (the CPU optimizer's, in issue 19's measure of offload).
//
// Thread-safety: only the thread that called set_enabled(true) records (the thread that drives
// training; kernels parallelize internally); on any other thread (the --delayed-update optimizer,
// a communicator's worker) a scope costs one branch and records nothing. Totals are plain counters
// read by that thread after the work.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zerone {

// `swap`: waiting for NVMe swap I/O (the part the pipeline did not hide).
// `transfer`: waiting for a copy between host and device memory (the part the overlap did not
// hide): a synchronous copy, or the host waiting on an asynchronous copy's event.
enum class ProfileCategory { gemm, attention, elementwise, optimizer, comm, data, swap, transfer, kCount };

// Points on a device's compute stream (Note [Exposed time]). Used by the profiler's driver thread
// only. A failure of the device aborts (as the backend's own calls do).
class DeviceTimeline {
 public:
  virtual ~DeviceTimeline() = default;
  // Marks the point after everything submitted to the compute stream so far; returns its number
  // (0, 1, ... since the last clear()).
  virtual uint32_t mark() = 0;
  // Waits until the device reached point `later`, and returns the seconds from `earlier` to it.
  virtual double seconds_between(uint32_t earlier, uint32_t later) = 0;
  // Waits until the device reached point `point`.
  virtual void wait_for(uint32_t point) = 0;
  // Forgets every point: the numbers start again at 0.
  virtual void clear() = 0;
};

class Profiler {
 public:
  static constexpr size_t kCount = static_cast<size_t>(ProfileCategory::kCount);
  // On: the calling thread's scopes record from now on (it is the driver: see Thread-safety).
  // Call on and off from the same thread.
  static void set_enabled(bool on) {
    enabled_ = on;
    driver_ = on;
  }
  static bool enabled() { return enabled_; }
  // Note [Device compute itemized]: whether DeviceWorkScopes time the device's operations. Set by
  // the driver thread, with no scope open; itemizes_here() is false on any other thread (which
  // reads nothing the driver writes).
  static void set_itemize_device_work(bool on) { itemize_device_work_ = on; }
  static bool itemizes_device_work() { return itemize_device_work_; }
  static bool itemizes_here() { return driver_ && enabled_ && itemize_device_work_; }
  // Times scopes on `timeline` from now on (null: the host's clock again); not owned, kept until
  // replaced. Call with no scope open, from the driver thread.
  static void set_device_timeline(DeviceTimeline* timeline);
  // Resolves the spans timed on the device into the totals (waits for the device to reach them)
  // when more than `max_pending` are waiting; call at a step's end, with no scope open.
  static void settle(size_t max_pending = 0);
  // The wait of settle(max_pending) alone: the device reaches the last pending point (when more
  // than `max_pending` spans are waiting), and settle() then only reads the spans. A caller timing
  // its steps stops its clock between the two, so that reading thousands of spans (--profile's
  // itemized device work) is not counted as the step's time.
  static void wait_to_settle(size_t max_pending = 0);
  static void reset();
  // The exposed seconds of `category` (Note [Exposed time]).
  static double seconds(ProfileCategory category) {
    settle();
    return totals_[static_cast<size_t>(category)];
  }
  // The seconds of work in `category`: its scopes by the host's clock, and add_work's.
  static double work_seconds(ProfileCategory category) { return work_totals_[static_cast<size_t>(category)]; }
  // Adds work done beside the driver (by a helper thread whose scopes record nothing), from the
  // driver thread; nothing when the profiler is off or the caller is not the driver.
  // The work ran from `begin` to `end` by the steady clock; only its part after the last reset()
  // counts (a delayed update started at the end of step 1 runs inside step 2).
  static void add_work(ProfileCategory category, std::chrono::steady_clock::time_point begin,
                       std::chrono::steady_clock::time_point end) {
    if (!(driver_ && enabled_)) return;
    const double seconds = std::chrono::duration<double>(end - std::max(begin, reset_at_)).count();
    if (seconds > 0) work_totals_[static_cast<size_t>(category)] += seconds;
  }
  // The share of `category`'s work that its exposed time does not account for (0 where the work is
  // not more than the exposed time, e.g. a GPU's own optimizer kernels).
  static double hidden_share(ProfileCategory category);
  static const char* name(ProfileCategory category);
  // "gemm 61.2% (0.270 s/step), attention ..." over `steps` steps, plus the untracked remainder of
  // `wall_s` named `remainder` ("other"; a GPU's compute where its kernels run asynchronously).
  static std::string report(double wall_s, int steps, const char* remainder = "other");

 private:
  friend class ProfileScope;
  static inline bool enabled_ = false;
  static inline bool itemize_device_work_ = false;
  static inline thread_local bool driver_ = false;
  static inline std::array<double, kCount> totals_{};
  static inline std::array<double, kCount> work_totals_{};
  static inline std::chrono::steady_clock::time_point reset_at_{};
  // Spans on the device timeline not yet resolved: (category, earlier point, later point).
  struct Span {
    ProfileCategory category;
    uint32_t earlier, later;
  };
  static inline DeviceTimeline* timeline_ = nullptr;
  static inline std::vector<Span> pending_;
};

class ProfileScope {
 public:
  // A scope of `category`. One that only waits for work done elsewhere and reported by add_work
  // (the --delayed-update optimizer's) is `waits_for_work`: its time is exposed, not work.
  explicit ProfileScope(ProfileCategory category, bool waits_for_work = false);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  // Closes the open span of `scope` (the parent as a child opens, the scope as it closes) and
  // starts the next one there.
  static void close_span(ProfileScope& scope, Clock::time_point now, uint32_t point);
  bool active_;
  bool waits_for_work_;
  ProfileCategory category_;
  ProfileScope* parent_ = nullptr;
  Clock::time_point start_;  // where the open span began: on the host's clock, or
  uint32_t start_point_ = 0;  // on the device timeline
  static inline thread_local ProfileScope* current_ = nullptr;
};

// Note [Device compute itemized]: a ProfileScope of `category` around a device operation, opened only
// while the profiler itemizes device work (one branch otherwise). Its host time is not counted as
// the category's work: the work is the device's, and the span is its time.
class DeviceWorkScope {
 public:
  explicit DeviceWorkScope(ProfileCategory category) {
    if (Profiler::itemizes_here()) scope_.emplace(category, /*waits_for_work=*/true);
  }

 private:
  std::optional<ProfileScope> scope_;
};

}  // namespace zerone
