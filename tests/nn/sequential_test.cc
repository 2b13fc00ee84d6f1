// The image classifiers (nn/sequential.h):
//  - golden values from PyTorch (tests/data/sequential_golden.bin, written in double precision by
//    tests/nn/make_sequential_golden.py from torch.nn layers and torch.optim.SGD): logits, loss,
//    every gradient, and several SGD steps (momentum, dampening, Nesterov, weight decay) through the
//    ZeRO engine, within 1e-4 relative (per tensor, relative to its largest magnitude);
//  - spec strings: presets, round trips, and errors that name the bad part;
//  - dropout: identity in evaluation, deterministic and batch-split invariant in training.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "zerone/comm/communicator.h"
#include "zerone/core/error.h"
#include "zerone/core/rng.h"
#include "zerone/nn/sequential.h"
#include "zerone/zero/engine.h"

namespace zerone {
namespace {

struct Case {
  std::string spec;
  int B = 0, steps = 0;
  bool nesterov = false;
  float lr = 0, momentum = 0, dampening = 0, wd = 0;
  std::vector<float> params, inputs, logits, grads, losses, final_params;
  std::vector<int32_t> labels;
  float loss = 0;
};

template <typename T>
void read(std::ifstream& in, T* data, size_t n) {
  in.read(reinterpret_cast<char*>(data), static_cast<std::streamsize>(n * sizeof(T)));
}
template <typename T>
T read1(std::ifstream& in) {
  T v{};
  read(in, &v, 1);
  return v;
}

std::vector<Case> load_cases() {
  std::ifstream in(std::string(ZERONE_TEST_DATA_DIR) + "/sequential_golden.bin", std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden file";
  char magic[8];
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), "ZSEQGLD1");
  std::vector<Case> cases(read1<int32_t>(in));
  for (Case& c : cases) {
    c.spec.resize(read1<int32_t>(in));
    in.read(c.spec.data(), static_cast<std::streamsize>(c.spec.size()));
    c.B = read1<int32_t>(in);
    c.steps = read1<int32_t>(in);
    c.nesterov = read1<int32_t>(in) != 0;
    c.lr = read1<float>(in);
    c.momentum = read1<float>(in);
    c.dampening = read1<float>(in);
    c.wd = read1<float>(in);
    c.params.resize(read1<int32_t>(in));
    read(in, c.params.data(), c.params.size());
    nn::Sequential probe(nn::parse_sequential_spec(c.spec), DType::f32, 64, false);
    size_t sample = 1;
    for (int64_t d : probe.input_shape()) sample *= static_cast<size_t>(d);
    c.inputs.resize(c.B * sample);
    read(in, c.inputs.data(), c.inputs.size());
    c.labels.resize(c.B);
    read(in, c.labels.data(), c.labels.size());
    c.logits.resize(static_cast<size_t>(c.B) * probe.vocab_size());
    read(in, c.logits.data(), c.logits.size());
    c.loss = read1<float>(in);
    c.grads.resize(c.params.size());
    read(in, c.grads.data(), c.grads.size());
    c.losses.resize(c.steps);
    read(in, c.losses.data(), c.losses.size());
    c.final_params.resize(c.params.size());
    read(in, c.final_params.data(), c.final_params.size());
  }
  EXPECT_TRUE(in.good()) << "golden file truncated";
  return cases;
}

void expect_close(const float* got, const float* want, size_t n, const std::string& what, double rel = 1e-4) {
  double scale = 0.0, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  for (size_t i = 0; i < n; ++i) {
    double e = std::abs(static_cast<double>(got[i]) - want[i]);
    if (e > worst) worst = e, at = i;
  }
  EXPECT_LE(worst, rel * std::max(scale, 1e-3)) << what << ": worst at " << at << " got " << got[at] << " want " << want[at];
}

// Copies the flat golden parameters (weight then bias per layer) into the units, on the model's device.
void set_params(nn::Model& m, const std::vector<float>& flat) {
  size_t off = 0;
  for (nn::FlatParam& u : m.units()) {
    m.backend().copy_to_device(u.data(), flat.data() + off, u.numel() * sizeof(float));
    off += u.numel();
  }
  ASSERT_EQ(off, flat.size());
}

// n floats of the model's device memory at p, on the host.
std::vector<float> to_host(nn::Model& m, const float* p, size_t n) { return testing::to_host(m.backend(), p, n); }
std::vector<float> to_host(nn::Model& m, const void* logits, size_t n) {
  return to_host(m, static_cast<const float*>(logits), n);  // a classifier's logits are f32
}

// The golden cases on every device (tests/test_util.h).
class SequentialGolden : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  zerone::testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, SequentialGolden, zerone::testing::every_device(), zerone::testing::device_test_name);

