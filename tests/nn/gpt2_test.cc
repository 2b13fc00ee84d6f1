#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/core/rng.h"
#include "zerone/nn/gpt2.h"

namespace zerone::nn {
namespace {

TEST(ModelSpec, PresetsHaveGpt2ParameterCounts) {
  EXPECT_EQ(parse_model_spec("gpt2-124m").num_parameters(), 124475904u);  // llm.c's count (Vp = 50304)
  GPT2Config c350 = parse_model_spec("gpt2-350m");
  EXPECT_EQ(c350.num_layers, 24);
  EXPECT_EQ(c350.channels, 1024);
  EXPECT_EQ(parse_model_spec("gpt2-1.5b").channels, 1600);
}

TEST(ModelSpec, ParsesKeysAndPadsVocab) {
  GPT2Config c = parse_model_spec("gpt2:layers=4,dim=128,heads=4,vocab=512,ctx=256");
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.channels, 128);
  EXPECT_EQ(c.padded_vocab_size, 512);
  EXPECT_EQ(parse_model_spec("gpt2:vocab=257").padded_vocab_size, 384);
  EXPECT_EQ(parse_model_spec(c.to_string()), c);
}

TEST(ModelSpec, RejectsBadSpecsWithTheReason) {
  for (const char* bad : {"gpt3", "gpt2:layers=0", "gpt2:layers=x", "gpt2:dim=100,heads=3", "gpt2:color=red",
                          "gpt2:layers", "gpt2:vocab=600,padded_vocab=512", "gpt2:ctx=-5"}) {
    EXPECT_THROW(parse_model_spec(bad), Error) << bad;
  }
  try {
    parse_model_spec("gpt2:dim=100,heads=3");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
  }
}

TEST(FlatParam, PaddedToAlignmentAndTensorsBackToBack) {
  GPT2 model(parse_model_spec("gpt2:layers=2,dim=24,heads=2,vocab=50,ctx=8"), DType::f32, 3 * 64);
  for (const FlatParam& unit : model.units()) {
    EXPECT_EQ(unit.padded_numel() % (3 * 64), 0u) << unit.name();
    EXPECT_GE(unit.padded_numel(), unit.numel());
    size_t expect_offset = 0;
    for (const TensorSpec& t : unit.tensors()) {
      EXPECT_EQ(t.offset, expect_offset);
      expect_offset += t.numel();
    }
    EXPECT_EQ(expect_offset, unit.numel());
  }
  size_t total = 0;
  for (const FlatParam& unit : model.units()) total += unit.numel();
  EXPECT_EQ(total, model.config().num_parameters());
}

TEST(GPT2, InitIsDeterministicAndHasGpt2Statistics) {
  GPT2Config c = parse_model_spec("gpt2:layers=2,dim=64,heads=4,vocab=100,ctx=16");
  GPT2 a(c, DType::f32), b(c, DType::f32);
  a.init_weights(7);
  b.init_weights(7);
  const FlatParam& ua = a.units()[1];
  EXPECT_EQ(std::memcmp(ua.data(), b.units()[1].data(), ua.numel() * 4), 0);
  const float* qkvw = static_cast<const float*>(ua.param(kQkvw));
  double sq = 0;
  size_t n = ua.tensors()[kQkvw].numel();
  for (size_t i = 0; i < n; ++i) sq += qkvw[i] * qkvw[i];
  EXPECT_NEAR(std::sqrt(sq / n), 0.02, 0.002);
  const float* ln1w = static_cast<const float*>(ua.param(kLn1w));
  EXPECT_EQ(ln1w[0], 1.0f);
  const float* wte = static_cast<const float*>(a.units()[0].param(kWte));
  EXPECT_EQ(wte[100 * 64], 0.0f) << "padded vocabulary rows start at zero";
}

// Two twin models of the small test spec with the same weights, and n random (input, target) ids.
struct Twins {
  GPT2Config config = parse_model_spec("gpt2:layers=2,dim=32,heads=2,vocab=40,ctx=16");
  GPT2 a, b;
  std::vector<int32_t> x, y;
  Twins(DType dtype, size_t align, int n) : a(config, dtype, align), b(config, dtype, align), x(n), y(n) {
    a.init_weights(3);
    b.init_weights(3);
    Rng rng(5);
    for (int i = 0; i < n; ++i) x[i] = static_cast<int32_t>(rng.below(40)), y[i] = static_cast<int32_t>(rng.below(40));
  }
};

TEST(GPT2, GradientAccumulationEqualsFullBatch) {
  // Two micro-batches of 2 with grad_scale 1/2 give the gradient of one batch of 4.
  const int B = 4, T = 8;
  Twins twins(DType::f32, 64, B * T);
  GPT2 &full = twins.a, &accum = twins.b;
  const std::vector<int32_t>& x = twins.x;
  const std::vector<int32_t>& y = twins.y;
  full.zero_grad();
  float loss_full = full.forward(x.data(), y.data(), B, T);
  full.backward(1.0f);
  accum.zero_grad();
  float loss_a = accum.forward(x.data(), y.data(), 2, T);
  accum.backward(0.5f);
  float loss_b = accum.forward(x.data() + 2 * T, y.data() + 2 * T, 2, T);
  accum.backward(0.5f);
  EXPECT_NEAR((loss_a + loss_b) / 2, loss_full, 1e-5);
  for (size_t u = 0; u < full.units().size(); ++u) {
    const float* gf = full.units()[u].grad();
    const float* ga = accum.units()[u].grad();
    for (size_t i = 0; i < full.units()[u].numel(); ++i) ASSERT_NEAR(ga[i], gf[i], 1e-5 + 1e-4 * std::abs(gf[i])) << u << ":" << i;
  }
}

TEST(GPT2, FreshGradientBuffersFullOfGarbageGiveTheSameGradients) {
  // Note [Fresh gradients]: buffers handed in with `fresh` are not zeroed; backward must overwrite
  // or zero every element, padding included. NaN garbage would poison anything left behind.
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int B = 2, T = 8;
    Twins twins(dtype, 128, B * T);  // align 128: every unit has padding
    GPT2 &zeroed = twins.a, &fresh = twins.b;
    const std::vector<int32_t>& x = twins.x;
  const std::vector<int32_t>& y = twins.y;
    zeroed.zero_grad();
    zeroed.forward(x.data(), y.data(), B, T);
    zeroed.backward(1.0f);
    for (FlatParam& unit : fresh.units()) {
      unit.release_grads();
      Buffer garbage(unit.grad_bytes(), MemCategory::grad);
      for (size_t i = 0; i < unit.padded_numel(); ++i) garbage.as<float>()[i] = std::nanf("");
      unit.set_grads(std::move(garbage), /*fresh=*/true);
    }
    fresh.forward(x.data(), y.data(), B, T);
    fresh.backward(1.0f);
    for (size_t u = 0; u < fresh.units().size(); ++u) {
      EXPECT_FALSE(fresh.units()[u].grads_fresh());
      ASSERT_EQ(std::memcmp(fresh.units()[u].grad(), zeroed.units()[u].grad(), fresh.units()[u].grad_bytes()), 0)
          << "unit " << u << " " << dtype_name(dtype);
    }
  }
}

TEST(GPT2, SequenceLongerThanContextIsAnError) {
  GPT2 model(parse_model_spec("gpt2:layers=1,dim=16,heads=2,vocab=10,ctx=4"), DType::f32);
  std::vector<int32_t> x(5, 1);
  EXPECT_THROW(model.forward(x.data(), x.data(), 1, 5), Error);
}


}  // namespace
}  // namespace zerone::nn
