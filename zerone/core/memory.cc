#include "zerone/core/memory.h"

#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "zerone/core/error.h"

namespace zerone {

const char* mem_category_name(MemCategory category) {
  static const char* names[] = {"param", "grad", "master", "optim", "activation", "comm", "scratch", "swap"};
  ZERONE_ASSERT(category < MemCategory::kCount);
  return names[static_cast<size_t>(category)];
}

const char* mem_place_name(MemPlace place) {
  static const char* names[] = {"device", "host", "nvme"};
  ZERONE_ASSERT(place < MemPlace::kCount);
  return names[static_cast<size_t>(place)];
}

MemoryLedger& MemoryLedger::global() {
  static MemoryLedger ledger;
  return ledger;
}

void MemoryLedger::add(MemPlace place, MemCategory category, int64_t bytes) {
  Slot& s = slot(place, category);
  int64_t now = s.current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t prev = s.peak.load(std::memory_order_relaxed);
  while (now > prev && !s.peak.compare_exchange_weak(prev, now, std::memory_order_relaxed)) {
  }
}

void MemoryLedger::sub(MemPlace place, MemCategory category, int64_t bytes) {
  int64_t now = slot(place, category).current.fetch_sub(bytes, std::memory_order_relaxed) - bytes;
  ZERONE_ASSERT(now >= 0, "ledger underflow for ", mem_place_name(place), ".", mem_category_name(category));
}

int64_t MemoryLedger::current(MemPlace place, MemCategory category) const {
  return slot(place, category).current.load(std::memory_order_relaxed);
}

int64_t MemoryLedger::peak(MemPlace place, MemCategory category) const {
  return slot(place, category).peak.load(std::memory_order_relaxed);
}

int64_t MemoryLedger::current_total(MemPlace place) const {
  int64_t total = 0;
  for (size_t c = 0; c < kCategories; ++c) total += current(place, static_cast<MemCategory>(c));
  return total;
}

void MemoryLedger::reset_peaks() {
  for (auto& s : slots_) s.peak.store(s.current.load());
}

int64_t peak_rss_bytes() {
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

// Note [Returning memory]: ZeRO frees gathered parameters and full gradients as soon as they are
// used, and the point is that the process shrinks. glibc raises its mmap threshold dynamically
// after large frees, after which such blocks come from the heap and stay resident. Pinning the
// threshold keeps every large buffer in its own mapping, returned to the system on free, so RSS
// follows the ledger.
static const bool kMmapThresholdPinned = [] { return mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1; }();

namespace {

class AlignedAllocArena final : public MemoryArena {
 public:
  void* allocate(size_t bytes, size_t alignment) override {
    size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* data = std::aligned_alloc(alignment, rounded);
    if (data != nullptr) zero_fill(data, rounded);
    return data;
  }
  void deallocate(void* data, size_t, size_t) noexcept override { std::free(data); }
};

AlignedAllocArena g_default_arena;
MemoryArena* g_arenas[2] = {&g_default_arena, &g_default_arena};  // device, host
int64_t g_device_limit_bytes = 0;

}  // namespace

void zero_fill(void* data, size_t bytes) {
  constexpr size_t kChunkBytes = size_t{4} << 20, kParallelBytes = size_t{64} << 20;
  if (bytes < kParallelBytes || omp_in_parallel()) {
    if (bytes > 0) std::memset(data, 0, bytes);
    return;
  }
  const int64_t chunks = static_cast<int64_t>((bytes + kChunkBytes - 1) / kChunkBytes);
  char* base = static_cast<char*>(data);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kChunkBytes;
    std::memset(base + begin, 0, std::min(kChunkBytes, bytes - begin));
  }
}

void MemoryArena::zero(void* data, size_t bytes) { zero_fill(data, bytes); }

MemoryArena& default_arena() { return g_default_arena; }

MemoryArena& arena(MemPlace place) {
  ZERONE_ASSERT(place == MemPlace::device || place == MemPlace::host, "no memory arena for place ",
                mem_place_name(place));
  return *g_arenas[static_cast<size_t>(place)];
}

MemoryArena& arena_for(MemPlace place, MemCategory category) {
  // Note [Host state in pageable memory].
  if (place == MemPlace::host && (category == MemCategory::master || category == MemCategory::optim))
    return g_default_arena;
  return arena(place);
}

void set_arena(MemPlace place, MemoryArena* arena) {
  ZERONE_ASSERT(place == MemPlace::device || place == MemPlace::host);
  g_arenas[static_cast<size_t>(place)] = arena != nullptr ? arena : &g_default_arena;
}

void set_device_limit_bytes(int64_t limit_bytes) { g_device_limit_bytes = limit_bytes; }
int64_t device_limit_bytes() { return g_device_limit_bytes; }

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

Buffer::Buffer(size_t bytes, MemCategory category, MemPlace place, size_t alignment)
    : Buffer(bytes, category, place, alignment, arena_for(place, category)) {}

Buffer::Buffer(size_t bytes, MemCategory category, MemPlace place, size_t alignment, MemoryArena& from)
    : bytes_(bytes), category_(category), place_(place), alignment_(alignment), arena_(&from) {
  (void)kMmapThresholdPinned;
  ZERONE_ASSERT(alignment >= 64 && (alignment & (alignment - 1)) == 0, "bad alignment ", alignment);
  if (bytes == 0) return;
  if (place == MemPlace::device && g_device_limit_bytes > 0) {
    const int64_t in_use = MemoryLedger::global().current_total(MemPlace::device);
    ZERONE_CHECK(in_use + static_cast<int64_t>(bytes) <= g_device_limit_bytes, "device memory limit exceeded: ",
                 bytes, " more bytes of ", mem_category_name(category), " on top of ", in_use, " in use would pass ",
                 "--device-mem-limit (", g_device_limit_bytes, " bytes); zerone estimate shows what fits");
  }
  data_ = arena_->allocate(bytes, alignment);
  ZERONE_CHECK(data_ != nullptr, "out of memory: could not allocate ", bytes, " bytes for ",
               mem_category_name(category), " (try a smaller model, micro-batch or sequence length)");
  MemoryLedger::global().add(place_, category_, static_cast<int64_t>(bytes_));
}

Buffer::~Buffer() { reset(); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    category_ = other.category_;
    place_ = other.place_;
    alignment_ = other.alignment_;
    arena_ = other.arena_;
  }
  return *this;
}

