// Safetensors files and Hugging Face weight directories.
//
// Format (huggingface/safetensors): an 8-byte little-endian header length N, N bytes of JSON
// {"NAME": {"dtype": "F32"|"BF16"|"F16"|..., "shape": [d0, d1, ...], "data_offsets": [begin, end]},
//  ..., "__metadata__": {"key": "value", ...}} (padded with spaces), then the data; offsets are
// relative to the first byte after the header, tensors are row-major, little-endian, and together
// cover the data exactly, without gaps or overlaps. A directory holds either model.safetensors or
// a sharded set listed by model.safetensors.index.json ({"weight_map": {"NAME": "FILE", ...}}).
//
// Reading is by pread of only the requested bytes (Note [No mmap for data] in token_shards.h), so a
// rank that keeps one shard of a tensor reads just that slice, and a file that shrinks under a run
// is an Error, not SIGBUS. Every header is validated when opened: JSON, dtypes, shapes, offsets
// within the file and consistent with dtype x shape, no overlap, no gap, no trailing bytes.
// Writing is atomic (io/file.h) and streaming: the header is computed from the declared tensors,
// then each tensor's bytes are produced in order by a callback, so the whole model never needs to
// be in memory at once.
//
// Thread-safety: a SafetensorsReader is immutable after construction; its reads may run
// concurrently (pread has no file position). A SafetensorsWriter is for one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/io/file.h"

namespace zerone::io {

// A safetensors element type name ("F32", "BF16", "F16", "I64", ...) and its size in bytes.
// Returns nullopt for a name the format does not define.
std::optional<size_t> safetensors_dtype_bytes(const std::string& name);
// The DType of a floating-point safetensors type (F32, BF16, F16), nullopt for the others.
std::optional<DType> safetensors_float_dtype(const std::string& name);
const char* safetensors_dtype_name(DType dtype);

struct SafetensorInfo {
  std::string name;
  std::string dtype;            // the file's type name, e.g. "BF16"
  std::vector<int64_t> shape;
  int file_index = 0;           // into SafetensorsReader::files()
  uint64_t offset = 0;          // absolute byte offset of the data in its file
  uint64_t bytes = 0;
  uint64_t numel() const;
};

class SafetensorsReader {
 public:
  // `path`: a .safetensors file, or a directory with model.safetensors or
  // model.safetensors.index.json (+ the shards it names). Throws Error naming the file and the
  // broken rule for anything malformed, a missing shard, a tensor listed in the index but absent
  // from its shard (or present in two files).
  explicit SafetensorsReader(const std::string& path);

  // The tensor called `name`, or nullptr.
  const SafetensorInfo* find(const std::string& name) const;
  const std::vector<SafetensorInfo>& tensors() const { return tensors_; }
  const std::vector<std::string>& files() const { return paths_; }
  // __metadata__ of the (first) file.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads elements [first, first + count) of `tensor` (flattened, row-major), converted to f32.
  // The tensor must be F32, BF16 or F16 (Error naming it otherwise).
  void read_f32(const SafetensorInfo& tensor, uint64_t first, uint64_t count, float* out) const;
  // Reads the tensor's raw bytes (tensor.bytes of them) into `out`.
  void read_raw(const SafetensorInfo& tensor, void* out) const;

 private:
  void open_file(const std::string& path);
  std::vector<std::string> paths_;
  std::vector<FileDescriptor> fds_;
  std::vector<SafetensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Streams one .safetensors file. Declare every tensor (add), then write(): the header is laid out
// in declaration order and `produce(i, out)` is called for tensor i in that order to fill its bytes
// (a buffer of exactly its size). The file appears atomically at `path`; on any failure nothing is
// left behind and Error is thrown.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  void write(const std::string& path, const std::function<void(size_t index, void* out)>& produce) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace zerone::io
