#include <gtest/gtest.h>

#include <cstring>

#include "zerone/core/error.h"
#include "zerone/core/memory.h"

namespace zerone {
namespace {

TEST(MemoryLedger, BuffersAreCountedWhileAliveAndPeakIsKept) {
  MemoryLedger& ledger = MemoryLedger::global();
  int64_t before = ledger.current(MemPlace::device, MemCategory::comm);
  ledger.reset_peaks();
  {
    Buffer a(1000, MemCategory::comm);
    Buffer b(24, MemCategory::comm);
    EXPECT_EQ(ledger.current(MemPlace::device, MemCategory::comm), before + 1024);
    Buffer moved = std::move(a);  // moving does not count twice
    EXPECT_EQ(ledger.current(MemPlace::device, MemCategory::comm), before + 1024);
    EXPECT_TRUE(a.empty());
    moved.reset();
    EXPECT_EQ(ledger.current(MemPlace::device, MemCategory::comm), before + 24);
  }
  EXPECT_EQ(ledger.current(MemPlace::device, MemCategory::comm), before);
  EXPECT_EQ(ledger.peak(MemPlace::device, MemCategory::comm), before + 1024);
}

TEST(Buffer, ZeroInitializedAndAligned) {
  Buffer b(4096, MemCategory::scratch);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(b.as<unsigned char>()[i], 0);
}

TEST(BufferPool, ReusesExactSizesRetagsAndKeepsNoMoreThanItsCapacity) {
  MemoryLedger& ledger = MemoryLedger::global();
  auto now = [&](MemCategory c) { return ledger.current(MemPlace::device, c); };
  const int64_t grad0 = now(MemCategory::grad), comm0 = now(MemCategory::comm);
  {
    BufferPool pool(3000, MemCategory::comm);
    Buffer a = pool.acquire(1024, MemCategory::grad, true);
    std::memset(a.data(), 7, 1024);
    void* a_memory = a.data();
    EXPECT_EQ(now(MemCategory::grad) - grad0, 1024);
    pool.release(std::move(a));
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(now(MemCategory::grad) - grad0, 0);  // idle bytes move to the pool's category
    EXPECT_EQ(now(MemCategory::comm) - comm0, 1024);
    EXPECT_EQ(pool.idle_bytes(), 1024u);

    Buffer other = pool.acquire(512, MemCategory::grad, true);  // another size: a new buffer
    EXPECT_EQ(pool.idle_bytes(), 1024u);
    Buffer b = pool.acquire(1024, MemCategory::param, true);   // same size: the kept one, zeroed
    EXPECT_EQ(b.data(), a_memory);
    EXPECT_EQ(b.category(), MemCategory::param);
    for (size_t i = 0; i < 1024; ++i) ASSERT_EQ(b.as<unsigned char>()[i], 0);
    std::memset(b.data(), 9, 1024);
    pool.release(std::move(b));
    Buffer c = pool.acquire(1024, MemCategory::param, /*zeroed=*/false);  // contents as left
    EXPECT_EQ(c.as<unsigned char>()[100], 9);

    Buffer big(2048, MemCategory::grad);
    pool.release(std::move(c));      // 1024 idle
    pool.release(std::move(other));  // 1536 idle
    pool.release(std::move(big));    // would be 3584 > 3000: freed instead
    EXPECT_EQ(pool.idle_bytes(), 1536u);
    EXPECT_EQ(now(MemCategory::comm) - comm0, 1536);
    pool.release(Buffer());  // empty: nothing
    pool.clear();
    EXPECT_EQ(now(MemCategory::comm) - comm0, 0);
  }
  EXPECT_EQ(now(MemCategory::grad), grad0);
  EXPECT_EQ(now(MemCategory::comm), comm0);
}

TEST(Buffer, AbsurdSizeThrowsInsteadOfCrashing) {
  EXPECT_THROW(Buffer(size_t{1} << 62, MemCategory::activation), Error);
}

TEST(Buffer, PlacesAreAccountedSeparatelyAndAligned) {
  MemoryLedger& ledger = MemoryLedger::global();
  int64_t host0 = ledger.current(MemPlace::host, MemCategory::swap);
  int64_t dev0 = ledger.current(MemPlace::device, MemCategory::swap);
  {
    Buffer b(10000, MemCategory::swap, MemPlace::host, 4096);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
    EXPECT_EQ(b.place(), MemPlace::host);
    EXPECT_EQ(ledger.current(MemPlace::host, MemCategory::swap), host0 + 10000);
    EXPECT_EQ(ledger.current(MemPlace::device, MemCategory::swap), dev0);
  }
  EXPECT_EQ(ledger.current(MemPlace::host, MemCategory::swap), host0);
}

TEST(Buffer, DeviceLimitRefusesBeyondTheCapButNotHost) {
  const int64_t in_use = MemoryLedger::global().current_total(MemPlace::device);
  set_device_limit_bytes(in_use + 4096);
  {
    Buffer fits(4096, MemCategory::param);
    EXPECT_THROW(Buffer(1, MemCategory::param), Error);
    Buffer host(1 << 20, MemCategory::optim, MemPlace::host);  // the cap is for the device only
  }
  set_device_limit_bytes(0);
  Buffer unlimited(1 << 20, MemCategory::param);
}

struct CountingArena final : MemoryArena {
  int live = 0;
  void* allocate(size_t bytes, size_t alignment) override {
    ++live;
    return arena(MemPlace::host).allocate(bytes, alignment);
  }
  void deallocate(void* data, size_t bytes, size_t alignment) noexcept override {
    --live;
    arena(MemPlace::host).deallocate(data, bytes, alignment);
  }
};

TEST(Buffer, AnotherArenaCanServeTheDevice) {
  CountingArena counting;
  set_arena(MemPlace::device, &counting);
  {
    Buffer b(100, MemCategory::param);
    EXPECT_EQ(counting.live, 1);
  }
  EXPECT_EQ(counting.live, 0);
  set_arena(MemPlace::device, nullptr);
}

}  // namespace
}  // namespace zerone
