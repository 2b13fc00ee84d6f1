#include "zerone/kernels/sim/sim_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"

namespace zerone::kernels::sim {

namespace {
constexpr size_t kPage = 4096;
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

SimArena::SimArena(size_t capacity_bytes) : capacity_(round_up(capacity_bytes, kPage)) {
  fd_ = ::memfd_create("zerone-sim-device", MFD_CLOEXEC);
  ZERONE_CHECK(fd_ >= 0, "--device sim: memfd_create failed: ", std::strerror(errno));
  ZERONE_CHECK(::ftruncate(fd_, static_cast<off_t>(capacity_)) == 0, "--device sim: cannot size the simulated device to ",
               capacity_, " bytes: ", std::strerror(errno));
  void* device = ::mmap(nullptr, capacity_, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  void* shadow = ::mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  ZERONE_CHECK(device != MAP_FAILED && shadow != MAP_FAILED, "--device sim: cannot map the simulated device: ",
               std::strerror(errno));
  device_ = static_cast<char*>(device);
  shadow_ = static_cast<char*>(shadow);
  free_.emplace(0, capacity_);
}

SimArena::~SimArena() {
  if (device_) ::munmap(device_, capacity_);
  if (shadow_) ::munmap(shadow_, capacity_);
  if (fd_ >= 0) ::close(fd_);
}

void* SimArena::allocate(size_t bytes, size_t alignment) {
  const size_t need = round_up(std::max<size_t>(bytes, 1), kPage);
  ZERONE_ASSERT(alignment <= kPage, "sim: alignment ", alignment, " above a page");
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {  // first fit
    if (it->second < need) continue;
    const size_t offset = it->first, left = it->second - need;
    free_.erase(it);
    if (left > 0) free_.emplace(offset + need, left);
    live_.emplace(offset, bytes);
    return device_ + offset;
  }
  return nullptr;
}

void SimArena::deallocate(void* data, size_t bytes, size_t) noexcept {
  if (data == nullptr) return;
  const size_t offset = static_cast<char*>(data) - device_, size = round_up(std::max<size_t>(bytes, 1), kPage);
  // The pages go back to the system and read as zero next time (the arena's zero-fill contract).
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), static_cast<off_t>(size)) != 0)
    std::memset(shadow_ + offset, 0, size);
  std::lock_guard<std::mutex> lock(mutex_);
  live_.erase(offset);
  auto [it, inserted] = free_.emplace(offset, size);
  ZERONE_ASSERT(inserted, "sim: double free at device offset ", offset);
  if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

void SimArena::zero(void* data, size_t bytes) { std::memset(translate(data, bytes, "zero"), 0, bytes); }

bool SimArena::contains(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return c >= device_ && c < device_ + capacity_;
}

void* SimArena::translate(const void* p, size_t bytes, const char* what) const {
  if (!contains(p)) {
    // An internal invariant: a host pointer reached a device operand.
    std::fprintf(stderr, "zerone: internal error: --device sim: %s %p (%zu bytes) is not device memory\n", what, p, bytes);
    std::abort();
  }
  const size_t offset = static_cast<size_t>(static_cast<const char*>(p) - device_);
  size_t start = 0, size = 0;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = live_.upper_bound(offset); it != live_.begin()) {
      --it;
      start = it->first;
      size = it->second;
      found = offset - start <= size;  // one past the end holds an empty range
    }
  }
  if (!found) {
    std::fprintf(stderr, "zerone: internal error: --device sim: %s %p (%zu bytes) is not device memory in use\n", what,
                 p, bytes);
    std::abort();
  }
  if (bytes > size - (offset - start)) {
    // A range that runs past its allocation: a wrong shape or a short buffer.
    std::fprintf(stderr,
                 "zerone: internal error: --device sim: %s %p (%zu bytes) runs %zu bytes past its device allocation "
                 "(%zu bytes)\n",
                 what, p, bytes, bytes - (size - (offset - start)), size);
    std::abort();
  }
  return shadow_ + offset;
}

