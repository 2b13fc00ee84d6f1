#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tests/test_util.h"
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

}  // namespace
}  // namespace zerone::nn

// The model's own tests on every device (tests/test_util.h): parameters and gradients cross to the
// host through the model's backend. (Outside namespace nn: the fixture is named GPT2.)
namespace zerone {
namespace {

using nn::FlatParam;
using nn::GPT2Config;
using nn::parse_model_spec;
using testing::to_host;

class GPT2 : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, GPT2, testing::every_device(), testing::device_test_name);

TEST_P(GPT2, InitIsDeterministicAndHasGpt2Statistics) {
  GPT2Config c = parse_model_spec("gpt2:layers=2,dim=64,heads=4,vocab=100,ctx=16");
  nn::GPT2 a(c, DType::f32), b(c, DType::f32);
  a.init_weights(7);
  b.init_weights(7);
  const FlatParam& ua = a.units()[1];
  const std::vector<float> pa = to_host(a.backend(), static_cast<const float*>(ua.data()), ua.numel());
  const std::vector<float> pb = to_host(b.backend(), static_cast<const float*>(b.units()[1].data()), ua.numel());
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), ua.numel() * 4), 0);
  const float* qkvw = pa.data() + ua.tensors()[nn::kQkvw].offset;
  double sq = 0;
  size_t n = ua.tensors()[nn::kQkvw].numel();
  for (size_t i = 0; i < n; ++i) sq += qkvw[i] * qkvw[i];
  EXPECT_NEAR(std::sqrt(sq / n), 0.02, 0.002);
  EXPECT_EQ(pa[ua.tensors()[nn::kLn1w].offset], 1.0f);
  const FlatParam& u0 = a.units()[0];
  const std::vector<float> wte =
      to_host(a.backend(), static_cast<const float*>(u0.param(nn::kWte)), u0.tensors()[nn::kWte].numel());
  EXPECT_EQ(wte[100 * 64], 0.0f) << "padded vocabulary rows start at zero";
}

TEST_P(GPT2, GradientAccumulationEqualsFullBatch) {
  // Two micro-batches of 2 with grad_scale 1/2 give the gradient of one batch of 4.
  const int B = 4, T = 8;
  nn::Twins twins(DType::f32, 64, B * T);
  nn::GPT2 &full = twins.a, &accum = twins.b;
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
    const std::vector<float> gf = to_host(full.backend(), full.units()[u].grad(), full.units()[u].numel());
    const std::vector<float> ga = to_host(accum.backend(), accum.units()[u].grad(), full.units()[u].numel());
    for (size_t i = 0; i < full.units()[u].numel(); ++i) ASSERT_NEAR(ga[i], gf[i], 1e-5 + 1e-4 * std::abs(gf[i])) << u << ":" << i;
  }
}

TEST_P(GPT2, FreshGradientBuffersFullOfGarbageGiveTheSameGradients) {
  // Note [Fresh gradients]: buffers handed in with `fresh` are not zeroed; backward must overwrite
  // or zero every element, padding included. NaN garbage would poison anything left behind.
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int B = 2, T = 8;
    nn::Twins twins(dtype, 128, B * T);  // align 128: every unit has padding
    nn::GPT2 &zeroed = twins.a, &fresh = twins.b;
    const std::vector<int32_t>& x = twins.x;
    const std::vector<int32_t>& y = twins.y;
    zeroed.zero_grad();
    zeroed.forward(x.data(), y.data(), B, T);
    zeroed.backward(1.0f);
    for (FlatParam& unit : fresh.units()) {
      unit.release_grads();
      unit.set_grads(testing::device_floats(unit.padded_numel(), std::nanf(""), MemCategory::grad), /*fresh=*/true);
    }
    fresh.forward(x.data(), y.data(), B, T);
    fresh.backward(1.0f);
    for (size_t u = 0; u < fresh.units().size(); ++u) {
      EXPECT_FALSE(fresh.units()[u].grads_fresh());
      const size_t n = fresh.units()[u].padded_numel();
      const std::vector<float> got = to_host(fresh.backend(), fresh.units()[u].grad(), n);
      const std::vector<float> want = to_host(zeroed.backend(), zeroed.units()[u].grad(), n);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), fresh.units()[u].grad_bytes()), 0)
          << "unit " << u << " " << dtype_name(dtype);
    }
  }
}

TEST_P(GPT2, SequenceLongerThanContextIsAnError) {
  nn::GPT2 model(parse_model_spec("gpt2:layers=1,dim=16,heads=2,vocab=10,ctx=4"), DType::f32);
  std::vector<int32_t> x(5, 1);
  EXPECT_THROW(model.forward(x.data(), x.data(), 1, 5), Error);
}

}  // namespace
}  // namespace zerone
