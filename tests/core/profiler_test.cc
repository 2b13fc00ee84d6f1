// Profiler: exclusive nested scopes, and only the thread that enabled it records (the
// --delayed-update optimizer and a communicator's worker run instrumented code beside it).
#include "zerone/core/profiler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace zerone {
namespace {

void busy_for(std::chrono::milliseconds how_long) {
  const auto end = std::chrono::steady_clock::now() + how_long;
  while (std::chrono::steady_clock::now() < end) {
  }
}

class ProfilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Profiler::reset();
    Profiler::set_enabled(true);
  }
  void TearDown() override {
    Profiler::set_enabled(false);
    Profiler::reset();
  }
};

TEST_F(ProfilerTest, NestedScopesAreExclusive) {
  const auto start = std::chrono::steady_clock::now();
  {
    ProfileScope outer(ProfileCategory::optimizer);
    busy_for(std::chrono::milliseconds(20));
    {
      ProfileScope inner(ProfileCategory::transfer);
      busy_for(std::chrono::milliseconds(30));
    }
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(Profiler::seconds(ProfileCategory::transfer), 0.030);
  EXPECT_GE(Profiler::seconds(ProfileCategory::optimizer), 0.020);
  // The inner scope's time is not the outer one's too: together they are the wall time.
  EXPECT_LE(Profiler::seconds(ProfileCategory::optimizer) + Profiler::seconds(ProfileCategory::transfer), wall_s);
}

TEST_F(ProfilerTest, OnlyTheEnablingThreadRecords) {
  std::thread helper([] {
    ProfileScope scope(ProfileCategory::transfer);
    busy_for(std::chrono::milliseconds(20));
  });
  helper.join();
  EXPECT_EQ(Profiler::seconds(ProfileCategory::transfer), 0.0);
  {
    ProfileScope scope(ProfileCategory::transfer);
    busy_for(std::chrono::milliseconds(5));
  }
  EXPECT_GT(Profiler::seconds(ProfileCategory::transfer), 0.0);
}

TEST_F(ProfilerTest, ReportNamesTheRemainder) {
  {
    ProfileScope scope(ProfileCategory::comm);
    busy_for(std::chrono::milliseconds(5));
  }
  const double wall_s = 1.0;
  EXPECT_NE(Profiler::report(wall_s, 1).find(", other "), std::string::npos);
  const std::string gpu = Profiler::report(wall_s, 1, "device compute and launches");
  EXPECT_NE(gpu.find(", device compute and launches "), std::string::npos) << gpu;
  EXPECT_EQ(gpu.find("other"), std::string::npos) << gpu;
  EXPECT_NE(gpu.find("comm "), std::string::npos) << gpu;
}

// A device whose clock the test sets: each point is marked at `now`.
class FakeTimeline final : public DeviceTimeline {
 public:
  double now = 0.0;
  int resolved = 0;
  uint32_t mark() override {
    points_.push_back(now);
    return static_cast<uint32_t>(points_.size() - 1);
  }
  double seconds_between(uint32_t earlier, uint32_t later) override {
    ++resolved;
    return points_.at(later) - points_.at(earlier);
  }
  void wait_for(uint32_t point) override {
    (void)points_.at(point);
    waited_for.push_back(point);
  }
  std::vector<uint32_t> waited_for;
  void clear() override { points_.clear(); }
  size_t points() const { return points_.size(); }

 private:
  std::vector<double> points_;
};

// Note [Exposed time]: on a device timeline a scope is the span between the points marked as it
// opens and closes, exclusive of its children's, resolved when settled.
TEST_F(ProfilerTest, ScopesOnADeviceTimeline) {
  FakeTimeline device;
  Profiler::set_device_timeline(&device);
  {
    ProfileScope optimizer(ProfileCategory::optimizer);
    device.now = 1.0;
    {
      ProfileScope copy(ProfileCategory::transfer);
      busy_for(std::chrono::milliseconds(20));  // the host's clock is not what counts
      device.now = 1.5;
    }
    device.now = 3.0;
  }
  EXPECT_EQ(device.points(), 4u);
  Profiler::wait_to_settle(3);  // three spans pending: not more than 3, no wait
  Profiler::settle(3);          // and kept
  EXPECT_EQ(device.resolved, 0);
  EXPECT_TRUE(device.waited_for.empty());
  Profiler::wait_to_settle(2);  // the wait alone, for the last point: nothing read yet
  EXPECT_EQ(device.waited_for, std::vector<uint32_t>{3});
  EXPECT_EQ(device.resolved, 0);
  Profiler::settle(2);
  EXPECT_EQ(device.resolved, 3);
  EXPECT_EQ(device.points(), 0u);  // cleared: the points are reused
  EXPECT_DOUBLE_EQ(Profiler::seconds(ProfileCategory::optimizer), 1.0 + 1.5);
  EXPECT_DOUBLE_EQ(Profiler::seconds(ProfileCategory::transfer), 0.5);
  {
    ProfileScope data(ProfileCategory::data);
    device.now = 3.25;
  }
  Profiler::set_device_timeline(nullptr);  // settles what is pending first
  EXPECT_DOUBLE_EQ(Profiler::seconds(ProfileCategory::data), 0.25);
  // The host's clock again.
  {
    ProfileScope data(ProfileCategory::data);
    busy_for(std::chrono::milliseconds(5));
  }
  EXPECT_GT(Profiler::seconds(ProfileCategory::data), 0.25);
  EXPECT_EQ(device.points(), 0u);
}

// Note [Device compute itemized]: a DeviceWorkScope times nothing (marks no point) unless the
// profiler itemizes device work; then it is a scope of its category on the timeline, split
// exclusively by the scopes nested in it, and its host time is not the category's work.
TEST_F(ProfilerTest, DeviceWorkScopesOnlyWhenItemized) {
  FakeTimeline device;
  Profiler::set_device_timeline(&device);
  {
    const DeviceWorkScope linear(ProfileCategory::elementwise);
    device.now = 1.0;
  }
  EXPECT_EQ(device.points(), 0u);
  Profiler::set_itemize_device_work(true);
  {
    const DeviceWorkScope linear(ProfileCategory::elementwise);  // a linear: bias pass, then its GEMM
    device.now = 1.25;
    {
      const DeviceWorkScope gemm(ProfileCategory::gemm);
      busy_for(std::chrono::milliseconds(5));  // the host's launch time: not work
      device.now = 3.25;
    }
  }
  Profiler::set_itemize_device_work(false);
  EXPECT_EQ(device.points(), 4u);
  // Another thread never itemizes (it reads nothing the driver writes).
  Profiler::set_itemize_device_work(true);
  std::thread([&] { EXPECT_FALSE(Profiler::itemizes_here()); }).join();
  EXPECT_TRUE(Profiler::itemizes_here());
  Profiler::set_itemize_device_work(false);
  Profiler::set_device_timeline(nullptr);
  EXPECT_DOUBLE_EQ(Profiler::seconds(ProfileCategory::elementwise), 0.25);
  EXPECT_DOUBLE_EQ(Profiler::seconds(ProfileCategory::gemm), 2.0);
  EXPECT_EQ(Profiler::work_seconds(ProfileCategory::gemm), 0.0);
  EXPECT_EQ(Profiler::work_seconds(ProfileCategory::elementwise), 0.0);
  const std::string gpu = Profiler::report(4.0, 1, "launches and gaps");
  EXPECT_NE(gpu.find("gemm 50.0% (2000.0 ms/step)"), std::string::npos) << gpu;
  EXPECT_NE(gpu.find(", launches and gaps 43.8% (1750.0 ms/step)"), std::string::npos) << gpu;
}

// The work beside the exposed time: a wait for a helper's work is exposed but not work; the
// helper's work, reported by the driver, is; what the exposed time does not account for was hidden.
TEST_F(ProfilerTest, HiddenShareOfWorkDoneBeside) {
  FakeTimeline device;
  Profiler::set_device_timeline(&device);
  {
    ProfileScope wait(ProfileCategory::optimizer, /*waits_for_work=*/true);
    device.now = 0.5;  // the device waited 0.5 s for the helper
  }
  const auto now = std::chrono::steady_clock::now();
  Profiler::add_work(ProfileCategory::optimizer, now, now + std::chrono::seconds(2));  // the helper worked 2 s
  EXPECT_DOUBLE_EQ(Profiler::seconds(ProfileCategory::optimizer), 0.5);
  EXPECT_DOUBLE_EQ(Profiler::work_seconds(ProfileCategory::optimizer), 2.0);
  EXPECT_DOUBLE_EQ(Profiler::hidden_share(ProfileCategory::optimizer), 0.75);
  EXPECT_NE(Profiler::report(4.0, 1).find("optimizer 12.5% (500.0 ms/step; 75.0% of its 2000.0 ms/step of work hidden)"),
            std::string::npos)
      << Profiler::report(4.0, 1);
  // A category whose exposed time is its work (or more: a GPU's own kernels) hid nothing.
  {
    ProfileScope copy(ProfileCategory::transfer);
    device.now = 1.5;
  }
  EXPECT_EQ(Profiler::hidden_share(ProfileCategory::transfer), 0.0);
  Profiler::set_device_timeline(nullptr);
  // Work reported from a thread that is not the driver is not recorded.
  std::thread helper([now] { Profiler::add_work(ProfileCategory::optimizer, now, now + std::chrono::seconds(5)); });
  helper.join();
  EXPECT_DOUBLE_EQ(Profiler::work_seconds(ProfileCategory::optimizer), 2.0);
  // Of work begun before a reset (a delayed update started at the end of the step before), the
  // part after it counts.
  const auto before = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  Profiler::reset();
  const auto reset_at = std::chrono::steady_clock::now();
  Profiler::add_work(ProfileCategory::optimizer, before, before + std::chrono::seconds(1));  // all before
  EXPECT_EQ(Profiler::work_seconds(ProfileCategory::optimizer), 0.0);
  Profiler::add_work(ProfileCategory::optimizer, before, reset_at + std::chrono::seconds(3));
  EXPECT_GE(Profiler::work_seconds(ProfileCategory::optimizer), 3.0);
  EXPECT_LT(Profiler::work_seconds(ProfileCategory::optimizer), 3.5);
  Profiler::reset();
  Profiler::add_work(ProfileCategory::optimizer, reset_at + std::chrono::seconds(1), reset_at + std::chrono::seconds(4));
  EXPECT_DOUBLE_EQ(Profiler::work_seconds(ProfileCategory::optimizer), 3.0);
  // All of it hidden: still listed, with its work.
  EXPECT_NE(Profiler::report(6.0, 1).find("optimizer 0.0% (0.0 ms/step; 100.0% of its 3000.0 ms/step of work hidden)"),
            std::string::npos)
      << Profiler::report(6.0, 1);
}

}  // namespace
}  // namespace zerone
