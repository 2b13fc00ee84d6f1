// Safetensors: files laid out byte by byte here (independently of the writer) are read back
// exactly; the writer round-trips and is read by the reader; sharded directories with an index;
// and every malformed header names the file and the rule it breaks.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "zerone/io/safetensors.h"

namespace zerone::io {
namespace {

using zerone::testing::expect_error;
using zerone::testing::TempDir;
using zerone::testing::write_text;
using zerone::testing::write_bytes;

// 8-byte little-endian header length, the header text, the data.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

std::string f32_bytes(const std::vector<float>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

TEST(Safetensors, ReadsAHandWrittenFile) {
  TempDir dir;
  // a: F32 (2,3) = 0..5; b: BF16 (2) = [1.0, -2.0] (0x3f80, 0xc000); c: I64 (1).
  std::string data = f32_bytes({0, 1, 2, 3, 4, 5});
  data += std::string("\x80\x3f\x00\xc0", 4);
  data += std::string(8, '\x07');
  std::string header = R"({"__metadata__":{"format":"pt"},)"
                       R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},)"
                       R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                       R"("c":{"dtype":"I64","shape":[1],"data_offsets":[28,36]}})";
  write_text(dir.file("m.safetensors"), safetensors_bytes(header, data));
  SafetensorsReader r(dir.file("m.safetensors"));
  ASSERT_EQ(r.tensors().size(), 3u);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  const SafetensorInfo* a = r.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> got(4);
  r.read_f32(*a, 2, 4, got.data());  // a slice, as a rank reading its shard
  EXPECT_EQ(got, (std::vector<float>{2, 3, 4, 5}));
  std::vector<float> b(2);
  r.read_f32(*r.find("b"), 0, 2, b.data());
  EXPECT_EQ(b, (std::vector<float>{1.0f, -2.0f}));
  expect_error([&] { float x; r.read_f32(*r.find("c"), 0, 1, &x); }, "is I64, expected F32, BF16 or F16");
  EXPECT_EQ(r.find("missing"), nullptr);
}

TEST(Safetensors, WriterRoundTripsThroughTheReaderAndIsAligned) {
  TempDir dir;
  std::vector<float> w(6 * 5), bias(5);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * static_cast<float>(i) - 3.0f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 1.0f / (1.0f + i);
  SafetensorsWriter writer;
  writer.add("layer.weight", DType::bf16, {6, 5});
  writer.add("layer.bias", DType::f32, {5});
  writer.set_metadata("format", "pt");
  writer.write(dir.file("out.safetensors"), [&](size_t i, void* out) {
    if (i == 0) convert_from_f32(w.data(), out, DType::bf16, w.size());
    else std::memcpy(out, bias.data(), bias.size() * 4);
  });
  std::vector<char> raw = zerone::testing::read_bytes(dir.file("out.safetensors"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data must start 8-byte aligned";
  SafetensorsReader r(dir.file("out.safetensors"));
  EXPECT_EQ(r.find("layer.weight")->dtype, "BF16");
  std::vector<float> got(w.size());
  r.read_f32(*r.find("layer.weight"), 0, w.size(), got.data());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(got[i], bf16_to_f32(f32_to_bf16(w[i])));  // exact in bf16
  std::vector<float> gb(5);
  r.read_f32(*r.find("layer.bias"), 0, 5, gb.data());
  EXPECT_EQ(gb, bias);
  EXPECT_EQ(r.metadata().at("format"), "pt");
}

TEST(Safetensors, ShardedDirectoryWithIndex) {
  TempDir dir;
  write_text(dir.file("model-00001-of-00002.safetensors"),
             safetensors_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32_bytes({1, 2})));
  write_text(dir.file("model-00002-of-00002.safetensors"),
             safetensors_bytes(R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32_bytes({3})));
  write_text(dir.file("model.safetensors.index.json"),
             R"({"metadata":{"total_size":12},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})");
  SafetensorsReader r(dir.path());
  ASSERT_EQ(r.files().size(), 2u);
  float y = 0;
  r.read_f32(*r.find("y"), 0, 1, &y);
  EXPECT_EQ(y, 3.0f);
  // The index names a tensor its shard does not hold.
  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00001-of-00002.safetensors"}})");
  expect_error([&] { SafetensorsReader bad(dir.path()); }, "lists tensor 'y' in 'model-00001-of-00002.safetensors', which does not hold it");
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"x":"model-00001-of-00002.safetensors","y":"nope.safetensors"}})");
  expect_error([&] { SafetensorsReader bad(dir.path()); }, "nope.safetensors': No such file");
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"x":"../etc/passwd"}})");
  expect_error([&] { SafetensorsReader bad(dir.path()); }, "expected a file in the same directory");
  // A shard holds a tensor the index does not list.
  write_text(dir.file("model-00001-of-00002.safetensors"),
             safetensors_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                               f32_bytes({1, 2, 5})));
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"x":"model-00001-of-00002.safetensors"}})");
  expect_error([&] { SafetensorsReader bad(dir.path()); }, "tensor 'z' of");
  TempDir empty;
  expect_error([&] { SafetensorsReader bad(empty.path()); }, "holds neither model.safetensors nor");
}

TEST(Safetensors, MalformedHeadersNameTheRule) {
  TempDir dir;
  auto check = [&](const std::string& name, const std::string& bytes, const std::string& needle) {
    write_text(dir.file(name), bytes);
    expect_error([&] { SafetensorsReader r(dir.file(name)); }, needle);
  };
  const std::string ok_header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string ok = safetensors_bytes(ok_header, f32_bytes({1, 2}));
  check("short.st", "abc", "truncated: 3 bytes");
  check("cut_header.st", ok.substr(0, 20), "truncated: its header needs");
  check("cut_data.st", ok.substr(0, ok.size() - 1), "ends at data byte 8 but the file holds 7");
  check("huge_len.st", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "breaks the rule 2 <= length");
  check("not_json.st", safetensors_bytes("{nope", ""), "not valid JSON");
  check("not_object.st", safetensors_bytes("[1,2]", ""), "not a JSON object");
  check("dtype.st", safetensors_bytes(R"({"x":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", f32_bytes({1, 2})),
        "unknown dtype \"F7\"");
  check("size.st", safetensors_bytes(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32_bytes({1, 2})),
        "occupies 8 bytes but F32 x shape needs 12");
  check("overflow.st",
        safetensors_bytes(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", f32_bytes({1, 2})),
        "implausibly large shape");
  check("negative.st", safetensors_bytes(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32_bytes({1, 2})),
        "expected a non-negative integer");
  check("backwards.st", safetensors_bytes(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", f32_bytes({1, 2})),
        "begin > end");
  check("overlap.st",
        safetensors_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          f32_bytes({1, 2})),
        "tensors overlap at data byte 4");
  check("gap.st", safetensors_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32_bytes({1, 2})),
        "a gap at data byte 0");
  check("trailing.st", safetensors_bytes(ok_header, f32_bytes({1, 2, 3})), "has 4 bytes after its last tensor");
  check("fields.st", safetensors_bytes(R"({"x":{"dtype":"F32","shape":[2]}})", f32_bytes({1, 2})),
        "lacks one of dtype, shape, data_offsets");
}

}  // namespace
}  // namespace zerone::io
