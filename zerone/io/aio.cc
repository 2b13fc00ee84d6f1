#include "zerone/io/aio.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <unordered_map>
#include <vector>

#include "zerone/core/error.h"

namespace zerone::io {

void validate(const AioConfig& c) {
  using A = AioConfig;
  ZERONE_CHECK(c.block_bytes >= A::kMinBlockBytes && c.block_bytes <= A::kMaxBlockBytes &&
                   c.block_bytes % A::kMinBlockBytes == 0,
               "aio.block_size ", c.block_bytes, " is out of range: expected a multiple of ", A::kMinBlockBytes, " in ",
               A::kMinBlockBytes, "..", A::kMaxBlockBytes);
  ZERONE_CHECK(c.queue_depth >= 1 && c.queue_depth <= A::kMaxQueueDepth, "aio.queue_depth ", c.queue_depth,
               " is out of range: expected 1..", A::kMaxQueueDepth);
  ZERONE_CHECK(c.intra_op_parallelism >= 1 && c.intra_op_parallelism <= A::kMaxIntraOpParallelism,
               "aio.intra_op_parallelism ", c.intra_op_parallelism, " is out of range: expected 1..",
               A::kMaxIntraOpParallelism);
}

const char* io_op_name(IoOp op) { return op == IoOp::read ? "read" : "write"; }

namespace {

constexpr size_t kAlign = 4096;
// Set once the signal handler unlinked the swap files (Note [Swap directories]).
std::atomic<bool> g_removed_by_signal{false};

// ---------------------------------------------------------------- io_uring

class UringIo final : public SwapIo {
 public:
  explicit UringIo(const AioConfig& config) : config_(config) {
    validate(config);
    rings_.resize(static_cast<size_t>(config.intra_op_parallelism));
    for (size_t i = 0; i < rings_.size(); ++i) {
      int rc = io_uring_queue_init(static_cast<unsigned>(config.queue_depth), &rings_[i].ring, 0);
      if (rc < 0) {
        for (size_t k = 0; k < i; ++k) io_uring_queue_exit(&rings_[k].ring);
        throw Error(str_cat("io_uring is not available (io_uring_queue_init: ", std::strerror(-rc),
                            "); NVMe offload needs it (a kernel >= 5.6 that allows io_uring)"));
      }
    }
  }
  ~UringIo() override {
    drain();
    for (Ring& r : rings_) io_uring_queue_exit(&r.ring);
  }

  Ticket start(IoOp op, int fd, const std::string& path, void* buffer, size_t bytes, uint64_t offset) override {
    ZERONE_ASSERT(reinterpret_cast<uintptr_t>(buffer) % kAlign == 0 && bytes % kAlign == 0 && offset % kAlign == 0,
                  "unaligned swap transfer");
    const Ticket t = next_ticket_++;
    TicketState& st = tickets_[t];
    st.op = op;
    st.fd = fd;
    st.path = path;
    for (size_t off = 0; off < bytes; off += config_.block_bytes) {
      const size_t n = std::min(config_.block_bytes, bytes - off);
      queued_.push_back(Request{t, op, fd, static_cast<char*>(buffer) + off, n, offset + off});
      ++st.pending;
    }
    pump();
    return t;
  }

  void wait(Ticket t) override {
    auto it = tickets_.find(t);
    ZERONE_ASSERT(it != tickets_.end(), "unknown swap ticket ", t);
    while (it->second.pending > 0) {
      pump();
      reap_one(/*block=*/true);
    }
    TicketState st = std::move(it->second);
    tickets_.erase(it);
    if (!st.error.empty()) throw Error(st.error);
    // A file unlinked under the run still reads and writes through its descriptor, but its bytes
    // are gone at exit and its place on disk is no longer the user's: refuse to go on.
    struct stat sb;
    if (!g_removed_by_signal.load() && ::fstat(st.fd, &sb) == 0 && sb.st_nlink == 0)
      throw Error(str_cat(io_op_name(st.op), " of swap file '", st.path,
                          "': the file was deleted during the run (swap files must stay until the run ends)"));
  }

