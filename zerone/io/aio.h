// Asynchronous, aligned file I/O for the NVMe swap engine (DESIGN §1: "file env (POSIX, io_uring, a
// fault-injecting env for tests)").
//
// SwapIo moves bytes between 4 KiB-aligned buffers and files opened with O_DIRECT: start() queues
// a transfer and returns a ticket at once, wait(ticket) blocks until it is complete. Transfers are
// split into aio.block_size requests, at most aio.queue_depth in flight per io_uring ring, spread
// over aio.intra_op_parallelism rings (Note [Swap I/O settings]). Every failure (an errno, a short
// transfer, a file deleted under the run) becomes an Error naming the operation, the file and the
// offset, raised by the wait() of the ticket it belongs to; nothing is retried silently.
//
// Also here: SwapDirectory (one directory per run and rank, removed with everything in it at exit,
// on error and on a second SIGINT/SIGTERM) and the fault-injecting SwapIo used by the tests
// (leveldb's FaultInjectionTestEnv is the model: a wrapper that lets a test make the Nth operation
// fail in a chosen way).
//
// Thread-safety: a SwapIo is used by one thread at a time. SwapDirectory registration is safe from
// any thread; remove_swap_directories_in_flight() is async-signal-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "zerone/io/file.h"

namespace zerone::io {

// O_DIRECT alignment of swap-file offsets, sizes and staging buffers (bytes).
inline constexpr size_t kSwapAlignBytes = 4096;
// `bytes` rounded up to kSwapAlignBytes.
inline size_t swap_aligned(size_t bytes) { return (bytes + kSwapAlignBytes - 1) / kSwapAlignBytes * kSwapAlignBytes; }

// Note [Swap I/O settings]: DeepSpeed's `aio` block, honoured as follows.
//   block_size            bytes per io_uring request (a transfer is cut into requests this large)
//   queue_depth           requests in flight per ring
//   intra_op_parallelism  rings (DeepSpeed: threads) a transfer's requests are dealt to round-robin;
//                         its old name thread_count is accepted too
//   single_submit         submit each request on its own (one io_uring_enter per request) instead of
//                         a batch per transfer
//   overlap_events        keep the queue full: submit new requests as earlier ones complete; when
//                         false, a ring takes new requests only once all its requests completed
// The defaults are DeepSpeed's; the ranges below are the only statement of what validate() accepts
// (the settings table's rows for the aio keys read them too).
struct AioConfig {
  size_t block_bytes = 1 << 20;
  int queue_depth = 8;
  int intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;

  static constexpr size_t kMinBlockBytes = kSwapAlignBytes;  // and a multiple of it
  static constexpr size_t kMaxBlockBytes = size_t{1} << 30;
  static constexpr int kMaxQueueDepth = 4096;
  static constexpr int kMaxIntraOpParallelism = 64;
};

// Checks the ranges of an AioConfig; throws Error naming the aio key.
void validate(const AioConfig& config);

enum class IoOp { read, write };
const char* io_op_name(IoOp op);

class SwapIo {
 public:
  using Ticket = uint64_t;
  virtual ~SwapIo() = default;
  // Starts moving `bytes` between `buffer` and `fd` at `offset` (`path` names the file in errors).
  // `buffer`, `bytes` and `offset` must be multiples of 4096 (asserted). The buffer must stay
  // alive and untouched until wait() returns or throws.
  virtual Ticket start(IoOp op, int fd, const std::string& path, void* buffer, size_t bytes, uint64_t offset) = 0;
  // Blocks until every request of `ticket` completed. Throws Error (the first failure of the
  // ticket, naming operation, file and offset) if any failed or was short, or if the file was
  // deleted under the run.
  virtual void wait(Ticket ticket) = 0;
  // Waits for everything in flight, ignoring failures (destructors: no buffer may be freed while
  // the kernel still writes into it).
  virtual void drain() noexcept = 0;
};

// io_uring, one ring per intra_op_parallelism. Throws Error if io_uring is unavailable.
std::unique_ptr<SwapIo> make_uring_io(const AioConfig& config);

// The fault a test injects into the `after`+1-th transfer of kind `op` (counting from 0 = the first).
struct FaultPlan {
  enum class Kind { none, no_space, io_error, short_transfer, delete_file };
  Kind kind = Kind::none;
  IoOp op = IoOp::write;
  int after = 0;
};
// "OP:KIND:N" with OP read|write, KIND enospc|eio|short|delete; throws Error otherwise.
FaultPlan parse_fault_plan(const std::string& spec);
// Wraps `inner`: the planned transfer fails with ENOSPC or EIO without reaching the disk, moves
// 4 KiB less than asked (short), or has its file unlinked before it starts (delete). Every other
// transfer passes through unchanged.
std::unique_ptr<SwapIo> make_fault_injecting_io(std::unique_ptr<SwapIo> inner, const FaultPlan& plan);

// Note [Swap directories]: swap files live in "<nvme_path>/zerone-swap-<pid>-rank<r>", created
// empty at start (a leftover of the same name, from a killed run whose pid was reused, is refused
// rather than overwritten), removed with its files when the owner is destroyed (normal exit and
// errors, which unwind), and by the SIGINT/SIGTERM handler already on the first signal, through a
// fixed registry that needs neither locks nor allocation (as the temporaries of atomic writes,
// Note [Atomic writes]). Unlinking a file that is open loses nothing: its data stays reachable
// through the descriptor until the process ends, so the run still finishes its step and the
// kernel frees the space when it exits, however it exits. That matters under MPI: when one rank
// fails, mpiexec ends the others with SIGTERM and, soon after, SIGKILL, which no handler sees.
// Only a SIGKILL before any signal leaves the directory behind; its name says which process made it.
class SwapDirectory {
 public:
  // Checks `nvme_path` (exists, is a directory, writable, not tmpfs, supports O_DIRECT) and creates
  // the run's directory in it. Throws Error naming `what` (the flag) and the path.
  SwapDirectory(const std::string& nvme_path, int rank, const std::string& what);
  ~SwapDirectory();
  SwapDirectory(const SwapDirectory&) = delete;
  SwapDirectory& operator=(const SwapDirectory&) = delete;

  const std::string& path() const { return path_; }
  // Creates (or truncates) a file in the directory of `bytes` (allocated with fallocate, so a full
  // disk is found here, at start-up) and opens it with O_DIRECT for reading and writing. The file
  // is registered for removal. Throws Error naming the file.
  FileDescriptor create_file(const std::string& name, uint64_t bytes);

 private:
  std::string path_;
  int slot_ = -1;
};

// Checks `nvme_path` as SwapDirectory does, without creating anything, and returns its free bytes.
uint64_t check_swap_path(const std::string& nvme_path, const std::string& what);

// Opens a swap file of this run again for reading (a checkpoint copies NVMe-resident state out of
// it, Note [Checkpoints of swapped state]): through the run's own descriptor (/proc/self/fd), so it
// works after the first signal has unlinked the file (Note [Swap directories]); any other path is
// opened by name. Returns an invalid descriptor (errno set) when neither works.
FileDescriptor open_swap_file_for_reading(const std::string& path);

// Removes every registered swap file and directory (open files stay usable through their
// descriptors); from then on a missing file is no longer an error. Async-signal-safe (unlink/rmdir
// and an atomic store only).
void remove_swap_directories_in_flight() noexcept;

}  // namespace zerone::io
