#include <gtest/gtest.h>

#include <cstring>

#include "tests/test_util.h"
#include "zerone/io/llmc_checkpoint.h"

namespace zerone::io {
namespace {

using zerone::testing::expect_error;
using zerone::testing::read_bytes;
using zerone::testing::TempDir;
using zerone::testing::write_bytes;

const nn::GPT2Config kConfig = nn::parse_model_spec("gpt2:layers=2,dim=32,heads=4,vocab=60,ctx=16");

TEST(LlmcCheckpoint, F32RoundTripIsExactAndHeaderMatchesLlmc) {
  TempDir dir;
  nn::GPT2 model(kConfig, DType::f32);
  model.init_weights(11);
  save_llmc_checkpoint(dir.file("m.bin"), model, DType::f32);
  auto raw = read_bytes(dir.file("m.bin"));
  int32_t h[8];
  std::memcpy(h, raw.data(), sizeof h);
  EXPECT_EQ(h[0], 20240326);
  EXPECT_EQ(h[1], 3);
  EXPECT_EQ(h[2], 16);  // maxT
  EXPECT_EQ(h[3], 60);  // V
  EXPECT_EQ(h[4], 2);   // L
  EXPECT_EQ(h[5], 4);   // NH
  EXPECT_EQ(h[6], 32);  // C
  EXPECT_EQ(h[7], 128); // Vp
  EXPECT_EQ(raw.size(), 1024 + kConfig.num_parameters() * 4);
  EXPECT_EQ(read_llmc_config(dir.file("m.bin")), kConfig);
  nn::GPT2 loaded(kConfig, DType::f32);
  load_llmc_checkpoint(dir.file("m.bin"), loaded);
  for (size_t u = 0; u < model.units().size(); ++u)
    EXPECT_EQ(std::memcmp(model.units()[u].data(), loaded.units()[u].data(), model.units()[u].numel() * 4), 0);
  // The file body is in llm.c order: wte first, then wpe.
  float first;
  std::memcpy(&first, raw.data() + 1024, 4);
  EXPECT_EQ(first, static_cast<const float*>(model.units()[0].param(nn::kWte))[0]);
}

TEST(LlmcCheckpoint, Bf16FileIsTheRneRoundingOfTheModel) {
  TempDir dir;
  nn::GPT2 model(kConfig, DType::f32);
  model.init_weights(12);
  save_llmc_checkpoint(dir.file("m16.bin"), model, DType::bf16);
  auto raw = read_bytes(dir.file("m16.bin"));
  EXPECT_EQ(raw.size(), 1024 + kConfig.num_parameters() * 2);
  nn::GPT2 loaded(kConfig, DType::bf16);
  load_llmc_checkpoint(dir.file("m16.bin"), loaded);
  const float* w = static_cast<const float*>(model.units()[1].param(nn::kQkvw));
  const bf16_t* w16 = static_cast<const bf16_t*>(loaded.units()[1].param(nn::kQkvw));
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(w16[i], f32_to_bf16(w[i]));
}

TEST(LlmcCheckpoint, BadFilesGiveClearErrorsAndSavingIsAtomic) {
  TempDir dir;
  expect_error([&] { read_llmc_config(dir.file("missing.bin")); }, "cannot open");
  int32_t h[256] = {20240326, 4};
  write_bytes(dir.file("v4.bin"), h, sizeof h);
  expect_error([&] { read_llmc_config(dir.file("v4.bin")); }, "version 4");
  h[0] = 1;
  write_bytes(dir.file("magic.bin"), h, sizeof h);
  expect_error([&] { read_llmc_config(dir.file("magic.bin")); }, "not an llm.c GPT-2 checkpoint");
  nn::GPT2 model(kConfig, DType::f32);
  save_llmc_checkpoint(dir.file("m.bin"), model, DType::f32);
  auto raw = read_bytes(dir.file("m.bin"));
  write_bytes(dir.file("cut.bin"), raw.data(), raw.size() - 100);
  expect_error([&] { read_llmc_config(dir.file("cut.bin")); }, "truncated");
  nn::GPT2 other(nn::parse_model_spec("gpt2:layers=1,dim=32,heads=4,vocab=60,ctx=16"), DType::f32);
  expect_error([&] { load_llmc_checkpoint(dir.file("m.bin"), other); }, "holds model");
  // A save into a directory that does not exist fails cleanly and leaves nothing behind.
  expect_error([&] { save_llmc_checkpoint(dir.file("no/such/dir/m.bin"), model, DType::f32); }, "does not exist");
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) entries += e.path().string().find(".tmp.") != std::string::npos;
  EXPECT_EQ(entries, 0) << "no temporary file left behind";
}

}  // namespace
}  // namespace zerone::io
