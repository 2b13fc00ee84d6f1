#include "zerone/io/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <memory>
#include <optional>

#include "zerone/core/error.h"

namespace zerone::io {
namespace {

uint32_t be32(const uint8_t* p);

// The bytes an IDX file whose first bytes are `head` must hold (header and data), 0 when the
// header is incomplete, or nullopt when it is no IDX header (read_idx says why).
std::optional<uint64_t> idx_file_bytes(const std::vector<uint8_t>& head) {
  if (head.size() < 4) return 0;
  if (head[0] != 0 || head[1] != 0 || head[2] != 0x08) return std::nullopt;
  const size_t header = 4 + 4 * static_cast<size_t>(head[3]);
  if (head.size() < header) return 0;
  uint64_t numel = 1;
  for (int d = 0; d < head[3]; ++d) {
    const uint32_t size = be32(&head[4 + 4 * d]);
    if (size < 1 || size > (1u << 30)) return std::nullopt;
    numel *= size;
    if (numel > (uint64_t{1} << 40)) return std::nullopt;
  }
  return header + numel;
}

// Reads a file, raw or gzip (by its magic bytes), into memory. Error names the file.
// Note [Decompression bombs]: a gzip stream may inflate to far more than its header declares (35
// MB to 8 GB). Inflation stops one byte past the size the IDX header declares (read_idx then
// reports the extra data), or as soon as the header is found not to be one, so memory stays at
// what a valid file of that header needs.
struct IdxBytes {
  std::vector<uint8_t> bytes;  // the file's first bytes, or all of them
  std::optional<uint64_t> total_bytes;  // the whole (inflated) size, unless inflation stopped early
};

IdxBytes read_maybe_gzip(const std::string& path, const std::string& what) {
  struct stat st;
  ZERONE_CHECK(::stat(path.c_str(), &st) == 0, what, " '", path, "': ", std::strerror(errno));
  ZERONE_CHECK(S_ISREG(st.st_mode), what, " '", path, "' is not a regular file");
  gzFile raw = gzopen(path.c_str(), "rb");  // reads plain files transparently too
  ZERONE_CHECK(raw != nullptr, what, " '", path, "': cannot open: ", std::strerror(errno));
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(raw, gzclose);
  gzbuffer(raw, 1 << 20);
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(st.st_size));
  uint8_t chunk[1 << 16];
  bool stopped_early = false;
  for (;;) {
    size_t want = sizeof chunk;
    if (out.size() < 4 + 4 * 255) want = std::min<size_t>(want, 4 + 4 * 255 - out.size());  // the header first
    const std::optional<uint64_t> expected = idx_file_bytes(out);
    if (!expected || *expected > 0) {
      const uint64_t limit = expected ? *expected + 1 : out.size();
      if (out.size() >= limit) {
        stopped_early = true;
        break;
      }
      want = static_cast<size_t>(std::min<uint64_t>(want, limit - out.size()));
    }
    int n = gzread(raw, chunk, static_cast<unsigned>(want));
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(raw, &code);
      throw Error(str_cat(what, " '", path, "': cannot decompress (", msg ? msg : "gzip error",
                          "): the file is corrupt or truncated"));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk, chunk + n);
  }
  if (stopped_early) {
    // A plain file's size is known without reading it; a gzip stream's is not.
    std::optional<uint64_t> total;
    if (gzdirect(raw) == 1) total = static_cast<uint64_t>(st.st_size);
    return IdxBytes{std::move(out), total};
  }
  // zlib reports a gzip stream cut short as end of file with Z_BUF_ERROR.
  int code = Z_OK;
  gzerror(raw, &code);
  ZERONE_CHECK(code == Z_OK, what, " '", path, "': the gzip stream ends early: the file is truncated");
  const uint64_t total = out.size();
  return IdxBytes{std::move(out), total};
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string find_file(const std::string& dir, const std::string& stem) {
  struct stat st;
  const std::string raw = dir + "/" + stem, gz = raw + ".gz";
  const bool have_raw = ::stat(raw.c_str(), &st) == 0, have_gz = ::stat(gz.c_str(), &st) == 0;
  ZERONE_CHECK(!(have_raw && have_gz), "'", dir, "' holds both '", stem, "' and '", stem,
               ".gz': one of them is stale or a partial download; remove the one that is not the data you mean");
  return have_raw ? raw : have_gz ? gz : "";
}

std::string images_path(const std::string& dir, const std::string& split) {
  std::string p = find_file(dir, split + "-images-idx3-ubyte");
  return p.empty() ? find_file(dir, split + "-images-idx4-ubyte") : p;
}

}  // namespace

