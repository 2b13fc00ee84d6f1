#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <vector>

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

// A stream of a fake asynchronous device: work is queued and runs only when the test says so
// (run_until) or when the host waits on one of its events (which runs the queue up to the event,
// as a real host wait lets the device get there). It proves Note [Pooled reuse after last use]
// without a device: a buffer handed out while queued work still writes it would be clobbered.
class FakeStream {
 public:
  // Queues `work`; returns its position.
  size_t submit(std::function<void()> work) {
    queue_.push_back(std::move(work));
    return queue_.size();
  }
  // The event after everything queued so far (Backend::record).
  Event record() { return Event(std::make_shared<const Mark>(this, queue_.size())); }
  void run_until(size_t position) {
    while (done_ < position) queue_[done_++]();
  }
  size_t done() const { return done_; }
  int host_waits = 0;

 private:
  struct Mark final : Event::Impl {
    Mark(FakeStream* s, size_t p) : stream(s), position(p) {}
    bool ready() const override { return stream->done_ >= position; }
    void wait() const override {
      ++stream->host_waits;
      stream->run_until(position);
    }
    FakeStream* stream;
    size_t position;
  };
  std::vector<std::function<void()>> queue_;
  size_t done_ = 0;
};

TEST(BufferPool, ReusesABufferOnlyAfterItsLastUseOnEveryStreamFinished) {
  FakeStream compute, comm;  // outlive the pools, which wait for them when they go
  BufferPool pool(1 << 20, MemCategory::comm);
  auto fill_later = [](FakeStream& s, Buffer& b, unsigned char value) {
    unsigned char* p = b.as<unsigned char>();
    const size_t n = b.bytes();
    s.submit([=] { std::memset(p, value, n); });
  };

  // The only candidate is still being written by the comm stream: acquire waits for that write,
  // so the new owner's bytes are never overwritten by it afterwards.
  Buffer a = pool.acquire(4096, MemCategory::grad, false);
  void* a_memory = a.data();
  fill_later(comm, a, 0xAB);
  pool.release(std::move(a), {compute.record(), comm.record()});  // compute's use is complete
  EXPECT_EQ(comm.done(), 0u);
  Buffer again = pool.acquire(4096, MemCategory::grad, /*zeroed=*/false);
  EXPECT_EQ(again.data(), a_memory);
  EXPECT_EQ(comm.done(), 1u);  // the queued write ran before the buffer came back
  EXPECT_EQ(comm.host_waits, 1);
  std::memset(again.data(), 0x11, 4096);
  comm.run_until(1);  // nothing left to run into it
  EXPECT_EQ(again.as<unsigned char>()[4095], 0x11);

  // A settled candidate is preferred to one still in use: no wait at all.
  Buffer busy = pool.acquire(8192, MemCategory::grad, false), free_one = pool.acquire(8192, MemCategory::grad, false);
  void* free_memory = free_one.data();
  fill_later(comm, busy, 0xCD);
  pool.release(std::move(busy), {comm.record()});          // released first, still in use
  pool.release(std::move(free_one), {compute.record()});   // compute has nothing queued: complete
  const size_t comm_before = comm.done();
  Buffer got = pool.acquire(8192, MemCategory::grad, false);
  EXPECT_EQ(got.data(), free_memory);
  EXPECT_EQ(comm.host_waits, 1);  // unchanged
  EXPECT_EQ(comm.done(), comm_before);

  // Between equal candidates both in use, the oldest is waited for, and only its stream runs.
  Buffer first = pool.acquire(512, MemCategory::grad, false), second = pool.acquire(512, MemCategory::grad, false);
  void* first_memory = first.data();
  fill_later(compute, first, 1);
  pool.release(std::move(first), {compute.record()});
  fill_later(comm, second, 2);
  pool.release(std::move(second), {comm.record()});
  const size_t comm_done = comm.done();
  Buffer oldest = pool.acquire(512, MemCategory::grad, false);
  EXPECT_EQ(oldest.data(), first_memory);
  EXPECT_EQ(comm.done(), comm_done);  // the other stream was not waited for

  // Freeing waits too: over capacity at release, and clear().
  BufferPool small(100, MemCategory::comm);
  Buffer big(4096, MemCategory::grad);
  fill_later(comm, big, 3);
  const int comm_waits = comm.host_waits;
  small.release(std::move(big), {comm.record()});  // does not fit: freed, after its write ran
  EXPECT_EQ(comm.host_waits, comm_waits + 1);
  EXPECT_TRUE(comm.record().ready());
  EXPECT_EQ(small.idle_bytes(), 0u);
  Buffer kept = small.acquire(64, MemCategory::grad, false);
  fill_later(compute, kept, 4);
  const int compute_waits = compute.host_waits;
  small.release(std::move(kept), {compute.record()});
  EXPECT_EQ(small.idle_bytes(), 64u);
  EXPECT_EQ(compute.host_waits, compute_waits);  // kept idle: no wait yet
  small.clear();
  EXPECT_EQ(compute.host_waits, compute_waits + 1);
  EXPECT_TRUE(compute.record().ready());
}

// Note [Pooled reuse in stream order]: with an ordering callback a device pool hands out a buffer
// still in use without the host waiting, after ordering the streams behind each of its last uses;
// a host pool (the host may write what it acquires) still waits.
TEST(BufferPool, OrdersReuseOnTheStreamsInsteadOfWaitingForDeviceBuffers) {
  FakeStream comm;
  std::vector<const Event::Impl*> ordered_after;
  BufferPool device(1 << 20, MemCategory::comm, MemPlace::device), host(1 << 20, MemCategory::comm, MemPlace::host);
  for (BufferPool* pool : {&device, &host})
    pool->order_reuse_by([&](const Event& e) { ordered_after.push_back(e.impl()); });
  Buffer a = device.acquire(4096, MemCategory::grad, false);
  void* a_memory = a.data();
  comm.submit([] {});
  const Event last_use = comm.record();
  device.release(std::move(a), {last_use});
  Buffer again = device.acquire(4096, MemCategory::grad, false);
  EXPECT_EQ(again.data(), a_memory);
  EXPECT_EQ(comm.host_waits, 0);
  EXPECT_EQ(comm.done(), 0u);  // still queued: the streams wait for it, not the host
  ASSERT_EQ(ordered_after.size(), 1u);
  EXPECT_EQ(ordered_after[0], last_use.impl());
  // A settled one needs no ordering.
  device.release(std::move(again), {Event()});
  Buffer settled = device.acquire(4096, MemCategory::grad, false);
  EXPECT_EQ(ordered_after.size(), 1u);

  Buffer h = host.acquire(4096, MemCategory::grad, false);
  comm.submit([] {});
  host.release(std::move(h), {comm.record()});
  Buffer h_again = host.acquire(4096, MemCategory::grad, false);
  EXPECT_EQ(comm.host_waits, 1);
  EXPECT_EQ(ordered_after.size(), 1u);
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
