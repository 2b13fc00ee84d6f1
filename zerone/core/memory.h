// Memory ledger and tagged buffers.
//
// Every byte the engine allocates for training state goes through a Buffer, which is tagged with a
// category (what it holds) and a place (where it lives). The process-wide MemoryLedger keeps the
// current and peak bytes for each (place, category); the trainer reports them per step in the
// metrics `mem` field and `zerone estimate` predicts the same figures from the same arithmetic
// (DESIGN §2).
//
// Note [Places]: `device` is where compute reads and writes (on this CPU build an accounted arena of
// host memory with an optional cap, --device-mem-limit; a GPU backend would plug its allocator in
// through MemoryArena); `host` is memory the offloaded optimizer step and parameter shards live in
// (ZeRO-Offload); `nvme` is swap-file bytes (ZeRO-Infinity), recorded in the ledger by the swap
// engine, never allocated through a Buffer. Without offload every engine buffer is on the device.
//
// Thread-safety: the ledger is safe to update and read from any thread (atomics). A Buffer is a
// plain owning handle: one owner, movable, not copyable; its memory is not synchronized. Arenas and
// the device limit are set once at start-up, before any Buffer exists (not synchronized).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/event.h"

namespace zerone {

// `swap`: staging buffers of the NVMe swap engine (optimizer sub-groups in transit).
enum class MemCategory : uint8_t { param, grad, master, optim, activation, comm, scratch, swap, kCount };
enum class MemPlace : uint8_t { device, host, nvme, kCount };

const char* mem_category_name(MemCategory category);
const char* mem_place_name(MemPlace place);

class MemoryLedger {
 public:
  static constexpr size_t kCategories = static_cast<size_t>(MemCategory::kCount);
  static constexpr size_t kPlaces = static_cast<size_t>(MemPlace::kCount);

  // The process-wide ledger.
  static MemoryLedger& global();

  void add(MemPlace place, MemCategory category, int64_t bytes);
  void sub(MemPlace place, MemCategory category, int64_t bytes);
  int64_t current(MemPlace place, MemCategory category) const;
  int64_t peak(MemPlace place, MemCategory category) const;
  // Sum of current bytes over all categories of `place`.
  int64_t current_total(MemPlace place) const;
  // Forgets peaks (sets them to the current values). Used between benchmark phases.
  void reset_peaks();

 private:
  struct Slot {
    std::atomic<int64_t> current{0};
    std::atomic<int64_t> peak{0};
  };
  Slot& slot(MemPlace place, MemCategory category) {
    return slots_[static_cast<size_t>(place) * kCategories + static_cast<size_t>(category)];
  }
  const Slot& slot(MemPlace place, MemCategory category) const {
    return slots_[static_cast<size_t>(place) * kCategories + static_cast<size_t>(category)];
  }
  std::array<Slot, kCategories * kPlaces> slots_;
};

// Where a place's bytes come from. The default arena of `device` and `host` is aligned_alloc (this
// CPU build); a CUDA build would install a device arena (cudaMalloc) and a pinned host arena here.
// allocate() returns zero-filled memory or nullptr when out of memory; deallocate() takes back
// exactly what allocate returned, with the same size and alignment.
class MemoryArena {
 public:
  virtual ~MemoryArena() = default;
  virtual void* allocate(size_t bytes, size_t alignment) = 0;
  virtual void deallocate(void* data, size_t bytes, size_t alignment) noexcept = 0;
  // data (bytes, inside an allocation of this arena) = 0. An arena whose memory the host cannot
  // touch (a device's) zeroes it its own way.
  virtual void zero(void* data, size_t bytes);
};
// The arena of host memory (aligned_alloc): the default of both places.
MemoryArena& default_arena();
// The arena of `place` (device or host). set_arena installs another (null: the default); the arena
// must outlive every Buffer allocated from it.
MemoryArena& arena(MemPlace place);
// Note [Host state in pageable memory]: the arena a Buffer of `category` in `place` comes from:
// arena(place), except that the optimizer's master copy and moments on the host (categories master
// and optim) always come from default_arena(). Only host code reads and writes them (copies to and
// from the device go through scratch and staging buffers), so pinning them would buy nothing, and
// a host arena that pins (the CUDA backend's, Note [Pinned host memory]) would lock most of the
// machine's memory and spend minutes at start-up pinning it: 80 GiB of Llama-2-7B's offloaded state.
MemoryArena& arena_for(MemPlace place, MemCategory category);
// Zero-fills `bytes` at `data` (host memory), on every OpenMP thread when large: a new
// allocation's pages are first touched here, and the kernel clears each page as it is touched, so
// one thread zeroing tens of GiB is what would bound a large model's start-up.
void zero_fill(void* data, size_t bytes);
void set_arena(MemPlace place, MemoryArena* arena);

// The device cap (bytes; 0: none). Buffer refuses a device allocation that would take the device
// ledger total past it (an Error naming the category and the cap), so a plan the estimate let
// through can never silently exceed it.
void set_device_limit_bytes(int64_t limit_bytes);
int64_t device_limit_bytes();

// Peak resident set size of this process in bytes (getrusage), or 0 if unknown.
int64_t peak_rss_bytes();

// Bytes for people: "512 B", "12.3 MiB" (powers of 1024, one decimal above bytes).
std::string human_bytes(double bytes);

// An owning allocation from the arena of `place` (device or host; arena_for), `alignment`-byte aligned (a power
// of two, at least 64; 4096 for O_DIRECT I/O), recorded in the global ledger. Zero-initialized.
// Allocation failure, or a device allocation beyond the device cap, throws Error naming the size
// and category (an out-of-memory is a user-facing condition: the model or batch is too large).
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, MemCategory category, MemPlace place = MemPlace::device, size_t alignment = 64);
  // The same from a given arena, accounted under `place`: the cpu kernels' own scratch is host
  // memory (default_arena()) whichever device they run for, and counts as that device's scratch.
  Buffer(size_t bytes, MemCategory category, MemPlace place, size_t alignment, MemoryArena& from);
  ~Buffer();
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T> T* as() { return static_cast<T*>(data_); }
  template <typename T> const T* as() const { return static_cast<const T*>(data_); }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  MemPlace place() const { return place_; }
  bool empty() const { return data_ == nullptr; }
  // Sets every byte to 0 through the arena of its place (device memory may not be host-writable).
  void zero();
  // Frees the memory now (the ledger drops it); the buffer becomes empty.
  void reset();
  // Moves the buffer's bytes to another category in the ledger (same memory, new purpose).
  void retag(MemCategory category);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::scratch;
  MemPlace place_ = MemPlace::device;
  size_t alignment_ = 64;
  MemoryArena* arena_ = nullptr;  // where data_ came from (given back there)
};

