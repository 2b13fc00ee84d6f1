// Note [Emulated warps] (emulated_gpu.h): fibers, barriers and deferred copies.
#include "zerone/kernels/cuda/emulated_gpu.h"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "zerone/core/error.h"

namespace zerone::cuda::emulated {
namespace {

constexpr size_t kStackBytes = size_t{256} << 10;  // a thread's locals: register arrays of a few KiB
constexpr size_t kSlotBytes = 64;                   // the largest warp exchange (mma: 24 bytes)
constexpr unsigned char kUnwritten = 0xff;          // NaN in f32, bf16 and f16

// Note [Fiber switches]: a host thread keeps a worker per emulated thread of its largest block so
// far: a stack (with an inaccessible page below it, so that an overflow faults instead of writing
// over the next stack) whose fiber, started once by makecontext/swapcontext, runs thread after
// thread (one per block and launch) and waits between them. Every switch after the first is
// _setjmp/_longjmp, registers only: swapcontext and getcontext also save and restore the signal
// mask, a system call each, which made a fiber per thread and launch cost more than the kernels.
class Worker {
 public:
  Worker() : guard_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    void* p = mmap(nullptr, guard_ + kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ZERONE_ASSERT(p != MAP_FAILED, "emulated GPU: mmap of a fiber stack");
    ZERONE_ASSERT(mprotect(p, guard_, PROT_NONE) == 0, "emulated GPU: mprotect of a stack guard");
    base_ = static_cast<unsigned char*>(p);
  }
  ~Worker() { munmap(base_, guard_ + kStackBytes); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  unsigned char* stack_bottom() const { return base_ + guard_; }

  ucontext_t start;  // its first switch in
  jmp_buf idle_at;   // where it waits for its next thread, once started
  bool started = false;

 private:
  size_t guard_;
  unsigned char* base_ = nullptr;
};

struct Copy {
  void* dst;
  const void* src;
  size_t bytes, src_bytes;
};

struct Barrier {
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<int> waiting;  // the threads (numbers in the block) that arrived and wait
};

// The threads of a block that can run, lowest number first (Note [Emulated warps]): a bit each.
class ReadySet {
 public:
  void reset(unsigned threads) { words_.assign((threads + 63) / 64, 0); }
  void set(int i) { words_[i / 64] |= uint64_t{1} << (i % 64); }
  void clear(int i) { words_[i / 64] &= ~(uint64_t{1} << (i % 64)); }
  // The lowest set, or -1.
  int lowest() const {
    for (size_t w = 0; w < words_.size(); ++w)
      if (words_[w] != 0) return static_cast<int>(64 * w) + __builtin_ctzll(words_[w]);
    return -1;
  }