namespace {
// Address space reserved for the simulated device: twice the machine's memory, so that any run
// the cpu device can hold fits (nothing is resident until written).
size_t sim_capacity_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const size_t physical = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : size_t{64} << 30;
  return 2 * physical;
}
}  // namespace

SimBackend::SimBackend() : CpuBackend(TranslatesOperands{}), arena_(sim_capacity_bytes()) {}

std::string SimBackend::description() const {
  return str_cat("sim (simulated device over ", CpuBackend::description(), ")");
}

namespace {
// A deferred copy's event (Note [Deferred copies]): observing it runs the copy.
class DeferredCopyEvent final : public Event::Impl {
 public:
  DeferredCopyEvent(SimBackend& backend, int direction, uint64_t number)
      : backend_(backend), direction_(direction), number_(number) {}
  bool ready() const override {
    backend_.run_deferred(direction_, number_);
    return true;
  }
  void wait() const override { backend_.run_deferred(direction_, number_); }

 private:
  SimBackend& backend_;
  const int direction_;
  const uint64_t number_;
};
}  // namespace

Event SimBackend::copy_async(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) {
  if (bytes == 0 || dst_place == src_place) {  // on one side: ordered as any operation, at once
    copy(dst, dst_place, src, src_place, bytes);
    return Event();
  }
  const int direction = dst_place == MemPlace::device ? 0 : 1;
  void* d = dst_place == MemPlace::device ? arena_.translate(dst, bytes, "copy destination") : dst;
  if (dst_place != MemPlace::device) ZERONE_ASSERT(!arena_.contains(dst), "sim: copy to host memory given a device address");
  std::memset(d, 0xff, bytes);  // undefined until the event: NaN bytes
  std::lock_guard<std::mutex> lock(deferred_mutex_);
  const uint64_t number = ++copies_deferred_;
  deferred_[direction].push_back({number, dst, dst_place, src, src_place, bytes});
  return Event(std::make_shared<const DeferredCopyEvent>(*this, direction, number));
}

void SimBackend::run_deferred(int direction, uint64_t through) {
  std::lock_guard<std::mutex> lock(deferred_mutex_);
  std::deque<DeferredCopy>& queue = deferred_[direction];
  while (!queue.empty() && queue.front().number <= through) {
    const DeferredCopy c = queue.front();
    queue.pop_front();
    copy_now(c.dst, c.dst_place, c.src, c.src_place, c.bytes);
  }
}

void SimBackend::synchronize(Stream) {
  for (int direction : {0, 1}) run_deferred(direction, UINT64_MAX);
}

uint64_t SimBackend::copies_deferred() const {
  std::lock_guard<std::mutex> lock(deferred_mutex_);
  return copies_deferred_;
}

void SimBackend::copy(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) {
  // A copy with a host side runs on its direction's stream, after the copies deferred there.
  if (dst_place != src_place) run_deferred(dst_place == MemPlace::device ? 0 : 1, UINT64_MAX);
  copy_now(dst, dst_place, src, src_place, bytes);
}

void SimBackend::copy_now(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) {
  if (bytes == 0) return;
  void* d = dst_place == MemPlace::device ? arena_.translate(dst, bytes, "copy destination") : dst;
  const void* s = src_place == MemPlace::device ? arena_.translate(src, bytes, "copy source") : src;
  if (dst_place != MemPlace::device) ZERONE_ASSERT(!arena_.contains(dst), "sim: copy to host memory given a device address");
  if (src_place != MemPlace::device) ZERONE_ASSERT(!arena_.contains(src), "sim: copy from host memory given a device address");
  // Between host and device memory, the host waits for the copy (it runs it).
  std::optional<ProfileScope> profile;
  if (dst_place != src_place) profile.emplace(ProfileCategory::transfer);
  CpuBackend::copy(d, MemPlace::host, s, MemPlace::host, bytes);
}

}  // namespace zerone::kernels::sim
