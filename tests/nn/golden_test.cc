// GPT-2 against the PyTorch reference in tests/data/gpt2_golden.bin (written by
// tests/nn/make_golden.py in double precision from an independent implementation).
//
// f32: logits, loss, every gradient and 5 AdamW steps within 1e-4 relative (per tensor, relative
// to its largest magnitude), as the issue asks.
// bf16: every matmul rounds both operands to bf16 (8 bits of mantissa, unit roundoff 2^-9 ~ 0.002),
// and parameters are stored rounded to bf16. Each output of a K-term dot product then carries a
// relative error of about 2^-9 * sqrt(K)-ish in the worst direction, and the model chains ~6 such
// matmuls per block. We therefore hold bf16 to 2e-2 relative on the loss and on the logits, and
// 5e-2 relative L2 error per gradient tensor; observed values are a few times smaller. A wiring bug
// (wrong transpose, missing term) produces O(1) errors, far above these bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "tests/test_util.h"
#include "zerone/io/llmc_checkpoint.h"
#include "zerone/nn/gpt2.h"
#include "zerone/optim/adamw.h"
#include "zerone/comm/communicator.h"
#include "zerone/zero/engine.h"

namespace zerone {
namespace {

struct Golden {
  nn::GPT2Config config;
  int B = 0, T = 0, steps = 0;
  float lr, beta1, beta2, eps, wd;
  std::vector<int32_t> inputs, targets;
  std::vector<float> params, logits, grads, step_losses, final_params;
  float loss = 0;
};

Golden load_golden() {
  std::ifstream in(std::string(ZERONE_TEST_DATA_DIR) + "/gpt2_golden.bin", std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden file";
  Golden g;
  int32_t h[16];
  in.read(reinterpret_cast<char*>(h), sizeof h);
  EXPECT_EQ(h[0], 20261120);
  g.config.max_seq_len = h[2];
  g.config.vocab_size = h[3];
  g.config.num_layers = h[4];
  g.config.num_heads = h[5];
  g.config.channels = h[6];
  g.config.padded_vocab_size = h[7];
  g.B = h[8];
  g.T = h[9];
  g.steps = h[10];
  float hyper[5];
  in.read(reinterpret_cast<char*>(hyper), sizeof hyper);
  g.lr = hyper[0], g.beta1 = hyper[1], g.beta2 = hyper[2], g.eps = hyper[3], g.wd = hyper[4];
  auto read = [&](auto& v, size_t n) {
    v.resize(n);
    in.read(reinterpret_cast<char*>(v.data()), n * sizeof(v[0]));
  };
  size_t BT = static_cast<size_t>(g.B) * g.T, P = g.config.num_parameters();
  read(g.inputs, BT);
  read(g.targets, BT);
  read(g.params, P);
  read(g.logits, BT * g.config.padded_vocab_size);
  in.read(reinterpret_cast<char*>(&g.loss), 4);
  read(g.grads, P);
  read(g.step_losses, g.steps);
  read(g.final_params, P);
  EXPECT_TRUE(in.good()) << "golden file truncated";
  return g;
}

// Compares tensor by tensor (llm.c order); returns the worst relative error.
double worst_tensor_error(const nn::GPT2& model, const std::vector<float>& got, const std::vector<float>& want,
                          bool l2) {
  const auto& c = model.config();
  size_t C = c.channels, L = c.num_layers;
  std::vector<size_t> sizes = {c.padded_vocab_size * C, c.max_seq_len * C, L * C, L * C, L * 3 * C * C, L * 3 * C,
                               L * C * C, L * C, L * C, L * C, L * 4 * C * C, L * 4 * C, L * 4 * C * C, L * C, C, C};
  double worst = 0;
  size_t off = 0;
  for (size_t n : sizes) {
    double max_ref = 0, max_err = 0, sq_err = 0, sq_ref = 0;
    for (size_t i = off; i < off + n; ++i) {
      max_ref = std::max(max_ref, std::abs(static_cast<double>(want[i])));
      max_err = std::max(max_err, std::abs(static_cast<double>(got[i]) - want[i]));
      sq_err += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
      sq_ref += static_cast<double>(want[i]) * want[i];
    }
    double err = l2 ? std::sqrt(sq_err / std::max(sq_ref, 1e-30)) : max_err / std::max(max_ref, 1e-12);
    worst = std::max(worst, err);
    off += n;
  }
  return worst;
}

// Loads the golden parameters (llm.c order) into `model` on its device: through a model on the
// cpu device (`host`), whose units are then copied over by the device's backend.
void load_params(const Golden& g, nn::GPT2& host, nn::GPT2& model) {
  io::scatter_llmc_order(g.params.data(), DType::f32, host);
  for (size_t u = 0; u < model.units().size(); ++u)
    model.backend().copy_to_device(model.units()[u].data(), host.units()[u].data(), model.units()[u].param_bytes());
}

// On every device (tests/test_util.h): the model computes on the device of the test, the golden
// values cross through its backend's copies.
void run_golden(DType dtype, double loss_tol, double logits_tol, double grad_tol, bool grad_l2, double step_tol,
                double param_tol) {
  Golden g = load_golden();
  std::unique_ptr<nn::GPT2> host;  // the cpu device's model: llm.c order in and out
  {
    testing::DeviceScope cpu(kernels::DeviceKind::cpu);
    host = std::make_unique<nn::GPT2>(g.config, dtype);
  }
  nn::GPT2 model(g.config, dtype);
  kernels::Backend& backend = model.backend();
  load_params(g, *host, model);
  float loss = model.forward(g.inputs.data(), g.targets.data(), g.B, g.T);
  EXPECT_NEAR(loss, g.loss, loss_tol * g.loss) << "loss";

  size_t Vp = g.config.padded_vocab_size, V = g.config.vocab_size;
  const std::vector<float> logits = model.logits_to_host(0, static_cast<size_t>(g.B) * g.T);  // (B, T, Vp)
  double max_logit = 0, max_err = 0;
  for (size_t r = 0; r < static_cast<size_t>(g.B) * g.T; ++r)
    for (size_t v = 0; v < V; ++v) {
      max_logit = std::max(max_logit, std::abs(static_cast<double>(g.logits[r * Vp + v])));
      max_err = std::max(max_err, std::abs(static_cast<double>(logits[r * Vp + v]) - g.logits[r * Vp + v]));
    }
  EXPECT_LE(max_err, logits_tol * max_logit) << "logits";

  model.zero_grad();
  model.backward(1.0f);
  std::vector<std::vector<float>> unit_grads;
  std::vector<const float*> grad_units;
  for (auto& u : model.units()) {
    unit_grads.emplace_back(u.grad_bytes() / sizeof(float));
    backend.copy_to_host(unit_grads.back().data(), u.grad(), u.grad_bytes());
    grad_units.push_back(unit_grads.back().data());
  }
  std::vector<float> grads(g.config.num_parameters());
  io::gather_llmc_order_f32(model, grad_units, grads.data());
  EXPECT_LE(worst_tensor_error(model, grads, g.grads, grad_l2), grad_tol) << "gradients";

  // AdamW steps from the same start, through the engine the trainer uses (world 1, stage 0).
  nn::GPT2 trained(g.config, dtype);
  load_params(g, *host, trained);
  comm::SingleProcessCommunicator single;
  zero::ZeroEngine engine(trained, single, zero::ZeroConfig{}, optim::AdamWOptions{g.beta1, g.beta2, g.eps, g.wd});
  for (int s = 0; s < g.steps; ++s) {
    float l = trained.forward(g.inputs.data(), g.targets.data(), g.B, g.T);
    EXPECT_NEAR(l, g.step_losses[s], step_tol * g.step_losses[s]) << "loss before step " << s + 1;
    trained.backward(1.0f);
    engine.step(g.lr, 0.0f);
  }
  for (size_t u = 0; u < trained.units().size(); ++u)
    backend.copy_to_host(host->units()[u].data(), trained.units()[u].data(), trained.units()[u].param_bytes());
  std::vector<float> final_params(g.config.num_parameters());
  io::gather_llmc_order(*host, DType::f32, final_params.data());
  // Note [Key bias under Adam]: the gradient of the key bias is identically zero (q.(k+b) shifts all
  // of a query's scores by the same q.b, which softmax ignores). In double PyTorch's rounding noise
  // (~1e-17) is far below eps and the bias does not move; in f32 the noise (~1e-9) is comparable to
  // eps and Adam's normalisation turns it into steps of up to lr. So those elements are held to
  // "moved at most lr per step" and excluded from the 1e-4 comparison; the gradient check above
  // already holds their gradient to ~0.
  const size_t C = g.config.channels, L = g.config.num_layers;
  const size_t qkvb_off = static_cast<size_t>(g.config.padded_vocab_size) * C + g.config.max_seq_len * C + 2 * L * C +
                          L * 3 * C * C;
  for (size_t l = 0; l < L; ++l)
    for (size_t i = qkvb_off + l * 3 * C + C; i < qkvb_off + l * 3 * C + 2 * C; ++i) {
      EXPECT_LE(std::abs(final_params[i] - g.final_params[i]), 1.01 * g.lr * g.steps) << "key bias " << i;
      final_params[i] = g.final_params[i];
    }
  EXPECT_LE(worst_tensor_error(trained, final_params, g.final_params, false), param_tol) << "parameters after steps";
}

class GoldenPyTorch : public ::testing::TestWithParam<kernels::DeviceKind> {
 protected:
  testing::DeviceScope device_{GetParam()};
};
INSTANTIATE_TEST_SUITE_P(Devices, GoldenPyTorch, testing::every_device(), testing::device_test_name);

TEST_P(GoldenPyTorch, F32) { run_golden(DType::f32, 1e-4, 1e-4, 1e-4, false, 1e-4, 1e-4); }

TEST_P(GoldenPyTorch, Bf16) { run_golden(DType::bf16, 2e-2, 2e-2, 5e-2, true, 2e-2, 2e-2); }

// fp16 keeps 11 significant bits (unit roundoff 2^-11, 8x finer than bf16) over a smaller range;
// the same argument as for bf16 gives loss, logit and gradient bounds 8x tighter (rounded to 4e-3 /
// 1e-2). The parameters after 5 AdamW steps keep bf16's 2e-2: Adam moves an element whose
// gradient is near zero by up to lr per step in a direction set by rounding noise, whatever the
// format, i.e. up to lr * steps / max|p| = 1e-3 * 5 / 0.3 ~ 1.7e-2 of a tensor's largest value.
TEST_P(GoldenPyTorch, Fp16) { run_golden(DType::f16, 4e-3, 4e-3, 1e-2, true, 4e-3, 2e-2); }

}  // namespace
}  // namespace zerone
