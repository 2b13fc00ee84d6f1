#include "zerone/io/llmc_checkpoint.h"

#include <unistd.h>
#include <cerrno>
#include <cstring>

#include <cmath>
#include <cstring>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/io/file.h"

namespace zerone::io {
namespace {

constexpr size_t kHeaderInts = 256;
constexpr int kNumTensors = 16;

// For llm.c tensor j, calls visit(unit, tensor_in_unit) for each unit slice in file order.
template <typename Visit>
void for_each_slice(const nn::GPT2Config& c, int j, Visit&& visit) {
  if (j < 2) {
    visit(0, j);
  } else if (j < 14) {
    for (int l = 0; l < c.num_layers; ++l) visit(1 + l, j - 2);
  } else {
    visit(c.num_layers + 1, j - 14);
  }
}

struct Header {
  nn::GPT2Config config;
  DType dtype;
};

// Reads and checks the header of the open checkpoint `fd` of `file_bytes` bytes. Each rule gets
// its own message, so a broken header says which rule it breaks.
Header parse_header(int fd, size_t file_bytes, const std::string& path) {
  const size_t header_bytes = kHeaderInts * sizeof(int32_t);
  ZERONE_CHECK(file_bytes >= header_bytes, "checkpoint '", path, "' is truncated: ", file_bytes,
               " bytes, expected at least the ", header_bytes, "-byte header");
  int32_t h[kHeaderInts];
  read_exactly(fd, h, header_bytes, 0, path);
  ZERONE_CHECK(h[0] == kLlmcCheckpointMagic, "'", path, "' is not an llm.c GPT-2 checkpoint: magic ", h[0],
               ", expected 20240326");
  ZERONE_CHECK(h[1] == 3 || h[1] == 5, "checkpoint '", path, "': version ", h[1], ", expected 3 (f32) or 5 (bf16)");
  Header out;
  out.dtype = h[1] == 3 ? DType::f32 : DType::bf16;
  nn::GPT2Config& c = out.config;
  c.max_seq_len = h[2];
  c.vocab_size = h[3];
  c.num_layers = h[4];
  c.num_heads = h[5];
  c.channels = h[6];
  c.padded_vocab_size = h[7];
  auto rule = [&](bool ok, const char* field, int value, const char* expected) {
    ZERONE_CHECK(ok, "checkpoint '", path, "': header field ", field, " = ", value, " breaks the rule ", expected);
  };
  rule(c.max_seq_len >= 1 && c.max_seq_len <= (1 << 20), "maxT (header[2])", c.max_seq_len, "1 <= maxT <= 1048576");
  rule(c.vocab_size >= 1 && c.vocab_size <= (1 << 24), "V (header[3])", c.vocab_size, "1 <= V <= 16777216");
  rule(c.num_layers >= 1 && c.num_layers <= 4096, "L (header[4])", c.num_layers, "1 <= L <= 4096");
  rule(c.num_heads >= 1 && c.num_heads <= 4096, "NH (header[5])", c.num_heads, "1 <= NH <= 4096");
  rule(c.channels >= 1 && c.channels <= (1 << 16), "C (header[6])", c.channels, "1 <= C <= 65536");
  rule(c.channels % c.num_heads == 0, "C (header[6])", c.channels, "C divisible by NH (header[5])");
  rule(c.padded_vocab_size >= c.vocab_size && c.padded_vocab_size <= (1 << 24), "Vp (header[7])",
       c.padded_vocab_size, "V <= Vp <= 16777216");
  size_t expected = header_bytes + c.num_parameters() * dtype_size(out.dtype);
  ZERONE_CHECK(file_bytes == expected, "checkpoint '", path, "' is ", file_bytes < expected ? "truncated" : "too long",
               ": its header describes ", c.num_parameters(), " ", dtype_name(out.dtype), " parameters (", expected,
               " bytes), the file has ", file_bytes, " bytes");
  return out;
}

}  // namespace

nn::GPT2Config read_llmc_config(const std::string& path, const std::string& what) {
  size_t bytes = 0;
  FileDescriptor fd = open_regular_file(path, what, &bytes);
  return parse_header(fd.get(), bytes, path).config;
}

void load_llmc_checkpoint(const std::string& path, nn::GPT2& model, int only_unit) {
  size_t bytes = 0;
  FileDescriptor fd = open_regular_file(path, "", &bytes);
  Header header = parse_header(fd.get(), bytes, path);
  ZERONE_CHECK(header.config == model.config(), "checkpoint '", path, "' holds model ", header.config.to_string(),
               " but the run's model is ", model.config().to_string());
  // Read slice by slice (pread): only the requested unit's bytes, and a file that shrinks while
  // being read is an Error, not SIGBUS (Note [No mmap for data]).
  const size_t value_bytes = dtype_size(header.dtype);
  uint64_t offset = kHeaderInts * sizeof(int32_t);
  // In chunks, so that loading one unit (a converter holds one at a time) needs a few MiB beside it.
  constexpr size_t kChunk = size_t{1} << 22;
  std::vector<uint8_t> raw;
  std::vector<float> tmp;
  for (int j = 0; j < kNumTensors; ++j) {
    for_each_slice(model.config(), j, [&](int u, int t) {
      nn::FlatParam& unit = model.units()[u];
      const size_t n = unit.tensors()[t].numel();
      if (only_unit < 0 || u == only_unit) {
        char* dst = static_cast<char*>(unit.param(t));
        for (size_t b = 0; b < n; b += kChunk) {
          const size_t m = std::min(kChunk, n - b);
          raw.resize(m * value_bytes);
          read_exactly(fd.get(), raw.data(), raw.size(), offset + b * value_bytes, path);
          tmp.resize(m);
          convert_to_f32(raw.data(), header.dtype, tmp.data(), m);
          for (size_t i = 0; i < m; ++i)
            ZERONE_CHECK(std::isfinite(tmp[i]), "checkpoint '", path, "': ", unit.name(), ".", unit.tensors()[t].name,
                         " holds a non-finite value (", tmp[i], ") at element ", b + i, ": the file is corrupt");
          convert_from_f32(tmp.data(), dst + b * dtype_size(unit.dtype()), unit.dtype(), m);
        }
      }
      offset += n * value_bytes;
    });
  }
}

void scatter_llmc_order(const void* values, DType dtype, nn::GPT2& model, int only_unit) {
  const uint8_t* cursor = static_cast<const uint8_t*>(values);
  std::vector<float> tmp;
  for (int j = 0; j < kNumTensors; ++j) {
    for_each_slice(model.config(), j, [&](int u, int t) {
      nn::FlatParam& unit = model.units()[u];
      size_t n = unit.tensors()[t].numel();
      if (only_unit >= 0 && u != only_unit) {
        cursor += n * dtype_size(dtype);
        return;
      }
      tmp.resize(n);
      convert_to_f32(cursor, dtype, tmp.data(), n);
      convert_from_f32(tmp.data(), unit.param(t), unit.dtype(), n);
      cursor += n * dtype_size(dtype);
    });
  }
}

void gather_llmc_order(const nn::GPT2& model, DType dtype, void* values) {
  uint8_t* cursor = static_cast<uint8_t*>(values);
  std::vector<float> tmp;
  for (int j = 0; j < kNumTensors; ++j) {
    for_each_slice(model.config(), j, [&](int u, int t) {
      const nn::FlatParam& unit = model.units()[u];
      size_t n = unit.tensors()[t].numel();
      tmp.resize(n);
      convert_to_f32(unit.param(t), unit.dtype(), tmp.data(), n);
      convert_from_f32(tmp.data(), cursor, dtype, n);
      cursor += n * dtype_size(dtype);
    });
  }
}

void gather_llmc_order_f32(const nn::GPT2& model, const std::vector<const float*>& unit_buffers, float* out) {
  ZERONE_ASSERT(unit_buffers.size() == model.units().size());
  for (int j = 0; j < kNumTensors; ++j) {
    for_each_slice(model.config(), j, [&](int u, int t) {
      const nn::TensorSpec& spec = model.units()[u].tensors()[t];
      std::memcpy(out, unit_buffers[u] + spec.offset, spec.numel() * sizeof(float));
      out += spec.numel();
    });
  }
}

void save_llmc_checkpoint(const std::string& path, const nn::GPT2& model, DType file_dtype,
                          const std::function<void(int unit)>& load) {
  ZERONE_CHECK(file_dtype == DType::f32 || file_dtype == DType::bf16, "llm.c checkpoints hold f32 or bf16, not ",
               dtype_name(file_dtype));
  const nn::GPT2Config& c = model.config();
  int32_t header[kHeaderInts] = {};
  header[0] = kLlmcCheckpointMagic;
  header[1] = file_dtype == DType::f32 ? 3 : 5;
  header[2] = c.max_seq_len;
  header[3] = c.vocab_size;
  header[4] = c.num_layers;
  header[5] = c.num_heads;
  header[6] = c.channels;
  header[7] = c.padded_vocab_size;
  // Where each (unit, tensor) lands in the file (llm.c order is tensor-major across layers).
  const size_t value_bytes = dtype_size(file_dtype);
  std::vector<std::vector<uint64_t>> offset(model.units().size());
  for (size_t u = 0; u < model.units().size(); ++u) offset[u].resize(model.units()[u].tensors().size());
  uint64_t cursor = sizeof header;
  for (int j = 0; j < kNumTensors; ++j)
    for_each_slice(c, j, [&](int u, int t) {
      offset[u][t] = cursor;
      cursor += model.units()[u].tensors()[t].numel() * value_bytes;
    });
  write_file_atomically(path, [&](std::FILE* f) {
    write_all(f, header, sizeof header, path);
    ZERONE_CHECK(std::fflush(f) == 0, "cannot write '", path, "': ", std::strerror(errno));
    // Each tensor is written where llm.c's order puts it: straight from the unit when the dtypes
    // agree, else converted in chunks (a few MiB beside the unit).
    constexpr size_t kChunk = size_t{1} << 22;
    std::vector<float> tmp;
    std::vector<uint8_t> out;
    for (int u = 0; u < static_cast<int>(model.units().size()); ++u) {
      if (load) load(u);
      const nn::FlatParam& unit = model.units()[u];
      for (size_t t = 0; t < unit.tensors().size(); ++t) {
        const size_t n = unit.tensors()[t].numel();
        const char* src = static_cast<const char*>(unit.param(t));
        if (unit.dtype() == file_dtype) {
          pwrite_all(::fileno(f), src, n * value_bytes, offset[u][t], path);
          continue;
        }
        for (size_t b = 0; b < n; b += kChunk) {
          const size_t m = std::min(kChunk, n - b);
          tmp.resize(m);
          out.resize(m * value_bytes);
          convert_to_f32(src + b * dtype_size(unit.dtype()), unit.dtype(), tmp.data(), m);
          convert_from_f32(tmp.data(), out.data(), file_dtype, m);
          pwrite_all(::fileno(f), out.data(), out.size(), offset[u][t] + b * value_bytes, path);
        }
      }
    }
  });
}

}  // namespace zerone::io
