#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "zerone/core/memory.h"
#include "zerone/core/rng.h"

namespace zerone {
namespace {

// Note [Parallel initialization]: the threads' fill is the sequential stream's values, bit for bit,
// at sizes that run in parallel and at ones that do not.
TEST(Rng, ParallelFillsAreTheSequentialStream) {
  for (size_t n : {size_t{7}, size_t{1} << 16, (size_t{1} << 18) + 13}) {
    std::vector<float> normal(n), uniform(n);
    fill_normal(normal.data(), n, 1234, 77, 0.02);
    fill_symmetric_uniform(uniform.data(), n, 1234, 78, 0.125);
    Rng a(1234, 77), b(1234, 78);
    for (size_t i = 0; i < n; ++i) {
      const float want_normal = static_cast<float>(a.normal() * 0.02);
      const float want_uniform = static_cast<float>((2.0 * b.uniform() - 1.0) * 0.125);
      ASSERT_EQ(std::memcmp(&normal[i], &want_normal, sizeof(float)), 0) << "normal " << i << " of " << n;
      ASSERT_EQ(std::memcmp(&uniform[i], &want_uniform, sizeof(float)), 0) << "uniform " << i << " of " << n;
    }
  }
}

TEST(Memory, LargeZeroFillsReachEveryByte) {
  // Above the parallel threshold, with a tail shorter than a chunk.
  const size_t bytes = (size_t{64} << 20) + 4096 + 3;
  std::vector<unsigned char> data(bytes, 0xab);
  zero_fill(data.data(), bytes);
  for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(data[i], 0) << i;
  EXPECT_EQ(data[bytes - 1], 0);
  EXPECT_EQ(data[(size_t{4} << 20) - 1], 0);
}

TEST(Memory, HostOptimizerStateIsPageable) {
  // Note [Host state in pageable memory]: master and moments on the host come from the default
  // arena whatever host arena is installed; the rest of the host's Buffers from that arena.
  struct CountingArena final : MemoryArena {
    int allocations = 0;
    void* allocate(size_t bytes, size_t alignment) override {
      ++allocations;
      return default_arena().allocate(bytes, alignment);
    }
    void deallocate(void* data, size_t bytes, size_t alignment) noexcept override {
      default_arena().deallocate(data, bytes, alignment);
    }
  } counting;
  set_arena(MemPlace::host, &counting);
  {
    Buffer master(4096, MemCategory::master, MemPlace::host), optim(4096, MemCategory::optim, MemPlace::host);
    EXPECT_EQ(counting.allocations, 0);
    Buffer grad(4096, MemCategory::grad, MemPlace::host), swap(4096, MemCategory::swap, MemPlace::host);
    EXPECT_EQ(counting.allocations, 2);
    Buffer device_master(4096, MemCategory::master, MemPlace::device);
    EXPECT_EQ(counting.allocations, 2);
  }
  set_arena(MemPlace::host, nullptr);
}

}  // namespace
}  // namespace zerone
