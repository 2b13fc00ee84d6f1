#include "zerone/io/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "zerone/core/error.h"

namespace zerone::io {
namespace {

using json = nlohmann::json;

// Headers larger than this are refused as corrupt (the format's own reference limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::optional<size_t> safetensors_dtype_bytes(const std::string& name) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(name);
  if (it == sizes.end()) return std::nullopt;
  return it->second;
}

std::optional<DType> safetensors_float_dtype(const std::string& name) {
  if (name == "F32") return DType::f32;
  if (name == "BF16") return DType::bf16;
  if (name == "F16") return DType::f16;
  return std::nullopt;
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  return "?";
}

uint64_t SafetensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) {
  if (!is_directory(path)) {
    open_file(path);
    return;
  }
  const std::string index_path = path + "/model.safetensors.index.json";
  if (!exists(index_path)) {
    const std::string single = path + "/model.safetensors";
    ZERONE_CHECK(exists(single), "'", path, "' holds neither model.safetensors nor model.safetensors.index.json");
    open_file(single);
    return;
  }
  // Both layouts: one of them is stale (a save into a directory that held the other). Which is
  // ambiguous (transformers takes model.safetensors), so neither is guessed.
  ZERONE_CHECK(!exists(path + "/model.safetensors"), "'", path, "' holds both model.safetensors and a sharded model ",
               "(model.safetensors.index.json): one of them is stale; remove the one that is not the model you mean");
  json index;
  try {
    index = json::parse(read_text_file(index_path, ""));
  } catch (const json::exception& e) {
    throw Error(str_cat("'", index_path, "' is not valid JSON: ", e.what()));
  }
  ZERONE_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), "'", index_path,
               "' has no \"weight_map\" object");
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> shard_names;
  for (auto& [name, file] : index["weight_map"].items()) {
    ZERONE_CHECK(file.is_string(), "'", index_path, "': weight_map entry '", name, "' is not a file name");
    const std::string f = file.get<std::string>();
    ZERONE_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..", "'", index_path,
                 "': weight_map entry '", name, "' names '", f, "', expected a file in the same directory");
    weight_map[name] = f;
    if (std::find(shard_names.begin(), shard_names.end(), f) == shard_names.end()) shard_names.push_back(f);
  }
  std::sort(shard_names.begin(), shard_names.end());
  for (const std::string& f : shard_names) open_file(path + "/" + f);
  for (const auto& [name, file] : weight_map) {
    const SafetensorInfo* t = find(name);
    ZERONE_CHECK(t != nullptr, "'", index_path, "' lists tensor '", name, "' in '", file, "', which does not hold it");
    ZERONE_CHECK(paths_[t->file_index] == path + "/" + file, "'", index_path, "' lists tensor '", name, "' in '", file,
                 "' but it is in '", paths_[t->file_index], "'");
  }
  for (const SafetensorInfo& t : tensors_)
    ZERONE_CHECK(weight_map.count(t.name) > 0, "tensor '", t.name, "' of '", paths_[t.file_index], "' is missing from '",
                 index_path, "'");
}