  void drain() noexcept override {
    queued_.clear();
    for (auto& [t, st] : tickets_) st.pending = 0;
    for (Ring& r : rings_) {
      while (r.in_flight > 0) {
        io_uring_cqe* cqe = nullptr;
        if (io_uring_wait_cqe(&r.ring, &cqe) < 0) break;
        delete static_cast<Request*>(io_uring_cqe_get_data(cqe));
        io_uring_cqe_seen(&r.ring, cqe);
        --r.in_flight;
      }
    }
    tickets_.clear();
  }

 private:
  struct Request {
    Ticket ticket;
    IoOp op;
    int fd;
    char* buffer;
    size_t bytes;
    uint64_t offset;
  };
  struct TicketState {
    IoOp op = IoOp::read;
    int fd = -1;
    std::string path;
    size_t pending = 0;
    std::string error;  // the first failure
  };
  struct Ring {
    io_uring ring;
    int in_flight = 0;
    int unsubmitted = 0;
  };

  // Moves queued requests into rings with room, submitting per Note [Swap I/O settings].
  void pump() {
    while (!queued_.empty()) {
      Ring* ring = nullptr;
      for (size_t k = 0; k < rings_.size() && ring == nullptr; ++k) {
        Ring& r = rings_[(next_ring_ + k) % rings_.size()];
        const bool room = config_.overlap_events ? r.in_flight < config_.queue_depth
                                                 : (r.in_flight == 0 || r.unsubmitted > 0) && r.in_flight < config_.queue_depth;
        if (room) {
          ring = &r;
          next_ring_ = (next_ring_ + k + 1) % rings_.size();
        }
      }
      if (ring == nullptr) break;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring->ring);
      ZERONE_ASSERT(sqe != nullptr, "io_uring submission queue full with ", ring->in_flight, " in flight");
      auto* req = new Request(queued_.front());
      queued_.pop_front();
      if (req->op == IoOp::read) io_uring_prep_read(sqe, req->fd, req->buffer, static_cast<unsigned>(req->bytes), req->offset);
      else io_uring_prep_write(sqe, req->fd, req->buffer, static_cast<unsigned>(req->bytes), req->offset);
      io_uring_sqe_set_data(sqe, req);
      ++ring->in_flight;
      ++ring->unsubmitted;
      if (config_.single_submit) submit(*ring);
    }
    for (Ring& r : rings_)
      if (r.unsubmitted > 0) submit(r);
  }

  void submit(Ring& r) {
    int rc = io_uring_submit(&r.ring);
    ZERONE_CHECK(rc >= 0, "io_uring_submit failed: ", std::strerror(-rc));
    r.unsubmitted = 0;
  }

  void reap_one(bool block) {
    for (size_t k = 0; k < rings_.size(); ++k) {
      Ring& r = rings_[k];
      if (r.in_flight == 0) continue;
      io_uring_cqe* cqe = nullptr;
      int rc = block ? io_uring_wait_cqe(&r.ring, &cqe) : io_uring_peek_cqe(&r.ring, &cqe);
      if (rc == -EAGAIN || rc == -EINTR || (!block && cqe == nullptr)) continue;
      ZERONE_CHECK(rc == 0, "io_uring_wait_cqe failed: ", std::strerror(-rc));
      std::unique_ptr<Request> req(static_cast<Request*>(io_uring_cqe_get_data(cqe)));
      const int res = cqe->res;
      io_uring_cqe_seen(&r.ring, cqe);
      --r.in_flight;
      complete(*req, res);
      return;
    }
  }

  void complete(const Request& req, int res) {
    auto it = tickets_.find(req.ticket);
    if (it == tickets_.end()) return;
    TicketState& st = it->second;
    --st.pending;
    if (!st.error.empty()) return;
    if (res < 0) {
      st.error = str_cat(io_op_name(req.op), " of swap file '", st.path, "' at offset ", req.offset, " (", req.bytes,
                         " bytes) failed: ", std::strerror(-res),
                         res == -ENOSPC ? " (the disk under --nvme-path is full)" : "");
    } else if (static_cast<size_t>(res) != req.bytes) {
      st.error = str_cat(io_op_name(req.op), " of swap file '", st.path, "' at offset ", req.offset, " was short: ", res,
                         " of ", req.bytes, " bytes", req.op == IoOp::read ? " (the file shrank under the run?)"
                                                                        : " (is the disk under --nvme-path full?)");
    }
  }