TEST_P(SequentialGolden, MatchesPyTorch) {
  std::vector<Case> cases = load_cases();
  ASSERT_EQ(cases.size(), 3u);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    nn::Sequential model(nn::parse_sequential_spec(c.spec), DType::f32);
    ASSERT_EQ(model.num_parameters(), c.params.size());
    set_params(model, c.params);
    nn::Batch batch;
    batch.size = c.B;
    batch.features = c.inputs.data();
    batch.targets = c.labels.data();
    const float loss = model.forward(batch);
    EXPECT_NEAR(loss, c.loss, 1e-4 * std::max(1.0f, std::abs(c.loss)));
    expect_close(to_host(model, model.logits(), c.logits.size()).data(), c.logits.data(), c.logits.size(), "logits");
    model.zero_grad();
    model.backward(1.0f);
    size_t off = 0;
    for (nn::FlatParam& u : model.units()) {
      const std::vector<float> grad = to_host(model, u.grad(), u.grad_bytes() / sizeof(float));
      for (size_t t = 0; t < u.tensors().size(); ++t)
        expect_close(grad.data() + u.tensors()[t].offset, c.grads.data() + off + u.tensors()[t].offset, u.tensors()[t].numel(),
                     u.name() + "." + u.tensors()[t].name + " grad");
      off += u.numel();
    }

    // SGD steps through the engine (world 1), as the trainer runs them.
    nn::Sequential trained(nn::parse_sequential_spec(c.spec), DType::f32);
    set_params(trained, c.params);
    comm::SingleProcessCommunicator single;
    zero::ZeroEngine engine(trained, single, zero::ZeroConfig{},
                            optim::SGDOptions{c.momentum, c.dampening, c.wd, c.nesterov});
    for (int s = 0; s < c.steps; ++s) {
      const float l = trained.forward(batch);
      EXPECT_NEAR(l, c.losses[s], 1e-4 * std::max(1.0f, std::abs(c.losses[s]))) << "step " << s + 1;
      engine.set_last_micro_step(true);
      trained.backward(1.0f);
      engine.step(c.lr, 0.0f);
    }
    off = 0;
    for (nn::FlatParam& u : trained.units()) {
      expect_close(to_host(trained, static_cast<const float*>(u.data()), u.numel()).data(), c.final_params.data() + off,
                   u.numel(), u.name() + " after SGD");
      off += u.numel();
    }
  }
}

// Note [Conv layouts]: holding the conv chain's activations blocked (the default) gives the same
// bits as holding them plain: loss, logits and every gradient, in training (dropout after a
// blocked layer included) and evaluation.
class SequentialLayouts : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  zerone::testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, SequentialLayouts, zerone::testing::every_device(), zerone::testing::device_test_name);

TEST_P(SequentialLayouts, BlockedEqualsPlainBitwise) {
  for (const char* spec : {"mnist-cnn", "seq:in=3x10x10,conv=20:k3,relu,dropout=0.3,conv=5:k3:p1,maxpool=2,relu,flatten,linear=6",
                           "seq:in=2x9x8,maxpool=2:s1,conv=17:k3:p1,relu,maxpool=3:s2:p1,dropout=0.2,flatten,linear=4"}) {
    SCOPED_TRACE(spec);
    const nn::SequentialConfig config = nn::parse_sequential_spec(spec);
    nn::Sequential blocked(config, DType::f32), plain(config, DType::f32, 64, true, false);
    blocked.init_weights(5);
    plain.init_weights(5);
    const int B = 5;
    size_t sample = 1;
    for (int64_t d : blocked.input_shape()) sample *= static_cast<size_t>(d);
    std::vector<float> x(B * sample);
    Rng rng(9);
    for (float& v : x) v = static_cast<float>(rng.uniform());
    std::vector<int32_t> y(B);
    for (int b = 0; b < B; ++b) y[b] = b % blocked.vocab_size();
    for (bool training : {true, false}) {
      nn::Batch batch;
      batch.size = B;
      batch.features = x.data();
      batch.targets = y.data();
      batch.training = training;
      batch.seed = 3;
      batch.step = 2;
      EXPECT_EQ(blocked.forward(batch), plain.forward(batch));
      const size_t K = static_cast<size_t>(blocked.vocab_size());
      EXPECT_EQ(to_host(blocked, blocked.logits(), B * K), to_host(plain, plain.logits(), B * K));
      blocked.zero_grad();
      plain.zero_grad();
      blocked.backward(1.0f);
      plain.backward(1.0f);
      for (int u = 0; u < blocked.num_units(); ++u) {
        nn::FlatParam& a = blocked.units()[u];
        nn::FlatParam& b = plain.units()[u];
        for (size_t t = 0; t < a.tensors().size(); ++t)
          EXPECT_EQ(to_host(blocked, a.grad(t), a.tensors()[t].numel()), to_host(plain, b.grad(t), b.tensors()[t].numel()))
              << a.name() << "." << a.tensors()[t].name << (training ? " (training)" : " (evaluation)");
      }
    }
  }
}

