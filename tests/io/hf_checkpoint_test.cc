// Hugging Face checkpoints:
//  - tests/data/hf_llama_{untied,tied} were written from scratch by tests/nn/make_llama_golden.py in
//    transformers' LlamaForCausalLM layout (q/k/v/gate/up separate); loading them with --init's
//    reader must reproduce the PyTorch golden logits and loss, so the tensor map is checked against
//    an independent writer, not against itself; tests/data/hf_llama_rope_parameters is the untied
//    model with its rotary settings as transformers 5 writes them (Note [rope_parameters]);
//  - save then load is bitwise lossless for GPT-2 and LLaMA (tied, untied), f32 and bf16, and the
//    padded vocabulary rows of GPT-2 stay zero;
//  - wrong, missing or foreign tensors and unsupported configs are errors naming them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/nn/llama_golden.h"
#include "tests/test_util.h"
#include "zerone/io/hf_checkpoint.h"
#include "zerone/io/safetensors.h"
#include "zerone/nn/gpt2.h"

namespace zerone::io {
namespace {

using zerone::testing::expect_error;
using zerone::testing::TempDir;

TEST(HfCheckpoint, LoadsTransformersLayoutToThePyTorchGolden) {
  auto cases = nn::load_llama_golden();
  ASSERT_EQ(cases.size(), 2u);
  const std::pair<const char*, size_t> dirs[] = {{"hf_llama_untied", 0}, {"hf_llama_rope_parameters", 0}, {"hf_llama_tied", 1}};
  for (const auto& [name, i] : dirs) {
    const std::string dir = std::string(ZERONE_TEST_DATA_DIR) + "/" + name;
    const nn::LlamaGolden& g = cases[i];
    const std::string spec = read_hf_spec(dir);
    EXPECT_EQ(nn::parse_llama_spec(spec), g.config) << spec;
    std::unique_ptr<nn::Model> model = nn::make_model(spec, DType::f32);
    load_hf_checkpoint(dir, *model);
    const float loss = model->forward(g.inputs.data(), g.targets.data(), g.B, g.T);
    EXPECT_NEAR(loss, g.loss, 1e-5 * std::abs(g.loss)) << name;
    double worst = 0, scale = 1;
    const std::vector<float> logits = model->logits_to_host(0, static_cast<size_t>(g.B) * g.T);
    for (size_t k = 0; k < g.logits.size(); ++k) {
      worst = std::max(worst, static_cast<double>(std::abs(logits[k] - g.logits[k])));
      scale = std::max(scale, static_cast<double>(std::abs(g.logits[k])));
    }
    EXPECT_LE(worst, 1e-4 * scale) << name;
  }
}

void expect_round_trip(const std::string& spec, DType dtype) {
  TempDir dir;
  std::unique_ptr<nn::Model> a = nn::make_model(spec, dtype), b = nn::make_model(spec, dtype);
  a->init_weights(7);
  save_hf_checkpoint(dir.path() + "/m/", *a);
  EXPECT_EQ(nn::make_model(read_hf_spec(dir.path() + "/m"), dtype, 64, false)->spec(), a->spec());
  for (nn::FlatParam& unit : b->units()) std::memset(unit.data(), 0x7f, unit.param_bytes());  // garbage
  load_hf_checkpoint(dir.path() + "/m", *b);
  for (size_t u = 0; u < a->units().size(); ++u)
    ASSERT_EQ(std::memcmp(a->units()[u].data(), b->units()[u].data(), a->units()[u].numel() * dtype_size(dtype)), 0)
        << spec << " " << dtype_name(dtype) << " unit " << a->units()[u].name();
}

TEST(HfCheckpoint, SaveLoadIsLossless) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    expect_round_trip("gpt2:layers=2,dim=32,heads=2,vocab=100,ctx=16", dtype);  // Vp = 128: padded rows
    expect_round_trip("llama:layers=2,dim=32,heads=4,kv_heads=2,ffn=48,vocab=50,ctx=16,tied=0", dtype);
    expect_round_trip("llama:layers=1,dim=24,heads=3,kv_heads=1,ffn=40,vocab=37,ctx=8,tied=1,rope_factor=8", dtype);
  }
}

