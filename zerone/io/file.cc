#include "zerone/io/file.h"

#include <fcntl.h>
#include <glob.h>
#include <libgen.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "zerone/core/error.h"

namespace zerone::io {
namespace {

// What a non-regular file is, for messages.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

std::string prefix(const std::string& what) { return what.empty() ? std::string() : what + ": "; }

std::string parent_directory(const std::string& path) {
  std::string copy = path;
  return ::dirname(copy.data());
}

// Note [Atomic writes]: a writer creates "<path>.tmp.<pid>" beside the destination (same
// filesystem, so rename is atomic), fsyncs it, renames it and fsyncs the directory so that the
// rename itself survives a crash. Ctrl-C while it runs: the first SIGINT only asks the trainer to
// stop (signals.h), so the write finishes; a second one ends the process, and its handler unlinks
// the temporaries registered here first. The registry is a fixed array of slots so the handler
// needs neither locks nor allocation.
struct TemporarySlot {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 holds a path to remove
  char path[4096];
};
std::array<TemporarySlot, 8> g_temporaries;

// RAII registration of one temporary; silently unregistered (not protected) if every slot is busy.
class RegisteredTemporary {
 public:
  explicit RegisteredTemporary(const std::string& path) {
    if (path.size() >= sizeof(TemporarySlot::path)) return;
    for (TemporarySlot& s : g_temporaries) {
      int expected = 0;
      if (s.state.compare_exchange_strong(expected, 1)) {
        std::memcpy(s.path, path.c_str(), path.size() + 1);
        s.state.store(2);
        slot_ = &s;
        return;
      }
    }
  }
  ~RegisteredTemporary() {
    if (slot_ != nullptr) slot_->state.store(0);
  }
  RegisteredTemporary(const RegisteredTemporary&) = delete;
  RegisteredTemporary& operator=(const RegisteredTemporary&) = delete;

 private:
  TemporarySlot* slot_ = nullptr;
};

}  // namespace

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor::FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileDescriptor open_regular_file(const std::string& path, const std::string& what, size_t* size_bytes) {
  struct stat st;
  ZERONE_CHECK(::stat(path.c_str(), &st) == 0, prefix(what), "cannot open '", path, "': ", std::strerror(errno));
  ZERONE_CHECK(S_ISREG(st.st_mode), prefix(what), "'", path, "' is ", file_kind(st.st_mode), ", expected a regular file");
  // O_NONBLOCK: should the path be swapped for a FIFO between stat and open, open still returns.
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  ZERONE_CHECK(fd.get() >= 0, prefix(what), "cannot open '", path, "': ", std::strerror(errno));
  ZERONE_CHECK(::fstat(fd.get(), &st) == 0, prefix(what), "cannot stat '", path, "': ", std::strerror(errno));
  ZERONE_CHECK(S_ISREG(st.st_mode), prefix(what), "'", path, "' is ", file_kind(st.st_mode), ", expected a regular file");
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  if (size_bytes != nullptr) *size_bytes = static_cast<size_t>(st.st_size);
  return fd;
}

void read_exactly(int fd, void* out, size_t bytes, uint64_t offset, const std::string& path) {
  auto* cursor = static_cast<char*>(out);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, cursor, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    ZERONE_CHECK(n >= 0, "read of '", path, "' failed at byte ", offset, ": ", std::strerror(errno));
    ZERONE_CHECK(n > 0, "'", path, "' ended at byte ", offset, " while ", bytes,
                 " more bytes were expected: the file shrank or was truncated while in use");
    cursor += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

std::string read_text_file(const std::string& path, const std::string& what) {
  size_t size = 0;
  FileDescriptor fd = open_regular_file(path, what, &size);
  std::string text(size, '\0');
  read_exactly(fd.get(), text.data(), size, 0, path);
  return text;
}

MappedFile::MappedFile(const std::string& path, const std::string& what) : path_(path) {
  FileDescriptor fd = open_regular_file(path, what, &size_);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    ZERONE_CHECK(p != MAP_FAILED, prefix(what), "cannot map '", path, "': ", std::strerror(errno));
    data_ = static_cast<const uint8_t*>(p);
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

std::vector<std::string> glob_files(const std::string& pattern, const std::string& what) {
  glob_t g;
  std::memset(&g, 0, sizeof g);
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  ZERONE_CHECK(!out.empty(), what, " '", pattern, "': no file matches");
  std::sort(out.begin(), out.end());
  return out;
}

void check_atomic_output(const std::string& path, const std::string& what) {
  ZERONE_CHECK(!path.empty(), prefix(what), "empty path");
  ZERONE_CHECK(path.back() != '/', prefix(what), "'", path, "' names a directory, expected a file path");
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    ZERONE_CHECK(S_ISREG(st.st_mode), prefix(what), "'", path, "' is ", file_kind(st.st_mode),
                 ", expected a new or regular file (zerone writes a temporary and renames it over the destination, ",
                 "which would replace it)");
  } else {
    ZERONE_CHECK(errno == ENOENT, prefix(what), "cannot use '", path, "': ", std::strerror(errno));
  }
  const std::string dir = parent_directory(path);
  ZERONE_CHECK(::stat(dir.c_str(), &st) == 0, prefix(what), "directory '", dir, "' of '", path,
               "' does not exist: create it first");
  ZERONE_CHECK(S_ISDIR(st.st_mode), prefix(what), "'", dir, "' (in '", path, "') is not a directory");
  ZERONE_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, prefix(what), "directory '", dir, "' of '", path,
               "' is not writable: ", std::strerror(errno));
}

bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void write_all(std::FILE* file, const void* data, size_t bytes, const std::string& path) {
  ZERONE_CHECK(bytes == 0 || std::fwrite(data, 1, bytes, file) == bytes, "write to '", path, "' failed: ",
               std::strerror(errno));
}

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  check_atomic_output(path, "");
  const std::string tmp = str_cat(path, ".tmp.", ::getpid());
  RegisteredTemporary registered(tmp);
  // A leftover of a dead process with our pid is ours to replace; O_EXCL then guarantees that
  // nothing planted at the temporary's name (a symlink) is followed.
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  ZERONE_CHECK(fd >= 0, "cannot create '", tmp, "': ", std::strerror(errno));
  std::FILE* f = ::fdopen(fd, "wb");
  if (f == nullptr) {
    int err = errno;
    ::close(fd);
    std::remove(tmp.c_str());
    throw Error(str_cat("cannot create '", tmp, "': ", std::strerror(err)));
  }
  try {
    write(f);
    ZERONE_CHECK(std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0, "cannot write '", tmp, "': ", std::strerror(errno));
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  int close_rc = std::fclose(f);
  if (close_rc != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    throw Error(str_cat("cannot write '", path, "': ", std::strerror(err)));
  }
  const std::string dir = parent_directory(path);
  FileDescriptor dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ZERONE_CHECK(dir_fd.get() >= 0 && ::fsync(dir_fd.get()) == 0, "wrote '", path, "' but cannot fsync its directory '",
               dir, "': ", std::strerror(errno));
}

void remove_temporaries_in_flight() noexcept {
  for (TemporarySlot& s : g_temporaries)
    if (s.state.load() == 2) ::unlink(s.path);
}

}  // namespace zerone::io
