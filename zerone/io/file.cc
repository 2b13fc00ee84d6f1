#include "zerone/io/file.h"

#include <fcntl.h>
#include <glob.h>
#include <libgen.h>
#include <sys/mman.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>
#include <climits>
#include <cstdlib>

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

std::string read_text_file(const std::string& path, const std::string& what, size_t max_bytes) {
  size_t size = 0;
  FileDescriptor fd = open_regular_file(path, what, &size);
  ZERONE_CHECK(size <= max_bytes, prefix(what), "'", path, "' is ", size, " bytes, more than the ", max_bytes,
               " this input may be");
  // Read to the end rather than trusting st_size: /proc and /sys files report 0.
  std::string text;
  char block[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), block, sizeof block);
    if (n < 0 && errno == EINTR) continue;
    ZERONE_CHECK(n >= 0, prefix(what), "read of '", path, "' failed: ", std::strerror(errno));
    if (n == 0) break;
    text.append(block, static_cast<size_t>(n));
    ZERONE_CHECK(text.size() <= max_bytes, prefix(what), "'", path, "' is more than the ", max_bytes,
                 " bytes this input may be");
  }
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
  struct stat file_st;
  if (::stat(path.c_str(), &file_st) == 0)
    ZERONE_CHECK(file_st.st_dev == st.st_dev, prefix(what), "'", path, "' is a mount point (a bind-mounted file?): ",
                 "it cannot be replaced by renaming a new file over it");
  // Probe: create and remove the very temporary the write will use, so that a name too long with
  // its suffix, a filesystem that refuses new files (/proc, /sys) or a permission rule root is
  // subject to fails now, before any training, not when the result is ready.
  const std::string tmp = str_cat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  ZERONE_CHECK(fd >= 0, prefix(what), "cannot create a file beside '", path, "' ('", tmp, "'): ", std::strerror(errno));
  ::close(fd);
  ::unlink(tmp.c_str());
}

namespace {

// The path with its directory resolved (symlinks, "..", "./"), the last component kept as given:
// two spellings of one new file compare equal.
std::string canonical_path(const std::string& path) {
  std::string copy = path, copy2 = path;
  const std::string dir = ::dirname(copy.data()), base = ::basename(copy2.data());
  char resolved[PATH_MAX];
  if (::realpath(dir.c_str(), resolved) == nullptr) return path;
  return std::string(resolved) + "/" + base;
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  struct stat sa, sb;
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return canonical_path(a) == canonical_path(b);
}

void pwrite_all(int fd, const void* data, uint64_t bytes, uint64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  for (uint64_t done = 0; done < bytes;) {
    ssize_t w = ::pwrite(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    ZERONE_CHECK(w > 0, "cannot write '", path, "': ", w < 0 ? std::strerror(errno) : "no progress");
    done += static_cast<uint64_t>(w);
  }
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void write_all(std::FILE* file, const void* data, size_t bytes, const std::string& path) {
  ZERONE_CHECK(bytes == 0 || std::fwrite(data, 1, bytes, file) == bytes, "write to '", path, "' failed: ",
               std::strerror(errno));
}

void write_files_atomically(const std::vector<std::string>& paths,
                            const std::function<void(size_t, std::FILE*)>& write) {
  for (const std::string& path : paths) check_atomic_output(path, "");
  struct Temporary {
    std::string path;
    std::unique_ptr<RegisteredTemporary> registered;
    std::FILE* file = nullptr;
  };
  std::vector<Temporary> temps(paths.size());
  auto discard = [&] {
    for (Temporary& t : temps) {
      if (t.file != nullptr) std::fclose(t.file);
      t.file = nullptr;
      if (!t.path.empty()) std::remove(t.path.c_str());
    }
  };
  try {
    for (size_t i = 0; i < paths.size(); ++i) {
      Temporary& t = temps[i];
      t.path = str_cat(paths[i], ".tmp.", ::getpid());
      t.registered = std::make_unique<RegisteredTemporary>(t.path);
      // A leftover of a dead process with our pid is ours to replace; O_EXCL then guarantees that
      // nothing planted at the temporary's name (a symlink) is followed.
      ::unlink(t.path.c_str());
      int fd = ::open(t.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      ZERONE_CHECK(fd >= 0, "cannot create '", t.path, "': ", std::strerror(errno));
      t.file = ::fdopen(fd, "wb");
      if (t.file == nullptr) {
        int err = errno;
        ::close(fd);
        throw Error(str_cat("cannot create '", t.path, "': ", std::strerror(err)));
      }
      write(i, t.file);
      ZERONE_CHECK(std::fflush(t.file) == 0 && ::fsync(::fileno(t.file)) == 0, "cannot write '", t.path, "': ",
                   std::strerror(errno));
      int close_rc = std::fclose(t.file);
      t.file = nullptr;
      ZERONE_CHECK(close_rc == 0, "cannot write '", t.path, "': ", std::strerror(errno));
    }
  } catch (...) {
    discard();
    throw;
  }
  // Every file is complete on disk: now the renames (each atomic), then the directories.
  for (size_t i = 0; i < paths.size(); ++i) {
    if (std::rename(temps[i].path.c_str(), paths[i].c_str()) != 0) {
      int err = errno;
      for (size_t j = i; j < temps.size(); ++j) std::remove(temps[j].path.c_str());
      throw Error(str_cat("cannot write '", paths[i], "': ", std::strerror(err)));
    }
    temps[i].path.clear();
  }
  for (const std::string& path : paths) {
    const std::string dir = parent_directory(path);
    FileDescriptor dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ZERONE_CHECK(dir_fd.get() >= 0 && ::fsync(dir_fd.get()) == 0, "wrote '", path, "' but cannot fsync its directory '",
                 dir, "': ", std::strerror(errno));
  }
}

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  write_files_atomically({path}, [&](size_t, std::FILE* f) { write(f); });
}

void remove_temporaries_in_flight() noexcept {
  for (TemporarySlot& s : g_temporaries)
    if (s.state.load() == 2) ::unlink(s.path);
}

bool process_exists(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

namespace {

void remove_tree_quietly(const std::string& path) noexcept {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = ::opendir(path.c_str())) {
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
      ::closedir(d);
      for (const std::string& n : names) remove_tree_quietly(path + "/" + n);
    }
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

}  // namespace

int remove_stale_temporaries(const std::string& dir, const std::string& prefix) noexcept {
  int removed = 0;
  try {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return 0;
    std::vector<std::string> stale;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      const size_t mark = name.rfind(".tmp.");
      if (mark == std::string::npos || mark + 5 == name.size()) continue;
      if (!prefix.empty() && name.compare(0, mark, prefix) != 0) continue;
      const std::string digits = name.substr(mark + 5);
      if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      if (!process_exists(std::stol(digits))) stale.push_back(name);
    }
    ::closedir(d);
    for (const std::string& name : stale) {
      remove_tree_quietly(dir + "/" + name);
      ++removed;
    }
  } catch (...) {
  }
  return removed;
}

}  // namespace zerone::io