IdxArray read_idx(const std::string& path, const std::vector<int>& allowed_dims, const std::string& what) {
  IdxBytes file = read_maybe_gzip(path, what);
  std::vector<uint8_t>& bytes = file.bytes;
  std::string expected;
  for (int d : allowed_dims) expected += str_cat(expected.empty() ? "" : " or ", d);
  ZERONE_CHECK(bytes.size() >= 4, what, " '", path, "' holds ", bytes.size(),
               " bytes, too few for an IDX header (4 bytes of magic)");
  ZERONE_CHECK(bytes[0] == 0 && bytes[1] == 0, what, " '", path, "' is not an IDX file: its magic starts with ",
               int{bytes[0]}, " ", int{bytes[1]}, ", expected 0 0 (e.g. 0x00000803 for images)");
  ZERONE_CHECK(bytes[2] == 0x08, what, " '", path, "': IDX element type 0x", std::hex, int{bytes[2]}, std::dec,
               " is not supported: expected 0x08 (unsigned bytes)");
  const int D = bytes[3];
  bool allowed = false;
  for (int d : allowed_dims) allowed |= d == D;
  ZERONE_CHECK(allowed, what, " '", path, "': the IDX file has ", D, " dimensions, expected ", expected);
  const size_t header = 4 + 4 * static_cast<size_t>(D);
  ZERONE_CHECK(bytes.size() >= header, what, " '", path, "' is truncated inside its header (", bytes.size(),
               " bytes, the header of ", D, " dimensions needs ", header, ")");
  IdxArray a;
  uint64_t numel = 1;
  for (int d = 0; d < D; ++d) {
    const uint32_t size = be32(&bytes[4 + 4 * d]);
    ZERONE_CHECK(size >= 1 && size <= (1u << 30), what, " '", path, "': dimension ", d, " is ", size,
                 ", expected 1..2^30");
    numel *= size;
    ZERONE_CHECK(numel <= (uint64_t{1} << 40), what, " '", path, "': the dimensions describe more than 2^40 elements");
    a.dims.push_back(size);
  }
  const uint64_t have = bytes.size() - header;
  ZERONE_CHECK(have >= numel, what, " '", path, "' is truncated: its header promises ", numel, " bytes of data, it holds ",
               have);
  if (have != numel) {
    if (file.total_bytes)
      throw Error(str_cat(what, " '", path, "' has ", *file.total_bytes - header - numel, " bytes after the ", numel,
                          " its header describes"));
    throw Error(str_cat(what, " '", path, "' inflates to more data than the ", numel,
                        " bytes its header describes (a damaged file or a decompression bomb: inflation stopped there)"));
  }
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return a;
}

size_t ImageDataset::sample_numel() const {
  size_t n = 1;
  for (int64_t d : sample_shape) n *= static_cast<size_t>(d);
  return n;
}

bool has_image_split(const std::string& dir, const std::string& split) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  const bool images = !images_path(dir, split).empty(), labels = !find_file(dir, split + "-labels-idx1-ubyte").empty();
  // Half a split is a broken download, not "no split": validation would be skipped silently.
  ZERONE_CHECK(images || !labels, "'", dir, "' holds ", split, "-labels-idx1-ubyte but no ", split,
               "-images-idx3-ubyte[.gz] (or -idx4-ubyte): the ", split == "t10k" ? "validation" : "training",
               " split needs both; restore the images or remove the labels");
  return images;
}

ImageDataset load_image_split(const std::string& dir, const std::string& split, const std::string& flag) {
  struct stat st;
  ZERONE_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), flag, " '", dir,
               "' is not a directory (expected one holding ", split, "-images-idx3-ubyte[.gz] and ", split,
               "-labels-idx1-ubyte[.gz])");
  ImageDataset ds;
  ds.images_path = images_path(dir, split);
  ds.labels_path = find_file(dir, split + "-labels-idx1-ubyte");
  ZERONE_CHECK(!ds.images_path.empty(), flag, " '", dir, "' has no ", split, "-images-idx3-ubyte[.gz] (or -idx4-ubyte)");
  ZERONE_CHECK(!ds.labels_path.empty(), flag, " '", dir, "' has no ", split, "-labels-idx1-ubyte[.gz]");
  IdxArray images = read_idx(ds.images_path, {3, 4}, flag + " images");
  IdxArray labels = read_idx(ds.labels_path, {1}, flag + " labels");
  ZERONE_CHECK(images.dims[0] == labels.dims[0], flag, ": '", ds.images_path, "' holds ", images.dims[0],
               " images but '", ds.labels_path, "' holds ", labels.dims[0], " labels; expected the same count");
  ds.count = images.dims[0];
  ds.sample_shape = images.dims.size() == 3 ? std::vector<int64_t>{1, images.dims[1], images.dims[2]}
                                            : std::vector<int64_t>{images.dims[1], images.dims[2], images.dims[3]};
  ds.pixels = std::move(images.data);
  ds.labels = std::move(labels.data);
  return ds;
}

}  // namespace zerone::io