TEST(SequentialSpec, PresetsAndRoundTrips) {
  EXPECT_EQ(nn::parse_sequential_spec("mnist-mlp").to_string(), "seq:in=1x28x28,flatten,linear=256,relu,linear=10");
  nn::Sequential mlp(nn::parse_sequential_spec("mnist-mlp"), DType::f32, 64, false);
  EXPECT_EQ(mlp.num_parameters(), 784u * 256 + 256 + 256 * 10 + 10);
  nn::Sequential cnn(nn::parse_sequential_spec("mnist-cnn"), DType::f32, 64, false);
  EXPECT_EQ(cnn.num_parameters(), 10u * 25 + 10 + 20 * 10 * 25 + 20 + 320 * 50 + 50 + 50 * 10 + 10);  // 21840
  nn::Sequential cifar(nn::parse_sequential_spec("cifar-cnn"), DType::f32, 64, false);
  EXPECT_EQ(cifar.units()[3].tensors()[0].shape, (std::vector<int64_t>{1024, 4096}));
  EXPECT_EQ(cifar.num_units(), 5);
  for (const char* spec : {"mnist-mlp", "mnist-cnn", "cifar-cnn",
                           "seq:in=3x17x13,conv=5:k3x5:s2:p1x2,maxpool=3:s2:p1,dropout=0.25,flatten,linear=4",
                           "seq:in=20,dropout=0.5,linear=3"}) {
    const nn::SequentialConfig c = nn::parse_sequential_spec(spec);
    EXPECT_EQ(nn::parse_sequential_spec(c.to_string()), c) << spec << " -> " << c.to_string();
  }
}

void expect_spec_error(const std::string& spec, const std::string& part) {
  try {
    nn::parse_sequential_spec(spec);
    ADD_FAILURE() << spec << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << spec << ": " << e.what();
  }
}

TEST(SequentialSpec, ErrorsNameTheProblem) {
  expect_spec_error("mnist-xyz", "expected a preset");
  expect_spec_error("seq:linear=10", "the first item must be the input shape");
  expect_spec_error("seq:in=1x28x28,linear=10", "add 'flatten' before it");
  expect_spec_error("seq:in=1x4x4,conv=3:k5,flatten,linear=2", "does not fit");
  expect_spec_error("seq:in=1x4x4,conv=3,flatten,linear=2", "needs its kernel size");
  expect_spec_error("seq:in=1x8x8,conv=3:k3:q2,flatten,linear=2", "option 'q2'");
  expect_spec_error("seq:in=10,relu", "no layer has parameters");
  expect_spec_error("seq:in=1x8x8,conv=3:k3", "needs a flat output");
  expect_spec_error("seq:in=10,linear=1", "at least 2 classes");
  expect_spec_error("seq:in=10,dropout=1.5,linear=3", "dropout probability");
  expect_spec_error("seq:in=10,linear=0", "positive decimal integer");
  expect_spec_error("seq:in=10,,linear=3", "empty item");
  expect_spec_error("seq:in=10,softmax,linear=3", "unknown layer 'softmax'");
  expect_spec_error("seq:in=1x8x8,conv=3:k3:p2,flatten,linear=2", "more than half the kernel");
}

// On every device (tests/test_util.h), the logits read through the backend.
class SequentialDropout : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  zerone::testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, SequentialDropout, zerone::testing::every_device(), zerone::testing::device_test_name);

TEST_P(SequentialDropout, EvalIsIdentityTrainingIsKeyed) {
  const std::string spec = "seq:in=30,linear=40,relu,dropout=0.5,linear=3";
  nn::Sequential a(nn::parse_sequential_spec(spec), DType::f32), plain(nn::parse_sequential_spec("seq:in=30,linear=40,relu,linear=3"), DType::f32);
  a.init_weights(7);
  plain.init_weights(7);
  const int B = 4;
  std::vector<float> x(B * 30);
  Rng rng(3);
  for (float& v : x) v = static_cast<float>(rng.uniform());
  std::vector<int32_t> y = {0, 1, 2, 1};
  nn::Batch batch;
  batch.size = B;
  batch.features = x.data();
  batch.targets = y.data();
  EXPECT_EQ(a.forward(batch), plain.forward(batch));  // evaluation: dropout is the identity
  batch.training = true;
  batch.seed = 11;
  batch.step = 5;
  const float l1 = a.forward(batch);
  const std::vector<float> logits1 = to_host(a, a.logits(), B * 3);
  EXPECT_NE(l1, plain.forward(batch));
  EXPECT_EQ(a.forward(batch), l1);  // the same key draws the same mask
  // Samples 2..3 alone, told their place in the global batch, see the same masks: the same logits
  // up to the GEMM's rounding, which may depend on the batch's rows (oneDNN on AVX2); another mask
  // would change them by tenths.
  nn::Batch tail = batch;
  tail.size = 2;
  tail.features = x.data() + 2 * 30;
  tail.targets = y.data() + 2;
  tail.first_sample = 2;
  a.forward(tail);
  const std::vector<float> tail_logits = to_host(a, a.logits(), 2 * 3);
  for (int i = 0; i < 2 * 3; ++i) EXPECT_NEAR(tail_logits[i], logits1[2 * 3 + i], 1e-5f);
  batch.step = 6;
  a.forward(batch);
  EXPECT_NE(to_host(a, a.logits(), B * 3), logits1);  // another step, another mask
}

}  // namespace
}  // namespace zerone