void SafetensorsReader::open_file(const std::string& path) {
  size_t file_bytes = 0;
  FileDescriptor fd = open_regular_file(path, "", &file_bytes);
  ZERONE_CHECK(file_bytes >= 8, "safetensors file '", path, "' is truncated: ", file_bytes,
               " bytes, expected at least the 8-byte header length");
  uint8_t len_bytes[8];
  read_exactly(fd.get(), len_bytes, 8, 0, path);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | len_bytes[i];
  ZERONE_CHECK(header_bytes >= 2 && header_bytes <= kMaxHeaderBytes, "safetensors file '", path, "': header length ",
               header_bytes, " breaks the rule 2 <= length <= ", kMaxHeaderBytes);
  ZERONE_CHECK(8 + header_bytes <= file_bytes, "safetensors file '", path, "' is truncated: its header needs ",
               8 + header_bytes, " bytes, the file has ", file_bytes);
  std::string text(header_bytes, '\0');
  read_exactly(fd.get(), text.data(), header_bytes, 8, path);
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(str_cat("safetensors file '", path, "': the header is not valid JSON: ", e.what()));
  }
  ZERONE_CHECK(header.is_object(), "safetensors file '", path, "': the header is not a JSON object");
  const uint64_t data_begin = 8 + header_bytes, data_bytes = file_bytes - data_begin;
  const int file_index = static_cast<int>(paths_.size());
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) relative to the data
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      ZERONE_CHECK(entry.is_object(), "safetensors file '", path, "': __metadata__ is not an object");
      if (file_index == 0)
        for (auto& [k, v] : entry.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    auto bad = [&](const std::string& rule) {
      return Error(str_cat("safetensors file '", path, "': tensor '", name, "' ", rule));
    };
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      throw bad("lacks one of dtype, shape, data_offsets");
    const json& dt = entry["dtype"];
    const json& shape = entry["shape"];
    const json& offsets = entry["data_offsets"];
    if (!dt.is_string()) throw bad("has a dtype that is not a string");
    std::optional<size_t> elem = safetensors_dtype_bytes(dt.get<std::string>());
    if (!elem) throw bad(str_cat("has unknown dtype ", dt.dump()));
    if (!shape.is_array()) throw bad("has a shape that is not a list");
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      throw bad("has data_offsets that are not two non-negative integers");
    SafetensorInfo info;
    info.name = name;
    info.dtype = dt.get<std::string>();
    info.file_index = file_index;
    // numel with overflow checks: a lying shape must not wrap around to a plausible size.
    unsigned __int128 numel = 1;
    for (const json& d : shape) {
      if (!d.is_number_unsigned()) throw bad(str_cat("has shape entry ", d.dump(), ", expected a non-negative integer"));
      info.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
      numel *= d.get<uint64_t>();
      if (numel > (static_cast<unsigned __int128>(1) << 62)) throw bad("has an implausibly large shape");
    }
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end) throw bad(str_cat("has data_offsets [", begin, ", ", end, "] with begin > end"));
    if (end > data_bytes)
      throw bad(str_cat("ends at data byte ", end, " but the file holds ", data_bytes, " data bytes (truncated?)"));
    info.bytes = end - begin;
    if (static_cast<unsigned __int128>(info.bytes) != numel * *elem)
      throw bad(str_cat("occupies ", info.bytes, " bytes but ", info.dtype, " x shape needs ",
                        static_cast<uint64_t>(numel * *elem)));
    info.offset = data_begin + begin;
    if (by_name_.count(name)) throw bad(str_cat("appears in both '", paths_[tensors_[by_name_[name]].file_index], "' and here"));
    by_name_[name] = tensors_.size();
    tensors_.push_back(std::move(info));
    ranges.emplace_back(begin, end);
  }
  // The tensors must tile the data exactly: sorted, each starts where the previous one ended.
  std::sort(ranges.begin(), ranges.end());
  uint64_t cursor = 0;
  for (const auto& [b, e] : ranges) {
    ZERONE_CHECK(b == cursor, "safetensors file '", path, "': ", b < cursor ? "tensors overlap" : "a gap", " at data byte ",
                 std::min(b, cursor));
    cursor = e;
  }
  ZERONE_CHECK(cursor == data_bytes, "safetensors file '", path, "' has ", data_bytes - cursor,
               " bytes after its last tensor");
  paths_.push_back(path);
  fds_.push_back(std::move(fd));
}

const SafetensorInfo* SafetensorsReader::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsReader::read_raw(const SafetensorInfo& t, void* out) const {
  read_exactly(fds_[t.file_index].get(), out, t.bytes, t.offset, paths_[t.file_index]);
}

void SafetensorsReader::read_f32(const SafetensorInfo& t, uint64_t first, uint64_t count, float* out) const {
  std::optional<DType> dtype = safetensors_float_dtype(t.dtype);
  ZERONE_CHECK(dtype.has_value(), "tensor '", t.name, "' of '", paths_[t.file_index], "' is ", t.dtype,
               ", expected F32, BF16 or F16");
  ZERONE_ASSERT(first + count <= t.numel(), "read past the end of tensor ", t.name);
  const size_t elem = dtype_size(*dtype);
  if (*dtype == DType::f32) {
    read_exactly(fds_[t.file_index].get(), out, count * elem, t.offset + first * elem, paths_[t.file_index]);
    return;
  }
  // 16-bit types: read into the upper half of `out`, widen front to back (as TokenDataset does).
  auto* narrow = reinterpret_cast<uint16_t*>(out) + count;
  read_exactly(fds_[t.file_index].get(), narrow, count * elem, t.offset + first * elem, paths_[t.file_index]);
  for (uint64_t i = 0; i < count; ++i) out[i] = *dtype == DType::bf16 ? bf16_to_f32(narrow[i]) : f16_to_f32(narrow[i]);
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  ZERONE_ASSERT(!name.empty() && name != "__metadata__", "bad tensor name '", name, "'");
  for (const Entry& e : entries_) ZERONE_ASSERT(e.name != name, "tensor '", name, "' added twice");
  uint64_t numel = 1;
  for (int64_t d : shape) {
    ZERONE_ASSERT(d >= 0, "negative dimension in ", name);
    numel *= static_cast<uint64_t>(d);
  }
  entries_.push_back(Entry{name, dtype, std::move(shape), numel * dtype_size(dtype)});
}

void SafetensorsWriter::write(const std::string& path, const std::function<void(size_t, void*)>& produce) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as the reference writer does
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  write_file_atomically(path, [&](std::FILE* f) {
    write_all(f, len_bytes, 8, path);
    write_all(f, text.data(), text.size(), path);
    std::vector<uint8_t> buffer;
    for (size_t i = 0; i < entries_.size(); ++i) {
      buffer.resize(entries_[i].bytes);
      produce(i, buffer.data());
      write_all(f, buffer.data(), buffer.size(), path);
    }
  });
}

}  // namespace zerone::io