  AioConfig config_;
  std::vector<Ring> rings_;
  size_t next_ring_ = 0;
  std::deque<Request> queued_;
  std::unordered_map<Ticket, TicketState> tickets_;
  Ticket next_ticket_ = 1;
};

// ---------------------------------------------------------------- fault injection

class FaultInjectingIo final : public SwapIo {
 public:
  FaultInjectingIo(std::unique_ptr<SwapIo> inner, const FaultPlan& plan) : inner_(std::move(inner)), plan_(plan) {}

  Ticket start(IoOp op, int fd, const std::string& path, void* buffer, size_t bytes, uint64_t offset) override {
    const bool hit = plan_.kind != FaultPlan::Kind::none && op == plan_.op && seen_[static_cast<int>(op)]++ == plan_.after;
    const Ticket t = next_++;
    if (!hit) {
      map_[t] = Entry{inner_->start(op, fd, path, buffer, bytes, offset), ""};
      return t;
    }
    const std::string where = str_cat(io_op_name(op), " of swap file '", path, "' at offset ", offset, " (", bytes, " bytes)");
    switch (plan_.kind) {
      case FaultPlan::Kind::no_space:
        map_[t] = Entry{0, str_cat(where, " failed: ", std::strerror(ENOSPC), " (the disk under --nvme-path is full)")};
        break;
      case FaultPlan::Kind::io_error:
        map_[t] = Entry{0, str_cat(where, " failed: ", std::strerror(EIO))};
        break;
      case FaultPlan::Kind::short_transfer:
        // The device moved one block less than asked: the caller must notice, not use the rest.
        map_[t] = Entry{bytes > kAlign ? inner_->start(op, fd, path, buffer, bytes - kAlign, offset) : 0,
                        str_cat(io_op_name(op), " of swap file '", path, "' at offset ", offset, " was short: ",
                                bytes - kAlign, " of ", bytes, " bytes")};
        break;
      case FaultPlan::Kind::delete_file:
        ::unlink(path.c_str());
        map_[t] = Entry{inner_->start(op, fd, path, buffer, bytes, offset), ""};
        break;
      case FaultPlan::Kind::none:
        break;
    }
    return t;
  }

  void wait(Ticket t) override {
    auto it = map_.find(t);
    ZERONE_ASSERT(it != map_.end());
    Entry e = it->second;
    map_.erase(it);
    if (e.inner != 0) inner_->wait(e.inner);
    if (!e.error.empty()) throw Error(e.error);
  }

  void drain() noexcept override {
    map_.clear();
    inner_->drain();
  }

 private:
  struct Entry {
    Ticket inner = 0;
    std::string error;
  };
  std::unique_ptr<SwapIo> inner_;
  FaultPlan plan_;
  int seen_[2] = {0, 0};
  std::unordered_map<Ticket, Entry> map_;
  Ticket next_ = 1;
};

// ---------------------------------------------------------------- directories

// Registry for the signal handler (Note [Swap directories]).
constexpr size_t kMaxDirs = 4, kMaxFiles = 16, kPathMax = 1024;
struct DirSlot {
  std::atomic<int> state{0};  // 0 free, 1 in use
  char dir[kPathMax];
  std::atomic<int> files{0};
  char file[kMaxFiles][kPathMax];
  std::atomic<int> fd[kMaxFiles];  // the run's descriptor of file[i] (-1 before it is open)
};
std::array<DirSlot, kMaxDirs> g_dirs;

}  // namespace

std::unique_ptr<SwapIo> make_uring_io(const AioConfig& config) { return std::make_unique<UringIo>(config); }

