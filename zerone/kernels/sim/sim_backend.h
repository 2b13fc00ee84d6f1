// The simulated device (kernels/backend.h, `--device sim`): device memory that host code cannot
// touch, so any access to device memory that does not go through the backend crashes at once.
//
// Note [Simulated device memory]: the device's memory is one memfd mapped twice. Buffers get
// addresses in the first mapping, which is PROT_NONE: the CPU faults on any load or store there.
// The backend alone knows the second, read-write mapping of the same pages; every operation
// translates its device operands into it (checking that each one is device memory) and runs the
// cpu kernels there, so results are bit for bit the cpu backend's. Each operand is checked over the
// whole range the operation touches: a range that runs past the bytes its allocation asked for
// aborts even inside the allocation's last page. Freed ranges are punched out of
// the memfd (the pages go back to the system and read as zero when handed out again), which keeps
// the arena's zero-fill contract without a host write.
//
// Note [Deferred copies]: copy_async (Note [Asynchronous copies], kernels/backend.h) with a host
// side is the latest schedule a GPU could run it in: the copy is queued per direction and runs
// when its event is first observed (ready(), wait(), or wait(stream, event)), or when a later copy
// of its direction that waits for it runs (a synchronous copy with a host side, synchronize()),
// queued copies of the direction first, in order. Meanwhile its destination holds 0xff bytes
// (a NaN in every float dtype). So a read of the destination before the event, or a write of the
// source after the call, changes what the engine computes, and the bit-for-bit comparisons with the
// cpu backend fail; a freed device operand aborts when the copy finally translates it.
// copies_deferred() counts them, for the tests that the asynchronous paths are taken.
//
// Thread-safety: as Backend. The arena is locked (the communication thread allocates staging);
// so is the queue of deferred copies.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "zerone/kernels/backend.h"
#include "zerone/kernels/cpu/cpu_backend.h"

namespace zerone::kernels::sim {

// The simulated device's memory (Note [Simulated device memory]).
class SimArena final : public MemoryArena {
 public:
  // Reserves `capacity_bytes` of address space (nothing resident until written). Throws Error
  // when the system refuses the memfd or the mappings.
  explicit SimArena(size_t capacity_bytes);
  ~SimArena() override;
  SimArena(const SimArena&) = delete;
  SimArena& operator=(const SimArena&) = delete;

  // Page-aligned, zero-filled ranges of the PROT_NONE mapping; nullptr when the range is full.
  void* allocate(size_t bytes, size_t alignment) override;
  void deallocate(void* data, size_t bytes, size_t alignment) noexcept override;
  void zero(void* data, size_t bytes) override;

  // True when p lies inside the device mapping (allocated or not): place_of's answer.
  bool contains(const void* p) const;
  // The backend's view of the device range [p, p + bytes). Aborts (an internal invariant), naming
  // `what`, when p is not device memory or when the range runs off the end of the allocation
  // holding p (Note [Operand ranges], kernels/cpu/cpu_backend.h).
  void* translate(const void* p, size_t bytes, const char* what) const;

 private:
  int fd_ = -1;
  size_t capacity_ = 0;
  char* device_ = nullptr;  // PROT_NONE view: what Buffers hold
  char* shadow_ = nullptr;  // read-write view: what the kernels touch
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  std::map<size_t, size_t> live_;  // offset -> bytes asked for, of every allocation in use
};

// The simulated device: the cpu backend's operations (written once, in cpu/cpu_backend.cc) with
// every device operand translated into the arena's private view, and copies that know both views.
class SimBackend final : public cpu::CpuBackend {
 public:
  SimBackend();
  DeviceKind kind() const override { return DeviceKind::sim; }
  std::string description() const override;
  bool host_addressable() const override { return false; }
  MemoryArena& device_arena() override { return arena_; }
  MemPlace place_of(const void* p) const override { return arena_.contains(p) ? MemPlace::device : MemPlace::host; }
  SimArena& arena() { return arena_; }
  // Checks that each side is where the caller says it is, then copies between the views (after
  // the deferred copies of its direction, Note [Deferred copies]).
  void copy(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) override;
  // Note [Deferred copies].
  Event copy_async(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) override;
  void wait(Stream stream, const Event& event) override { event.wait(); }
  void synchronize(Stream stream) override;
  // Copies deferred since the process started (a test's evidence that a path is asynchronous).
  uint64_t copies_deferred() const;
  // Runs the deferred copies of `direction` (0: to the device, 1: to the host) up to and including
  // number `through` (every one for UINT64_MAX).
  void run_deferred(int direction, uint64_t through);

 protected:
  // Aborts (an internal invariant) when [p, p + bytes) is not inside one live device allocation
  // (Note [Operand ranges] in kernels/cpu/cpu_backend.h).
  void* operand(const void* p, size_t bytes) const override { return arena_.translate(p, bytes, "operand"); }

 private:
  struct DeferredCopy {
    uint64_t number;
    void* dst;
    MemPlace dst_place;
    const void* src;
    MemPlace src_place;
    size_t bytes;
  };
  void copy_now(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes);
  SimArena arena_;
  mutable std::mutex deferred_mutex_;
  std::deque<DeferredCopy> deferred_[2];  // by direction: to the device, to the host
  uint64_t copies_deferred_ = 0;
};

}  // namespace zerone::kernels::sim