void Buffer::reset() {
  if (data_ == nullptr) return;
  arena_->deallocate(data_, bytes_, alignment_);
  MemoryLedger::global().sub(place_, category_, static_cast<int64_t>(bytes_));
  data_ = nullptr;
  bytes_ = 0;
}

void Buffer::retag(MemCategory category) {
  if (data_ != nullptr && category != category_) {
    MemoryLedger::global().add(place_, category, static_cast<int64_t>(bytes_));
    MemoryLedger::global().sub(place_, category_, static_cast<int64_t>(bytes_));
  }
  category_ = category;
}

BufferPool::BufferPool(size_t capacity_bytes, MemCategory idle_category, MemPlace place, size_t alignment)
    : capacity_bytes_(capacity_bytes), idle_category_(idle_category), place_(place), alignment_(alignment) {}

void Buffer::zero() {
  if (data_ != nullptr) arena_->zero(data_, bytes_);
}

bool BufferPool::Idle::settled() {
  std::erase_if(pending, [](const Event& e) { return e.ready(); });
  return pending.empty();
}

void BufferPool::Idle::wait_settled() {
  for (const Event& e : pending) e.wait();
  pending.clear();
}

// Note [Pooled reuse in stream order]: on a GPU the host runs ahead of the device, so the last uses
// of a buffer released a unit ago are usually still queued when the next unit acquires one: the
// host waiting for them there stalled the queue once or twice a unit in the backward of stages
// 2-3 (the emulated GPU, whose copies to pinned memory land late, counts these waits:
// tests/zero/host_waits_emulated_test.cc). Every use of a device buffer is queued on a stream,
// so the reuse only has to come after the last uses in each stream's order: the streams that will
// use it wait for those events (cudaStreamWaitEvent), the host does not. Zero-filling runs on the
// device arena's stream, which is the compute stream, after that wait.
Buffer BufferPool::acquire(size_t bytes, MemCategory category, bool zeroed) {
  auto [first, last] = idle_.equal_range(bytes);
  if (first == last) return Buffer(bytes, category, place_, alignment_);
  // Note [Pooled reuse after last use]: the first settled one, else the oldest once it settles.
  auto it = first;
  while (it != last && !it->second.settled()) ++it;
  if (it == last) {
    it = first;
    if (order_after_ && place_ == MemPlace::device) {  // Note [Pooled reuse in stream order]
      for (const Event& e : it->second.pending) order_after_(e);
      it->second.pending.clear();
    } else {
      it->second.wait_settled();
    }
  }
  Buffer buffer = std::move(it->second.buffer);
  idle_.erase(it);
  idle_bytes_ -= bytes;
  buffer.retag(category);
  if (zeroed) buffer.zero();
  return buffer;
}

void BufferPool::release(Buffer&& buffer, std::initializer_list<Event> last_uses) {
  if (buffer.empty()) return;
  Idle idle{std::move(buffer), {}};
  // Not asked whether they are complete: asking may run work (Note [Deferred copies], kernels/sim/
  // sim_backend.h) that its owner has not waited for yet; acquire() asks when it needs the buffer.
  for (const Event& e : last_uses)
    if (e.impl() != nullptr) idle.pending.push_back(e);
  if (idle_bytes_ + idle.buffer.bytes() > capacity_bytes_) {
    idle.wait_settled();
    idle.buffer.reset();
    return;
  }
  idle.buffer.retag(idle_category_);
  const size_t bytes = idle.buffer.bytes();
  idle_bytes_ += bytes;
  idle_.emplace(bytes, std::move(idle));
}

void BufferPool::clear() {
  for (auto& [bytes, idle] : idle_) idle.wait_settled();
  idle_.clear();
  idle_bytes_ = 0;
}

}  // namespace zerone
