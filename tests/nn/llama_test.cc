// LLaMA against the PyTorch reference in tests/data/llama_golden.bin (tests/nn/make_llama_golden.py,
// float64, written from scratch after Hugging Face's LlamaForCausalLM): logits, loss and every
// parameter gradient, for an untied GQA model with llama3 rope scaling and a tied multi-query one.
// f32 within 1e-4 relative per tensor (as GPT-2's golden test); bf16 within the bounds argued in
// golden_test.cc (2e-2 on loss and logits, 5e-2 relative L2 per gradient tensor), fp16 within
// bounds 8x tighter (4e-3, 1e-2).
// Also: spec parsing, presets' public parameter counts, and fresh-gradient handling.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "tests/nn/llama_golden.h"
#include "tests/test_util.h"
#include "zerone/nn/llama.h"

namespace zerone::nn {
namespace {

// Copies the golden parameters (unit order) into the model's units on its device, converting to
// its dtype on the host first.
void load_params(Llama& model, const std::vector<float>& params) {
  size_t at = 0;
  for (FlatParam& unit : model.units()) {
    std::vector<char> host(unit.numel() * dtype_size(unit.dtype()));
    convert_from_f32(params.data() + at, host.data(), unit.dtype(), unit.numel());
    model.backend().copy_to_device(unit.data(), host.data(), host.size());
    at += unit.numel();
  }
  ASSERT_EQ(at, params.size());
}

// max |got - want| <= rel * max(1, max |want|) over [offset, offset + n).
void expect_close(const float* got, const float* want, size_t n, double rel, const std::string& what) {
  double scale = 1.0, worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  for (size_t i = 0; i < n; ++i) {
    double e = std::abs(static_cast<double>(got[i]) - want[i]);
    if (e > worst) worst = e, worst_i = i;
  }
  EXPECT_LE(worst, rel * scale) << what << ": worst at " << worst_i << " got " << got[worst_i] << " want " << want[worst_i];
}

double relative_l2(const float* got, const float* want, size_t n) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (got[i] - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

void check_case(const LlamaGolden& g, DType dtype) {
  const LlamaConfig& c = g.config;
  Llama model(c, dtype);
  load_params(model, g.params);
  const float loss = model.forward(g.inputs.data(), g.targets.data(), g.B, g.T);
  const std::vector<float> logits = model.logits_to_host(0, static_cast<size_t>(g.B) * g.T);  // (B, T, V)
  const size_t logits_n = logits.size();
  model.zero_grad();
  model.backward(1.0f);
  const bool f32 = dtype == DType::f32;
  // fp16's bounds are bf16's 8x tighter (golden_test.cc: 11 significant bits against 8).
  const double loss_tol = f32 ? 1e-5 : dtype == DType::f16 ? 4e-3 : 2e-2;
  const double logits_tol = f32 ? 1e-4 : dtype == DType::f16 ? 4e-3 : 2e-2;
  const double grad_l2_tol = dtype == DType::f16 ? 1e-2 : 5e-2;
  EXPECT_NEAR(loss, g.loss, loss_tol * std::abs(g.loss)) << c.to_string();
  expect_close(logits.data(), g.logits.data(), logits_n, logits_tol, "logits " + c.to_string());
  size_t at = 0;
  for (const FlatParam& unit : model.units()) {
    std::vector<float> grad(unit.grad_bytes() / sizeof(float));
    model.backend().copy_to_host(grad.data(), unit.grad(), unit.grad_bytes());
    for (const TensorSpec& t : unit.tensors()) {
      const std::string what = unit.name() + "." + t.name + " " + dtype_name(dtype);
      const float* got = grad.data() + t.offset;
      if (f32) expect_close(got, g.grads.data() + at, t.numel(), 1e-4, what);
      else EXPECT_LE(relative_l2(got, g.grads.data() + at, t.numel()), grad_l2_tol) << what;
      at += t.numel();
    }
  }
  EXPECT_EQ(at, g.grads.size());
}

// The golden cases on every device (tests/test_util.h).
class LlamaGoldenTest : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  zerone::testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, LlamaGoldenTest, zerone::testing::every_device(), zerone::testing::device_test_name);

TEST_P(LlamaGoldenTest, F32MatchesPyTorch) {
  auto cases = load_llama_golden();
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_FALSE(cases[0].config.tie_word_embeddings);
  EXPECT_TRUE(cases[1].config.tie_word_embeddings);
  for (const LlamaGolden& g : cases) check_case(g, DType::f32);
}

TEST_P(LlamaGoldenTest, Bf16WithinRoundingBounds) {
  for (const LlamaGolden& g : load_llama_golden()) check_case(g, DType::bf16);
}

// fp16 (the 16-bit copies of Note [The MLP's hidden activation in the compute dtype] and Note
// [Gradients rounded where they are made] in f16).
TEST_P(LlamaGoldenTest, Fp16WithinRoundingBounds) {
  for (const LlamaGolden& g : load_llama_golden()) check_case(g, DType::f16);
}

// On every device (tests/test_util.h), the gradients compared on the host.
class LlamaFreshGradients : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  zerone::testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, LlamaFreshGradients, zerone::testing::every_device(), zerone::testing::device_test_name);

TEST_P(LlamaFreshGradients, OverwriteGarbage) {
  // Note [Fresh gradients]: pooled buffers full of NaN marked fresh must give the same gradients
  // as zeroed ones, tied and untied.
  using zerone::testing::to_host;
  for (const LlamaGolden& g : load_llama_golden()) {
    Llama a(g.config, DType::f32), b(g.config, DType::f32);
    load_params(a, g.params);
    load_params(b, g.params);
    a.zero_grad();
    for (FlatParam& unit : b.units()) {
      unit.release_grads();
      unit.set_grads(zerone::testing::device_floats(unit.padded_numel(), std::nanf(""), MemCategory::grad), /*fresh=*/true);
    }
    a.forward(g.inputs.data(), g.targets.data(), g.B, g.T);
    a.backward(0.5f);
    b.forward(g.inputs.data(), g.targets.data(), g.B, g.T);
    b.backward(0.5f);
    for (size_t u = 0; u < a.units().size(); ++u) {
      const size_t n = a.units()[u].padded_numel();
      const std::vector<float> ga = to_host(a.backend(), a.units()[u].grad(), n);
      const std::vector<float> gb = to_host(b.backend(), b.units()[u].grad(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(ga[i], gb[i]) << a.units()[u].name() << " element " << i;
    }
  }
}

TEST(LlamaSpec, PresetsHaveThePublicParameterCounts) {
  // Counts as Hugging Face reports them (embedding included, tied head counted once).
  EXPECT_EQ(parse_llama_spec("llama-3.2-1b").num_parameters(), 1235814400u);
  EXPECT_EQ(parse_llama_spec("tinyllama-1.1b").num_parameters(), 1100048384u);
  EXPECT_EQ(parse_llama_spec("llama-2-7b").num_parameters(), 6738415616u);
  EXPECT_EQ(parse_llama_spec("llama-3-8b").num_parameters(), 8030261248u);
  EXPECT_EQ(parse_llama_spec("llama-2-13b").num_parameters(), 13015864320u);  // Hugging Face's count
  LlamaConfig c = parse_llama_spec("llama:layers=2,dim=64,heads=4,kv_heads=2,ffn=128,vocab=300,ctx=64,tied=0");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(parse_llama_spec(c.to_string()), c);
  EXPECT_EQ(parse_llama_spec(parse_llama_spec("llama-3.2-1b").to_string()), parse_llama_spec("llama-3.2-1b"));
}

TEST(LlamaSpec, RejectsBadSpecsWithTheReason) {
  using zerone::testing::expect_error;
  expect_error([] { parse_llama_spec("llama:dim=48,heads=6,kv_heads=4"); }, "not a multiple of kv_heads=4");
  expect_error([] { parse_llama_spec("llama:dim=100,heads=3"); }, "not divisible by heads=3");
  expect_error([] { parse_llama_spec("llama:layers=0"); }, "layers=0 is out of range");
  expect_error([] { parse_llama_spec("llama:theta=abc"); }, "theta=abc is out of range");
  expect_error([] { parse_llama_spec("llama:colour=red"); }, "unknown key 'colour'");
  expect_error([] { parse_llama_spec("llama:layers=2.5"); }, "is not an integer");
  expect_error([] { parse_llama_spec("llama:dim=30,heads=2,head_dim=15"); }, "must be even");
  expect_error([] { parse_llama_spec("llama-9"); }, "expected a LLaMA preset");
}

}  // namespace
}  // namespace zerone::nn

namespace zerone::nn {
namespace {

// Note [Activation checkpointing]: recomputing each block in backward gives bitwise the same loss
// and gradients (two micro-steps of accumulation), for GPT-2 and LLaMA, f32 and bf16, with an
// activation table that shrinks by L-1 blocks' internals (and the buffers really are that size).
// Note [CPU checkpointing]: the same with the saved block inputs in the host place: bitwise the
// same again, the device holds two block-output slots instead of L, and the ledger's host and
// device activation bytes are what host_activation_bytes / activation_bytes say. Four blocks, so
// that the two device slots are each reused (a slot mix-up changes the gradients).
// On every device (tests/test_util.h): the gradients are compared on the host, and the ledger's
// device and host activation bytes hold on each.
class ActivationCheckpointing : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  zerone::testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, ActivationCheckpointing, zerone::testing::every_device(), zerone::testing::device_test_name);

TEST_P(ActivationCheckpointing, BitwiseSameLossAndGradientsWithLessMemory) {
  for (const char* spec : {"gpt2:layers=4,dim=32,heads=2,vocab=60,ctx=16",
                           "llama:layers=4,dim=32,heads=4,kv_heads=2,ffn=40,vocab=60,ctx=16,tied=0"}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      std::unique_ptr<Model> plain = make_model(spec, dtype), ckpt = make_model(spec, dtype),
                             cpu = make_model(spec, dtype);
      ckpt->set_activation_checkpointing(true);
      cpu->set_activation_checkpointing(true);
      cpu->set_cpu_checkpointing(true);
      for (Model* m : {plain.get(), ckpt.get(), cpu.get()}) {
        m->init_weights(5);
        m->zero_grad();
      }
      const int B = 2, T = 12;
      std::vector<int32_t> x(B * T), y(B * T);
      for (int micro = 0; micro < 2; ++micro) {
        for (int i = 0; i < B * T; ++i) x[i] = (i * 7 + micro * 13) % 60, y[i] = (i * 11 + micro) % 60;
        const MemoryLedger& ledger = MemoryLedger::global();
        auto device_now = [&] { return ledger.current(MemPlace::device, MemCategory::activation); };
        auto host_now = [&] { return ledger.current(MemPlace::host, MemCategory::activation); };
        const int64_t device_before = device_now(), host_before = host_now();
        const float a = plain->forward(x.data(), y.data(), B, T);
        const float b = ckpt->forward(x.data(), y.data(), B, T);
        const int64_t device_mid = device_now();
        const float c = cpu->forward(x.data(), y.data(), B, T);
        if (micro == 0) {
          EXPECT_EQ(device_mid - device_before, static_cast<int64_t>(plain->activation_bytes(B, T) + ckpt->activation_bytes(B, T)))
              << "the ledger holds what activation_bytes says";
          EXPECT_EQ(plain->host_activation_bytes(B, T) + ckpt->host_activation_bytes(B, T), 0u);
          const int64_t host = static_cast<int64_t>(cpu->host_activation_bytes(B, T));
          EXPECT_EQ(host, int64_t{3} * B * T * 32 * 4) << "L-1 saved inputs of (B,T,C) f32 on the host";
          EXPECT_EQ(host_now() - host_before, host);
          EXPECT_EQ(device_now() - device_mid, static_cast<int64_t>(cpu->activation_bytes(B, T)) - host);
          EXPECT_EQ(static_cast<int64_t>(ckpt->activation_bytes(B, T)) - (static_cast<int64_t>(cpu->activation_bytes(B, T)) - host),
                    int64_t{2} * B * T * 32 * 4)
              << "the device keeps 2 block-output slots instead of 4";
        }
        ASSERT_EQ(a, b) << spec << " " << dtype_name(dtype);
        ASSERT_EQ(a, c) << spec << " " << dtype_name(dtype) << " cpu checkpointing";
        plain->backward(0.5f);
        ckpt->backward(0.5f);
        cpu->backward(0.5f);
      }
      for (size_t u = 0; u < plain->units().size(); ++u) {
        const size_t n = plain->units()[u].padded_numel();
        const std::vector<float> g_plain = zerone::testing::to_host(plain->backend(), plain->units()[u].grad(), n);
        const std::vector<float> g_ckpt = zerone::testing::to_host(ckpt->backend(), ckpt->units()[u].grad(), n);
        const std::vector<float> g_cpu = zerone::testing::to_host(cpu->backend(), cpu->units()[u].grad(), n);
        ASSERT_EQ(std::memcmp(g_plain.data(), g_ckpt.data(), plain->units()[u].grad_bytes()), 0)
            << spec << " " << dtype_name(dtype) << " unit " << u;
        ASSERT_EQ(std::memcmp(g_plain.data(), g_cpu.data(), plain->units()[u].grad_bytes()), 0)
            << spec << " " << dtype_name(dtype) << " unit " << u << " cpu checkpointing";
      }
      EXPECT_LT(ckpt->activation_bytes(B, T), plain->activation_bytes(B, T));
    }
  }
}

TEST_P(ActivationCheckpointing, CpuCheckpointingIsRefusedWithoutBlocks) {
  std::unique_ptr<Model> mlp = make_model("mnist-mlp", DType::f32, 64, /*allocate=*/false);
  zerone::testing::expect_error([&] { mlp->set_cpu_checkpointing(true); }, "has no blocks whose inputs are saved");
}

}  // namespace
}  // namespace zerone::nn
