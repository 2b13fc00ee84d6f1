// File helpers shared by every reader and writer in zerone/io (and the trainer's outputs).
//
// Readers check the file type before opening (a FIFO would block forever, a directory or a device
// is not data) and report problems as Error naming the path. Token shards are read with pread, not
// mapped, so a file that shrinks under a run is an error, not SIGBUS (Note [No mmap for data]).
// Writers never leave a half-written file and never replace anything but a regular file: they write
// to "<path>.tmp.<pid>", fsync it, rename it over the destination and fsync the directory
// (Note [Atomic writes]). A temporary being written is registered so that a second SIGINT/SIGTERM
// (signals.h) can remove it before the process dies.
// Thread-safety: independent calls on different paths are safe; the temporary registry is locked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace zerone::io {

// An owned file descriptor (RAII); -1 when empty.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept;
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// Opens `path` read-only after checking it is a regular file, without ever blocking (a FIFO is
// refused before it is opened). `what` names the flag or role ("--data", "config") for messages.
// Throws Error naming `what`, the path and what it is instead (missing, a directory, a FIFO, ...).
// `size_bytes` (optional) receives the file's size.
FileDescriptor open_regular_file(const std::string& path, const std::string& what, size_t* size_bytes = nullptr);

// The whole of a regular file as text (configs, corpora), read to its end (so /proc files work).
// Throws Error as open_regular_file, on a read error, or when it exceeds max_bytes.
std::string read_text_file(const std::string& path, const std::string& what, size_t max_bytes = SIZE_MAX);

// Reads exactly `bytes` at `offset` (pread, retrying short reads). Throws Error naming `path` when
// the file ends early (it shrank since it was opened) or the read fails.
void read_exactly(int fd, void* out, size_t bytes, uint64_t offset, const std::string& path);

// A read-only memory mapping of a whole regular file (RAII), for files read once at start-up
// (checkpoints, tokenizers). Throws Error if the file cannot be opened or is not a regular file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path, const std::string& what = "");
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Files matching a shell glob, sorted. Throws Error (naming the pattern) if none match.
std::vector<std::string> glob_files(const std::string& pattern, const std::string& what);

// Start-up check of an output that will be written with write_file_atomically: the directory must
// exist and be writable, and `path` must not exist or be a regular file (never a directory,
// symlink, device node, FIFO or socket, which the rename would replace, nor a mount point); the
// temporary beside it is created and removed as a probe. Throws Error naming `what` (the flag)
// and the path.
void check_atomic_output(const std::string& path, const std::string& what);

// Two paths name the same file: the same device and inode when both exist, else the same path once
// their directories are resolved ("./x" and "x").
bool same_file(const std::string& a, const std::string& b);

// Atomically writes a file: `write` receives a FILE* opened on a temporary in the same directory;
// on success the temporary is fsync'd, renamed to `path` and the directory fsync'd. Refuses (before
// writing) a destination that is not a regular file (check_atomic_output's rules). On any failure
// the temporary is removed, `path` is untouched and Error is thrown.
void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write);

// Several files as one: each temporary is written (write(i, file) for paths[i]) and fsync'd before
// any is renamed, so a failure while writing (a full disk) leaves every destination as it was; then
// all are renamed and their directories fsync'd. (A failure between two renames, which needs the
// filesystem to refuse a rename in a directory it just let us write, is not covered.)
void write_files_atomically(const std::vector<std::string>& paths, const std::function<void(size_t, std::FILE*)>& write);

// Writes exactly `bytes` at `offset` of `fd` (pwrite, retrying short writes and EINTR). Throws
// Error naming `path` on a failure (a full disk: "No space left on device").
void pwrite_all(int fd, const void* data, uint64_t bytes, uint64_t offset, const std::string& path);

// Whether `path` exists and is a directory (following symlinks).
bool is_directory(const std::string& path);

// fwrite that throws Error naming `path` on a short write.
void write_all(std::FILE* file, const void* data, size_t bytes, const std::string& path);

// Whether process `pid` exists on this host (kill(pid, 0); a process of another user counts).
bool process_exists(long pid);

// Note [Stale temporaries]: a process killed by SIGKILL (or a power loss) leaves its temporaries
// behind: "<name>.tmp.<pid>" of atomic writes and conversions, swap directories named by pid.
// Start-up sweeps remove those whose process is gone; a live process's are never touched.
// Removes the entries of `dir` named "<prefix>.tmp.<pid>" (any prefix when `prefix` is empty)
// whose process no longer exists (files or whole trees). Returns how many went. Never throws.
int remove_stale_temporaries(const std::string& dir, const std::string& prefix = "") noexcept;

// Removes every temporary that write_file_atomically is writing right now. Async-signal-safe
// (unlink only, no locks, no allocation): for the signal handler that ends the process.
void remove_temporaries_in_flight() noexcept;

}  // namespace zerone::io
