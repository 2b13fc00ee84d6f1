// The PyTorch LLaMA golden cases of tests/data/llama_golden.bin (tests/nn/make_llama_golden.py),
// shared by the model test (tests/nn/llama_test.cc) and the Hugging Face checkpoint test.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "zerone/nn/llama.h"

namespace zerone::nn {

struct LlamaGolden {
  LlamaConfig config;
  int B = 0, T = 0;
  std::vector<int32_t> inputs, targets;
  std::vector<float> params, logits, grads;
  float loss = 0;
};

inline std::vector<LlamaGolden> load_llama_golden() {
  std::ifstream in(std::string(ZERONE_TEST_DATA_DIR) + "/llama_golden.bin", std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden file";
  int32_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 4);
  std::vector<LlamaGolden> out(n);
  for (LlamaGolden& g : out) {
    int32_t h[16];
    float f[8];
    in.read(reinterpret_cast<char*>(h), sizeof h);
    in.read(reinterpret_cast<char*>(f), sizeof f);
    EXPECT_EQ(h[0], 20261122);
    LlamaConfig& c = g.config;
    c.num_layers = h[2], c.channels = h[3], c.num_heads = h[4], c.num_kv_heads = h[5], c.head_dim = h[6];
    c.ffn = h[7], c.vocab_size = h[8], c.max_seq_len = h[9], c.tie_word_embeddings = h[10] != 0;
    g.B = h[11], g.T = h[12];
    c.rope_theta = f[0], c.rms_norm_eps = f[1];
    c.rope_scaling = kernels::RopeScaling{f[2], f[3], f[4], static_cast<int>(f[5])};
    const size_t BT = static_cast<size_t>(g.B) * g.T, P = c.num_parameters();
    auto read = [&](auto& v, size_t count) {
      v.resize(count);
      in.read(reinterpret_cast<char*>(v.data()), count * sizeof(v[0]));
    };
    read(g.inputs, BT);
    read(g.targets, BT);
    read(g.params, P);
    read(g.logits, BT * c.vocab_size);
    in.read(reinterpret_cast<char*>(&g.loss), 4);
    read(g.grads, P);
  }
  EXPECT_TRUE(in.good());
  return out;
}

}  // namespace zerone::nn