FaultPlan parse_fault_plan(const std::string& spec) {
  FaultPlan plan;
  const size_t a = spec.find(':'), b = a == std::string::npos ? a : spec.find(':', a + 1);
  ZERONE_CHECK(b != std::string::npos, "fault plan '", spec, "': expected OP:KIND:N");
  const std::string op = spec.substr(0, a), kind = spec.substr(a + 1, b - a - 1), n = spec.substr(b + 1);
  ZERONE_CHECK(op == "read" || op == "write", "fault plan '", spec, "': OP must be read or write");
  plan.op = op == "read" ? IoOp::read : IoOp::write;
  if (kind == "enospc") plan.kind = FaultPlan::Kind::no_space;
  else if (kind == "eio") plan.kind = FaultPlan::Kind::io_error;
  else if (kind == "short") plan.kind = FaultPlan::Kind::short_transfer;
  else if (kind == "delete") plan.kind = FaultPlan::Kind::delete_file;
  else throw Error(str_cat("fault plan '", spec, "': KIND must be enospc, eio, short or delete"));
  try {
    plan.after = std::stoi(n);
  } catch (const std::exception&) {
    throw Error(str_cat("fault plan '", spec, "': N must be a number"));
  }
  return plan;
}

std::unique_ptr<SwapIo> make_fault_injecting_io(std::unique_ptr<SwapIo> inner, const FaultPlan& plan) {
  return std::make_unique<FaultInjectingIo>(std::move(inner), plan);
}

uint64_t check_swap_path(const std::string& nvme_path, const std::string& what) {
  struct stat sb;
  ZERONE_CHECK(!nvme_path.empty(), what, " is required for NVMe offload: give a directory on a local disk");
  ZERONE_CHECK(::stat(nvme_path.c_str(), &sb) == 0, what, " '", nvme_path, "': ", std::strerror(errno),
               " (expected an existing directory on a local disk)");
  ZERONE_CHECK(S_ISDIR(sb.st_mode), what, " '", nvme_path, "' is not a directory");
  ZERONE_CHECK(::access(nvme_path.c_str(), W_OK | X_OK) == 0, what, " '", nvme_path,
               "' is not writable (swap files are created in it)");
  struct statfs fs;
  ZERONE_CHECK(::statfs(nvme_path.c_str(), &fs) == 0, what, " '", nvme_path, "': statfs: ", std::strerror(errno));
  ZERONE_CHECK(fs.f_type != TMPFS_MAGIC && fs.f_type != RAMFS_MAGIC, what, " '", nvme_path,
               "' is on tmpfs/ramfs, which is memory: swapping there saves no memory. Give a directory on a disk");
  struct statvfs vfs;
  ZERONE_CHECK(::statvfs(nvme_path.c_str(), &vfs) == 0, what, " '", nvme_path, "': statvfs: ", std::strerror(errno));
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

namespace {

// Removes the swap directories of runs that were killed (Note [Stale temporaries] in io/file.h):
// "zerone-swap-<pid>-rank<r>" whose process is gone. Never throws.
void remove_stale_swap_directories(const std::string& nvme_path) noexcept {
  try {
    DIR* d = ::opendir(nvme_path.c_str());
    if (d == nullptr) return;
    std::vector<std::string> stale;
    while (dirent* e = ::readdir(d)) {
      long pid = 0, rank = 0;
      int used = 0;
      if (std::sscanf(e->d_name, "zerone-swap-%ld-rank%ld%n", &pid, &rank, &used) == 2 &&
          e->d_name[used] == '\0' && !process_exists(pid))
        stale.emplace_back(e->d_name);
    }
    ::closedir(d);
    for (const std::string& name : stale) {
      const std::string dir = nvme_path + "/" + name;
      if (DIR* sd = ::opendir(dir.c_str())) {
        std::vector<std::string> files;
        while (dirent* e = ::readdir(sd))
          if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) files.emplace_back(e->d_name);
        ::closedir(sd);
        for (const std::string& f : files) ::unlink((dir + "/" + f).c_str());
      }
      ::rmdir(dir.c_str());
    }
  } catch (...) {
  }
}

}  // namespace

