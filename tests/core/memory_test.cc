#include <gtest/gtest.h>

#include "zerone/core/error.h"
#include "zerone/core/memory.h"

namespace zerone {
namespace {

TEST(MemoryLedger, BuffersAreCountedWhileAliveAndPeakIsKept) {
  MemoryLedger& ledger = MemoryLedger::global();
  int64_t before = ledger.current(MemPlace::host, MemCategory::comm);
  ledger.reset_peaks();
  {
    Buffer a(1000, MemCategory::comm);
    Buffer b(24, MemCategory::comm);
    EXPECT_EQ(ledger.current(MemPlace::host, MemCategory::comm), before + 1024);
    Buffer moved = std::move(a);  // moving does not count twice
    EXPECT_EQ(ledger.current(MemPlace::host, MemCategory::comm), before + 1024);
    EXPECT_TRUE(a.empty());
    moved.reset();
    EXPECT_EQ(ledger.current(MemPlace::host, MemCategory::comm), before + 24);
  }
  EXPECT_EQ(ledger.current(MemPlace::host, MemCategory::comm), before);
  EXPECT_EQ(ledger.peak(MemPlace::host, MemCategory::comm), before + 1024);
}

TEST(Buffer, ZeroInitializedAndAligned) {
  Buffer b(4096, MemCategory::scratch);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(b.as<unsigned char>()[i], 0);
}

TEST(Buffer, AbsurdSizeThrowsInsteadOfCrashing) {
  EXPECT_THROW(Buffer(size_t{1} << 62, MemCategory::activation), Error);
}

}  // namespace
}  // namespace zerone