 private:
  std::vector<uint64_t> words_;
};

// One emulated thread of the running block, on its worker.
struct Fiber {
  Worker* worker = nullptr;
  jmp_buf resume_at;  // where it waits, once started
  bool started = false;
  uint3 index;
  int number = 0;  // in the block, x fastest, then y, then z: warp number / 32, lane number % 32
  bool done = false;
  std::vector<Copy> open;                     // issued, not yet committed
  std::deque<std::vector<Copy>> committed;    // oldest first
};

struct Warp {
  Barrier barrier;
  int lanes = 0;
  unsigned char slots[32 * kSlotBytes];
};

// The running launch: its block's fibers and what they share.
struct Block {
  dim3 grid, shape;
  uint3 index;
  std::vector<unsigned char> shared;  // shared_bytes and up to 16 bytes of alignment
  size_t shared_bytes = 0;
  std::vector<Fiber> fibers;
  std::vector<Worker*> workers;  // kept by launch(), one per thread of the block
  std::vector<Warp> warps;
  Barrier block_barrier;
  ReadySet ready;
  int vote = 0;                    // __syncthreads_or's, for the vote at block_barrier's generation
  uint64_t vote_generation = ~uint64_t{0};
  int live = 0;
  const std::function<void()>* body = nullptr;
  ucontext_t scheduler;  // a worker's first switch in (swapcontext)
  jmp_buf scheduler_at;  // where the running fiber goes back to (Note [Fiber switches])
  Fiber* current = nullptr;
};

thread_local Block* g_block = nullptr;

Block& block() {
  ZERONE_ASSERT(g_block != nullptr && g_block->current != nullptr, "an emulated GPU instruction outside a launch");
  return *g_block;
}

void land(const Copy& c) {
  std::memcpy(c.dst, c.src, c.src_bytes);
  std::memset(static_cast<unsigned char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
}
void land_group(std::vector<Copy>& group) {
  for (const Copy& c : group) land(c);
  group.clear();
}

void yield() {
  Block& b = block();
  if (_setjmp(b.current->resume_at) == 0) _longjmp(b.scheduler_at, 1);
}

// The barrier has filled: its waiting threads can run again.
void release(Block& b, Barrier& barrier) {
  for (int i : barrier.waiting) b.ready.set(i);
  barrier.waiting.clear();
  barrier.arrived = 0;
  ++barrier.generation;
}

// Waits until `expected` threads have arrived at `barrier` (this one included).
void wait_at(Barrier& barrier, int expected) {
  Block& b = block();
  if (++barrier.arrived >= expected) {
    release(b, barrier);
    return;
  }
  barrier.waiting.push_back(b.current->number);
  b.ready.clear(b.current->number);
  yield();  // the scheduler resumes this thread once the barrier has filled
}

thread_local Worker* g_starting = nullptr;  // the worker a first switch starts

// A worker's fiber: runs the thread resume() gave it, then waits for the next one.
void worker_entry() {
  Worker& self = *g_starting;
  for (;;) {
    Block& b = *g_block;
    (*b.body)();
    Fiber& f = *b.current;
    // A thread that exits with copies in flight: they land anyway.
    land_group(f.open);
    for (auto& group : f.committed) land_group(group);
    f.committed.clear();
    f.done = true;
    if (_setjmp(self.idle_at) == 0) _longjmp(b.scheduler_at, 1);
  }
}

// Runs f until it waits or exits (its own function: _setjmp returns twice).
[[gnu::noinline]] void resume(Block& b, Fiber& f) {
  b.current = &f;
  if (_setjmp(b.scheduler_at) != 0) return;  // f waits or has exited
  if (f.started) _longjmp(f.resume_at, 1);
  f.started = true;
  Worker& w = *f.worker;
  if (w.started) _longjmp(w.idle_at, 1);
  w.started = true;
  g_starting = &w;
  ZERONE_ASSERT(getcontext(&w.start) == 0, "getcontext");
  w.start.uc_stack.ss_sp = w.stack_bottom();
  w.start.uc_stack.ss_size = kStackBytes;
  w.start.uc_link = nullptr;  // a worker never returns
  makecontext(&w.start, worker_entry, 0);
  ZERONE_ASSERT(swapcontext(&b.scheduler, &w.start) == 0, "swapcontext");
}

void run_block(Block& b) {
  std::fill(b.shared.begin(), b.shared.end(), kUnwritten);
  const unsigned threads = b.shape.x * b.shape.y * b.shape.z;
  b.block_barrier = Barrier{};
  b.ready.reset(threads);
  b.vote_generation = ~uint64_t{0};
  for (Warp& w : b.warps) w.barrier = Barrier{};
  b.live = static_cast<int>(threads);
  for (unsigned i = 0; i < threads; ++i) {
    Fiber& f = b.fibers[i];
    f = Fiber{};
    f.index = uint3{i % b.shape.x, i / b.shape.x % b.shape.y, i / (b.shape.x * b.shape.y)};
    f.worker = b.workers[i];
    f.number = static_cast<int>(i);
    b.ready.set(static_cast<int>(i));
  }
  // Note [Emulated warps]: the lowest-numbered thread that can run runs, until it waits or exits,
  // so warp 0 runs ahead of the others as far as the barriers let it: a tile read before the
  // barrier that publishes the other warps' copies, or a copy issued into a tile another warp has
  // yet to read, then meets 0xff bytes.
  while (b.live > 0) {
    const int i = b.ready.lowest();
    ZERONE_ASSERT(i >= 0, "emulated GPU: deadlock in block (", b.index.x, ", ", b.index.y, ", ", b.index.z, "): ",
                  b.live, " threads wait at a barrier or warp instruction that can never complete (",
                  b.block_barrier.arrived, " of them at __syncthreads)");
    Fiber& f = b.fibers[i];
    resume(b, f);
    if (!f.done) continue;
    b.ready.clear(i);
    --b.live;
    // An exited thread counts as arrived at the block's barrier.
    if (b.block_barrier.arrived > 0 && b.block_barrier.arrived >= b.live) release(b, b.block_barrier);
  }
  b.current = nullptr;
}

}  // namespace

void launch(dim3 grid, dim3 shape, size_t shared_bytes, const std::function<void()>& thread_body) {
  ZERONE_ASSERT(g_block == nullptr, "emulated GPU: a launch inside a launch");
  const unsigned threads = shape.x * shape.y * shape.z;
  ZERONE_ASSERT(threads >= 1 && threads <= 1024, "emulated GPU: ", threads, " threads a block");
  Block b;
  b.grid = grid;
  b.shape = shape;
  b.shared.resize(shared_bytes + 16);
  b.shared_bytes = shared_bytes;
  b.fibers.resize(threads);
  b.body = &thread_body;
  static thread_local std::vector<std::unique_ptr<Worker>> kept;  // Note [Fiber switches]
  while (kept.size() < threads) kept.push_back(std::make_unique<Worker>());
  for (unsigned i = 0; i < threads; ++i) b.workers.push_back(kept[i].get());
  b.warps.resize((threads + 31) / 32);
  for (size_t w = 0; w < b.warps.size(); ++w) b.warps[w].lanes = static_cast<int>(std::min<size_t>(32, threads - 32 * w));
  g_block = &b;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        b.index = uint3{x, y, z};
        run_block(b);
      }
  g_block = nullptr;
}

const uint3& thread_index() { return block().current->index; }
const uint3& block_index() { return block().index; }
const dim3& grid_shape() { return block().grid; }
const dim3& block_shape() { return block().shape; }
int lane_index() { return block().current->number % 32; }

void* dynamic_shared_memory() {
  // 16-byte aligned (vector's storage is at least 16-byte aligned for new[] of this size, but not promised).
  auto p = reinterpret_cast<uintptr_t>(block().shared.data());
  return reinterpret_cast<void*>((p + 15) & ~uintptr_t{15});
}

void check_shared(const void* p, size_t bytes, const char* instruction) {
  Block& b = block();
  const auto at = reinterpret_cast<uintptr_t>(p), begin = reinterpret_cast<uintptr_t>(dynamic_shared_memory());
  const uintptr_t end = begin + b.shared_bytes;
  ZERONE_ASSERT(at >= begin && at + bytes <= end && at % bytes == 0, "emulated GPU: ", instruction, " at ", p,
                " outside the block's shared memory or not ", bytes, "-byte aligned");
}

void sync_block() {
  Block& b = block();
  wait_at(b.block_barrier, b.live);
}

int sync_block_or(int predicate) {
  Block& b = block();
  if (b.vote_generation != b.block_barrier.generation) {  // the first thread of this vote
    b.vote_generation = b.block_barrier.generation;
    b.vote = 0;
  }
  b.vote |= predicate != 0;
  wait_at(b.block_barrier, b.live);  // every live thread has voted
  const int result = b.vote;
  wait_at(b.block_barrier, b.live);  // every thread has read it: the next vote may start
  return result;
}

void warp_exchange(const void* mine, void* all, size_t bytes) {
  Block& b = block();
  ZERONE_ASSERT(bytes <= kSlotBytes, "emulated GPU: a warp exchange of ", bytes, " bytes");
  Warp& w = b.warps[b.current->number / 32];
  ZERONE_ASSERT(w.lanes == 32, "emulated GPU: a warp instruction in a warp of ", w.lanes, " threads");
  // The offers side by side in lane order (every lane of an exchange offers the same size), so
  // that each lane takes them all in one copy.
  std::memcpy(w.slots + (b.current->number % 32) * bytes, mine, bytes);
  wait_at(w.barrier, w.lanes);  // every lane's offer is in
  std::memcpy(all, w.slots, 32 * bytes);
  wait_at(w.barrier, w.lanes);  // every lane has read them: the slots may be reused
}

void copy_async(void* dst, const void* src, size_t bytes, size_t src_bytes) {
  Block& b = block();
  check_shared(dst, bytes, "cp.async");
  std::memset(dst, kUnwritten, bytes);
  b.current->open.push_back(Copy{dst, src, bytes, src_bytes});
}

void commit_copies() {
  Fiber& f = *block().current;
  f.committed.push_back(std::move(f.open));
  f.open.clear();
}

void wait_copies(int pending) {
  Fiber& f = *block().current;
  while (f.committed.size() > static_cast<size_t>(pending)) {
    land_group(f.committed.front());
    f.committed.pop_front();
  }
}

}  // namespace zerone::cuda::emulated