TEST(HfCheckpoint, GptTwoUsesConv1DLayoutAndTransformerNames) {
  TempDir dir;
  std::unique_ptr<nn::Model> m = nn::make_model("gpt2:layers=1,dim=8,heads=2,vocab=10,ctx=4", DType::f32);
  m->init_weights(3);
  save_hf_checkpoint(dir.path(), *m);
  SafetensorsReader r(dir.path());
  const SafetensorInfo* c_attn = r.find("transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(c_attn, nullptr);
  EXPECT_EQ(c_attn->shape, (std::vector<int64_t>{8, 24}));  // (in, out): the transpose of zerone's (3C, C)
  EXPECT_EQ(r.find("transformer.wte.weight")->shape, (std::vector<int64_t>{10, 8}));  // unpadded vocabulary
  EXPECT_EQ(r.find("lm_head.weight"), nullptr);  // tied
  // zerone's qkvw row 1, column 2 is c_attn[2][1].
  std::vector<float> all(8 * 24);
  r.read_f32(*c_attn, 0, all.size(), all.data());
  const auto* g = dynamic_cast<nn::GPT2*>(m.get());
  const float* qkvw = static_cast<const float*>(g->units()[1].param(nn::kQkvw));
  EXPECT_EQ(all[2 * 24 + 1], qkvw[1 * 8 + 2]);
}

TEST(HfCheckpoint, BadDirectoriesNameTheProblem) {
  TempDir dir;
  std::unique_ptr<nn::Model> m = nn::make_model("llama:layers=1,dim=16,heads=2,kv_heads=1,ffn=24,vocab=20,ctx=8", DType::f32);
  m->init_weights(1);
  save_hf_checkpoint(dir.path(), *m);
  auto other = nn::make_model("llama:layers=1,dim=16,heads=2,kv_heads=2,ffn=24,vocab=20,ctx=8", DType::f32);
  expect_error([&] { load_hf_checkpoint(dir.path(), *other); }, "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8,16], expected [16,16]");
  auto deeper = nn::make_model("llama:layers=2,dim=16,heads=2,kv_heads=1,ffn=24,vocab=20,ctx=8", DType::f32);
  expect_error([&] { load_hf_checkpoint(dir.path(), *deeper); }, "lacks tensor 'model.layers.1.input_layernorm.weight'");
  auto gpt = nn::make_model("gpt2:layers=1,dim=16,heads=2,vocab=20,ctx=8", DType::f32);
  expect_error([&] { load_hf_checkpoint(dir.path(), *gpt); }, "lacks tensor 'transformer.wte.weight'");
  auto config = [&](const std::string& edit_key, const nlohmann::json& value) {
    std::ifstream in(dir.path() + "/config.json");
    nlohmann::json c = nlohmann::json::parse(in);
    c[edit_key] = value;
    std::ofstream(dir.path() + "/config.json") << c.dump();
  };
  config("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}});
  expect_error([&] { read_hf_spec(dir.path()); }, "rope_scaling type 'yarn' is not supported");
  config("rope_scaling", nullptr);
  // transformers 5's rope_parameters (Note [rope_parameters]): read, checked like rope_scaling.
  config("rope_theta", nullptr);
  config("rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}});
  EXPECT_NE(read_hf_spec(dir.path()).find(",theta=500000,"), std::string::npos) << read_hf_spec(dir.path());
  EXPECT_EQ(read_hf_spec(dir.path()).find("rope_factor"), std::string::npos);
  config("rope_parameters", {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}});
  EXPECT_NE(read_hf_spec(dir.path()).find(",theta=500000,eps=1e-05,tied=1,rope_factor=32,rope_low=1,rope_high=4,rope_orig=8192"),
            std::string::npos) << read_hf_spec(dir.path());
  config("rope_theta", 10000.0);
  expect_error([&] { read_hf_spec(dir.path()); }, "\"rope_theta\" 10000 differs from rope_parameters' 500000");
  config("rope_theta", nullptr);
  config("rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}});
  expect_error([&] { read_hf_spec(dir.path()); }, "rope_parameters type 'yarn' is not supported");
  config("rope_parameters", {{"rope_type", 3}});
  expect_error([&] { read_hf_spec(dir.path()); }, "rope_parameters has no string \"rope_type\"");
  config("rope_parameters", nullptr);
  config("attention_bias", true);
  expect_error([&] { read_hf_spec(dir.path()); }, "biases are not supported");
  config("attention_bias", false);
  config("model_type", "bert");
  expect_error([&] { read_hf_spec(dir.path()); }, "model_type 'bert' is not supported");
  config("model_type", "llama");
  config("hidden_size", "big");
  expect_error([&] { read_hf_spec(dir.path()); }, "\"hidden_size\" is \"big\", expected a positive integer");
}

}  // namespace
}  // namespace zerone::io