// Note [Working-set pool]: ZeRO stages 2-3 hold a unit's full gradients and gathered parameters
// only while the unit is used, several times per micro-step. Allocating them fresh each time costs
// a new mapping, a page fault and kernel zeroing per 4 KiB page, and an unmap (Note [Returning
// memory]); on a small model that was 10-20% of the step. The pool keeps released buffers for
// reuse, keyed by exact size (units of one model come in few sizes), up to `capacity_bytes`: the
// engine sets it to its working-set bound, so a burst (a checkpoint gathering every unit) is
// returned to the system instead of pinned. Idle buffers stay in the ledger under `idle_category`.
//
// Note [Pooled reuse after last use]: on a device whose streams run asynchronously a released
// buffer may still be read or written by work already queued (a kernel on the compute stream, a
// collective on the comm stream). The user releases it with the events of its last use on each
// stream that used it (kernels::Backend::record after that use); the pool hands it out again, or
// frees it, only once every one of them completed. acquire() prefers an idle buffer whose uses
// are all complete; when every candidate is still in use it waits (the host, Event::wait) for the
// oldest, or, where an ordering callback is set, hands the oldest out behind its last uses on the
// streams (Note [Pooled reuse in stream order], memory.cc). Events without a backend handle (complete by construction) are not kept, so on the
// inline backends (cpu, sim), whose recorded events are such, the pool behaves as without events;
// the others are first asked at acquire(), not at release (asking a simulated copy's event runs
// the copy, which would hide a missing wait of the buffer's owner: Note [Deferred copies]), except
// when the release frees the buffer (beyond the capacity), which must wait for them.
//
// Thread-safety: none; one owner (the training thread).
class BufferPool {
 public:
  // New buffers come from `place`, `alignment`-byte aligned (Buffer's rules).
  BufferPool(size_t capacity_bytes, MemCategory idle_category, MemPlace place = MemPlace::device, size_t alignment = 64);
  ~BufferPool() { clear(); }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of exactly `bytes` tagged `category`: a kept one if there is one (zero-filled first
  // when `zeroed`), after its last uses completed (Note [Pooled reuse after last use]), else a
  // new (zeroed) one. Throws Error like Buffer when memory runs out.
  Buffer acquire(size_t bytes, MemCategory category, bool zeroed);
  // Takes `buffer` back for reuse, or frees it if that would exceed the capacity. `last_uses`:
  // the events of its last use on each stream that used it; the buffer is reused or freed only
  // after all of them completed (freeing waits for them). Empty buffer: no-op.
  void release(Buffer&& buffer, std::initializer_list<Event> last_uses = {});
  // Frees every idle buffer (after its last uses completed).
  void clear();
  // Note [Pooled reuse in stream order]: with `order_after` set, acquire() hands out a device
  // buffer whose last uses have not completed yet after calling order_after(e) for each of them,
  // instead of making the host wait; order_after must make every stream that will use the buffer
  // wait for e (the ZeRO engine: the device's compute and comm streams). Host buffers still wait.
  void order_reuse_by(std::function<void(const Event&)> order_after) { order_after_ = std::move(order_after); }
  size_t idle_bytes() const { return idle_bytes_; }
  size_t capacity_bytes() const { return capacity_bytes_; }

 private:
  size_t capacity_bytes_;
  MemCategory idle_category_;
  MemPlace place_;
  size_t alignment_;
  struct Idle {
    Buffer buffer;
    std::vector<Event> pending;  // last uses with a backend handle, until acquire() finds them complete
    // True when every last use completed (drops the ones that did).
    bool settled();
    void wait_settled();
  };
  std::multimap<size_t, Idle> idle_;  // by bytes; equal sizes in release order
  size_t idle_bytes_ = 0;
  std::function<void(const Event&)> order_after_;  // Note [Pooled reuse in stream order]
};

}  // namespace zerone