SwapDirectory::SwapDirectory(const std::string& nvme_path, int rank, const std::string& what) {
  check_swap_path(nvme_path, what);
  remove_stale_swap_directories(nvme_path);
  path_ = str_cat(nvme_path, nvme_path.back() == '/' ? "" : "/", "zerone-swap-", ::getpid(), "-rank", rank);
  ZERONE_CHECK(path_.size() + 64 < kPathMax, what, " '", nvme_path, "' is too long a path");
  ZERONE_CHECK(::mkdir(path_.c_str(), 0700) == 0, what, ": cannot create the swap directory '", path_, "': ",
               std::strerror(errno));
  for (size_t i = 0; i < g_dirs.size(); ++i) {
    int expected = 0;
    if (g_dirs[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_dirs[i].dir, path_.c_str(), path_.size() + 1);
      g_dirs[i].files.store(0);
      slot_ = static_cast<int>(i);
      break;
    }
  }
}

SwapDirectory::~SwapDirectory() {
  if (slot_ >= 0) {
    DirSlot& s = g_dirs[static_cast<size_t>(slot_)];
    for (int i = 0; i < s.files.load(); ++i) {
      ::unlink(s.file[i]);
      s.fd[i].store(-1);
    }
    s.files.store(0);
    s.state.store(0);
  }
  ::rmdir(path_.c_str());
}

FileDescriptor SwapDirectory::create_file(const std::string& name, uint64_t bytes) {
  const std::string file = path_ + "/" + name;
  ZERONE_ASSERT(slot_ >= 0 && file.size() < kPathMax, "swap registry full");
  DirSlot& s = g_dirs[static_cast<size_t>(slot_)];
  bool known = false;
  for (int i = 0; i < s.files.load(); ++i) known |= file == s.file[i];
  if (!known) {
    const int index = s.files.load();
    ZERONE_CHECK(index < static_cast<int>(kMaxFiles), "too many swap files in '", path_, "' (at most ", kMaxFiles, ")");
    std::memcpy(s.file[index], file.c_str(), file.size() + 1);
    s.fd[index].store(-1);
    s.files.store(index + 1);  // registered before it exists: the handler's unlink may find nothing
  }
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  ZERONE_CHECK(fd >= 0, "cannot create swap file '", file, "': ", std::strerror(errno),
               errno == EINVAL ? " (the filesystem under --nvme-path does not support O_DIRECT)" : "");
  FileDescriptor owned(fd);
  for (int i = 0; i < s.files.load(); ++i)
    if (file == s.file[i]) s.fd[i].store(fd);
  if (bytes > 0) {
    int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    ZERONE_CHECK(rc == 0, "cannot reserve ", bytes, " bytes for swap file '", file, "': ", std::strerror(rc),
                 rc == ENOSPC ? " (not enough free space under --nvme-path)" : "");
  }
  return owned;
}

FileDescriptor open_swap_file_for_reading(const std::string& path) {
  for (DirSlot& s : g_dirs) {
    if (s.state.load() != 1) continue;
    for (int i = 0; i < s.files.load() && i < static_cast<int>(kMaxFiles); ++i) {
      const int fd = s.fd[i].load();
      if (fd < 0 || path != s.file[i]) continue;
      // A new open file description of the same inode, without O_DIRECT, valid after an unlink.
      FileDescriptor again(::open(str_cat("/proc/self/fd/", fd).c_str(), O_RDONLY | O_CLOEXEC));
      if (again.get() >= 0) return again;
    }
  }
  return FileDescriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
}

void remove_swap_directories_in_flight() noexcept {
  g_removed_by_signal.store(true);
  for (DirSlot& s : g_dirs) {
    if (s.state.load() != 1) continue;
    const int n = s.files.load();
    for (int i = 0; i < n && i < static_cast<int>(kMaxFiles); ++i) ::unlink(s.file[i]);
    ::rmdir(s.dir);
  }
}

}  // namespace zerone::io
