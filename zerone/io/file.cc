#include "zerone/io/file.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <cstdio>
#include <cstring>

#include "zerone/core/error.h"

namespace zerone::io {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERONE_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(str_cat("'", path, "' is not a regular file"));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    ZERONE_CHECK(p != MAP_FAILED, "cannot map '", path, "': ", std::strerror(err));
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
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

void write_all(std::FILE* file, const void* data, size_t bytes, const std::string& path) {
  ZERONE_CHECK(bytes == 0 || std::fwrite(data, 1, bytes, file) == bytes, "write to '", path, "' failed: ",
               std::strerror(errno));
}

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  std::string tmp = str_cat(path, ".tmp.", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  ZERONE_CHECK(f != nullptr, "cannot create '", tmp, "': ", std::strerror(errno));
  try {
    write(f);
    ZERONE_CHECK(std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0, "cannot flush '", tmp, "': ", std::strerror(errno));
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
}

}  // namespace zerone::io
