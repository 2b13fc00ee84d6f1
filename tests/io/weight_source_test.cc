// The weight source (io/weight_source.h): one model saved in each format (a Hugging Face directory,
// an llm.c file, a zerone checkpoint written by `zerone convert --to zerone`'s path) is detected
// as that format, describes the same model, and loads back to the same bytes, unit by unit and in
// another dtype; a directory of neither kind and a missing path are errors naming them.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/test_util.h"
#include "zerone/io/convert.h"
#include "zerone/io/hf_checkpoint.h"
#include "zerone/io/llmc_checkpoint.h"
#include "zerone/io/weight_source.h"
#include "zerone/nn/gpt2.h"

namespace zerone::io {
namespace {

using zerone::testing::expect_error;
using zerone::testing::TempDir;

TEST(WeightSource, EveryFormatIsDetectedAndLoadsTheSameWeights) {
  TempDir dir;
  const std::string spec = "gpt2:layers=2,dim=32,heads=2,vocab=100,ctx=16";
  std::unique_ptr<nn::Model> a = nn::make_model(spec, DType::f32);
  a->init_weights(11);
  save_hf_checkpoint(dir.file("hf"), *a);
  save_llmc_checkpoint(dir.file("m.bin"), dynamic_cast<const nn::GPT2&>(*a), DType::f32);
  ConvertOptions to_zerone;
  to_zerone.src = dir.file("hf");
  to_zerone.dst = dir.file("z");
  to_zerone.to = "zerone";
  convert_checkpoint(to_zerone);
  const std::pair<std::string, WeightFormat> cases[] = {{dir.file("hf"), WeightFormat::hf_directory},
                                                        {dir.file("m.bin"), WeightFormat::llmc_checkpoint},
                                                        {dir.file("z"), WeightFormat::zerone_checkpoint}};
  for (const auto& [path, format] : cases) {
    WeightSource source(path, "--init");
    EXPECT_EQ(source.format(), format) << path;
    EXPECT_EQ(source.stored_dtype(), DType::f32) << path;
    EXPECT_EQ(nn::make_model(source.spec(), DType::f32, 64, false)->spec(), a->spec()) << path;
    EXPECT_EQ(source.checkpoint() != nullptr, format == WeightFormat::zerone_checkpoint) << path;
    EXPECT_EQ(source.tokenizer_dir(), "") << path;
    // Whole, then unit by unit in reverse into a model without storage, then narrowed to bf16.
    std::unique_ptr<nn::Model> b = nn::make_model(spec, DType::f32);
    source.load(*b);
    std::unique_ptr<nn::Model> c = nn::make_model(spec, DType::f32, 64, /*allocate=*/false);
    source.bind(*c);
    for (int u = c->num_units() - 1; u >= 0; --u) {
      c->units()[u].allocate_params();
      source.load_unit(*c, u);
    }
    std::unique_ptr<nn::Model> h = nn::make_model(spec, DType::bf16);
    source.load(*h);
    for (int u = 0; u < a->num_units(); ++u) {
      const nn::FlatParam& want = a->units()[u];
      ASSERT_EQ(std::memcmp(want.data(), b->units()[u].data(), want.param_bytes()), 0) << path << " unit " << u;
      ASSERT_EQ(std::memcmp(want.data(), c->units()[u].data(), want.param_bytes()), 0) << path << " unit " << u;
      std::vector<uint16_t> narrowed(want.numel());
      convert_from_f32(static_cast<const float*>(want.data()), narrowed.data(), DType::bf16, want.numel());
      ASSERT_EQ(std::memcmp(narrowed.data(), h->units()[u].data(), narrowed.size() * 2), 0) << path << " unit " << u;
    }
  }
  // A Hugging Face directory with a tokenizer names itself as the tokenizer's directory.
  zerone::testing::write_text(dir.file("hf/tokenizer.model"), "x");
  EXPECT_EQ(WeightSource(dir.file("hf"), "--init").tokenizer_dir(), dir.file("hf"));
  // A bound source refuses a model of another shape, naming it.
  WeightSource llmc(dir.file("m.bin"), "--init");
  std::unique_ptr<nn::Model> other = nn::make_model("gpt2:layers=1,dim=32,heads=2,vocab=100,ctx=16", DType::f32, 64, false);
  expect_error([&] { llmc.bind(*other); }, "holds model gpt2:layers=2");
}

TEST(WeightSource, WhatIsNotASourceIsNamed) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("junk"));
  expect_error([&] { WeightSource(dir.file("junk"), "--init"); },
               "--init '" + dir.file("junk") + "' is a directory, but neither a Hugging Face model directory");
  expect_error([&] { WeightSource(dir.file("missing.bin"), "convert"); }, "convert: cannot open '" + dir.file("missing.bin") + "'");
}

}  // namespace
}  // namespace zerone::io
