// File helpers shared by every reader and writer in zerone/io.
//
// Readers map files read-only and report problems as Error naming the path. Writers never leave a
// half-written file: they write to "<path>.tmp.<pid>", fsync, and rename over the destination.
// Thread-safety: independent calls on different paths are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zerone::io {

// A read-only memory mapping of a whole file (RAII). Throws Error if the file cannot be opened.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
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

// Atomically writes a file: `write` receives a FILE* opened on a temporary in the same directory;
// on success the temporary is fsync'd and renamed to `path`. On any failure the temporary is
// removed, `path` is untouched and Error is thrown.
void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write);

// fwrite that throws Error naming `path` on a short write.
void write_all(std::FILE* file, const void* data, size_t bytes, const std::string& path);

}  // namespace zerone::io
