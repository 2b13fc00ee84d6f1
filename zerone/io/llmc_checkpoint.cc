#include "zerone/io/llmc_checkpoint.h"

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

Header parse_header(const MappedFile& file) {
  const std::string& path = file.path();
  const size_t header_bytes = kHeaderInts * sizeof(int32_t);
  ZERONE_CHECK(file.size() >= header_bytes, "checkpoint '", path, "' is truncated: ", file.size(),
               " bytes, expected at least the ", header_bytes, "-byte header");
  int32_t h[kHeaderInts];
  std::memcpy(h, file.data(), header_bytes);
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
  ZERONE_CHECK(c.max_seq_len > 0 && c.vocab_size > 0 && c.num_layers > 0 && c.num_heads > 0 && c.channels > 0 &&
                   c.padded_vocab_size >= c.vocab_size && c.channels % c.num_heads == 0 && c.channels <= (1 << 16) &&
                   c.num_layers <= 4096 && c.max_seq_len <= (1 << 20) && c.padded_vocab_size <= (1 << 24),
               "checkpoint '", path, "': implausible header (maxT=", c.max_seq_len, " V=", c.vocab_size,
               " L=", c.num_layers, " NH=", c.num_heads, " C=", c.channels, " Vp=", c.padded_vocab_size, ")");
  size_t expected = header_bytes + c.num_parameters() * dtype_size(out.dtype);
  ZERONE_CHECK(file.size() == expected, "checkpoint '", path, "' is ", file.size() < expected ? "truncated" : "too long",
               ": its header describes ", c.num_parameters(), " ", dtype_name(out.dtype), " parameters (", expected,
               " bytes), the file has ", file.size(), " bytes");
  return out;
}

}  // namespace

nn::GPT2Config read_llmc_config(const std::string& path) { return parse_header(MappedFile(path)).config; }

void load_llmc_checkpoint(const std::string& path, nn::GPT2& model, int only_unit) {
  MappedFile file(path);
  Header header = parse_header(file);
  ZERONE_CHECK(header.config == model.config(), "checkpoint '", path, "' holds model ", header.config.to_string(),
               " but the run's model is ", model.config().to_string());
  scatter_llmc_order(file.data() + kHeaderInts * sizeof(int32_t), header.dtype, model, only_unit);
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

void save_llmc_checkpoint(const std::string& path, const nn::GPT2& model, DType file_dtype) {
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
  std::vector<uint8_t> body(c.num_parameters() * dtype_size(file_dtype));
  gather_llmc_order(model, file_dtype, body.data());
  write_file_atomically(path, [&](std::FILE* f) {
    write_all(f, header, sizeof header, path);
    write_all(f, body.data(), body.size(), path);
  });
}

}  // namespace zerone::io
