// Every CPU kernel (ops.h, conv.h, classifier.h) against an independent double-precision reference (tests/reference_ops.h):
//  1. forward: the f32 kernel matches the double reference;
//  2. backward: the f32 kernel's gradients match central finite differences of the double
//     reference of L = sum(out * w) for a fixed random w (the oracle of DESIGN §7.1).
// Tolerances: f32 kernels carry ~1e-6 relative rounding per op; finite differences in double with
// h = 1e-6 are accurate to ~1e-9. We require max |a - b| <= 1e-4 * max(1, max|b|).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tests/reference_ops.h"
#include "zerone/core/rng.h"
#include "zerone/kernels/cpu/classifier.h"
#include "zerone/kernels/cpu/conv.h"
#include "zerone/kernels/cpu/ops.h"

namespace zerone::kernels::cpu {
namespace {

using ref::Vec;

std::vector<float> randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
  return v;
}
Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

void expect_close(const std::vector<float>& got, const Vec& want, const char* what, double rel = 1e-4) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1.0, worst = 0.0;
  size_t worst_i = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::abs(got[i] - want[i]);
    if (err > worst) worst = err, worst_i = i;
  }
  EXPECT_LE(worst, rel * scale) << what << ": worst at " << worst_i << " got " << got[worst_i] << " want "
                                << want[worst_i];
}

// Central differences of loss(x) = sum(f(x) * w) with respect to x.
Vec numeric_grad(Vec x, const std::function<Vec(const Vec&)>& f, const Vec& w) {
  const double h = 1e-6;
  Vec g(x.size());
  auto loss = [&](const Vec& xx) {
    Vec y = f(xx);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + h;
    double up = loss(x);
    x[i] = keep - h;
    double down = loss(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

TEST(GradCheck, Linear) {
  const int N = 6, C = 5, OC = 7;
  auto inp = randn(N * C, 1), w = randn(OC * C, 2), b = randn(OC, 3), dout = randn(N * OC, 4);
  std::vector<float> out(N * OC);
  linear_forward(out.data(), inp.data(), w.data(), b.data(), DType::f32, N, C, OC);
  expect_close(out, ref::linear(to_double(inp), to_double(w), to_double(b), N, C, OC), "linear forward");

  std::vector<float> dinp(N * C), dw(OC * C, 0.5f), db(OC, 0.25f);  // dw, db accumulate onto 0.5, 0.25
  linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), DType::f32, N, C, OC);
  Vec W = to_double(w), Bv = to_double(b), X = to_double(inp), D = to_double(dout);
  expect_close(dinp, numeric_grad(X, [&](const Vec& x) { return ref::linear(x, W, Bv, N, C, OC); }, D), "dinp");
  Vec gw = numeric_grad(W, [&](const Vec& ww) { return ref::linear(X, ww, Bv, N, C, OC); }, D);
  for (double& x : gw) x += 0.5;
  expect_close(dw, gw, "dweight");
  Vec gb = numeric_grad(Bv, [&](const Vec& bb) { return ref::linear(X, W, bb, N, C, OC); }, D);
  for (double& x : gb) x += 0.25;
  expect_close(db, gb, "dbias");
}

TEST(GradCheck, LinearBf16MatchesRoundedInputs) {
  // bf16 matmul = f32 matmul of bf16-rounded operands, f32 accumulation.
  const int N = 8, C = 16, OC = 12;
  auto inp = randn(N * C, 5), w = randn(OC * C, 6);
  std::vector<bf16_t> w16(w.size());
  convert_f32_to_bf16(w.data(), w16.data(), w.size());
  std::vector<float> out(N * OC);
  linear_forward(out.data(), inp.data(), w16.data(), nullptr, DType::bf16, N, C, OC);
  Vec xr(inp.size()), wr(w.size()), zero(OC, 0.0);
  for (size_t i = 0; i < inp.size(); ++i) xr[i] = bf16_to_f32(f32_to_bf16(inp[i]));
  for (size_t i = 0; i < w.size(); ++i) wr[i] = bf16_to_f32(w16[i]);
  expect_close(out, ref::linear(xr, wr, zero, N, C, OC), "bf16 linear", 1e-5);
}

TEST(GradCheck, Bf16LinearOddColumns) {
  // Note [oneDNN 2.6 AMX column tails]: small-row bf16 GEMMs with 49..63 output columns came out
  // wrong on AMX CPUs with two threads. Every column count 1..80 must match the f32 product of the
  // same bf16-rounded values to bf16 accuracy (relative 1e-2 of the largest output).
  omp_set_num_threads(2);
  for (int OC = 1; OC <= 80; ++OC) {
    const int N = 16, C = 32;
    auto inp = randn(N * C, 90), w = randn(OC * C, 91);
    std::vector<uint16_t> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_f32(wb[i] = f32_to_bf16(w[i]));
    std::vector<float> inp_rounded = inp;
    for (float& x : inp_rounded) x = bf16_to_f32(f32_to_bf16(x));
    std::vector<float> got(N * OC), want(N * OC);
    linear_forward(got.data(), inp.data(), wb.data(), nullptr, DType::bf16, N, C, OC);
    linear_forward(want.data(), inp_rounded.data(), w.data(), nullptr, DType::f32, N, C, OC);
    expect_close(got, to_double(want), (std::string("bf16 linear, columns ") + std::to_string(OC)).c_str(), 1e-2);
  }
}

TEST(GradCheck, LayerNorm) {
  const int N = 5, C = 12;
  auto inp = randn(N * C, 7, 2.0), w = randn(C, 8), b = randn(C, 9), dout = randn(N * C, 10);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), DType::f32, N, C);
  Vec X = to_double(inp), W = to_double(w), Bv = to_double(b), D = to_double(dout);
  expect_close(out, ref::layernorm(X, W, Bv, N, C), "layernorm forward");
  std::vector<float> dinp(N * C, 1.0f), dw(C), db(C);  // dinp accumulates onto 1.0
  layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), DType::f32, mean.data(),
                     rstd.data(), N, C);
  Vec gx = numeric_grad(X, [&](const Vec& x) { return ref::layernorm(x, W, Bv, N, C); }, D);
  for (double& x : gx) x += 1.0;
  expect_close(dinp, gx, "layernorm dinp");
  expect_close(dw, numeric_grad(W, [&](const Vec& ww) { return ref::layernorm(X, ww, Bv, N, C); }, D), "layernorm dw");
  expect_close(db, numeric_grad(Bv, [&](const Vec& bb) { return ref::layernorm(X, W, bb, N, C); }, D), "layernorm db");
}

TEST(GradCheck, Attention) {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto qkv = randn(B * T * 3 * C, 11), dout = randn(B * T * C, 12);
  std::vector<float> out(B * T * C), att(B * NH * T * T), dqkv(B * T * 3 * C);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  Vec Q = to_double(qkv), D = to_double(dout);
  expect_close(out, ref::attention(Q, B, T, C, NH), "attention forward");
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_close(dqkv, numeric_grad(Q, [&](const Vec& q) { return ref::attention(q, B, T, C, NH); }, D), "attention dqkv");
}

TEST(GradCheck, GroupedQueryAttention) {
  // NKV = 2 (groups of 2), NKV = 1 (multi-query) and NKV = NH (plain multi-head).
  for (int NKV : {2, 1, 4}) {
    const int B = 2, T = 5, NH = 4, hs = 4, R = (NH + 2 * NKV) * hs;
    auto qkv = randn(B * T * R, 40 + NKV), dout = randn(B * T * NH * hs, 50 + NKV);
    std::vector<float> out(B * T * NH * hs), att(B * NH * T * T), dqkv(B * T * R, 7.0f);  // dqkv is overwritten
    gqa_attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, NKV, hs);
    Vec Q = to_double(qkv), D = to_double(dout);
    expect_close(out, ref::gqa_attention(Q, B, T, NH, NKV, hs), "gqa forward");
    gqa_attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, NH, NKV, hs);
    expect_close(dqkv, numeric_grad(Q, [&](const Vec& q) { return ref::gqa_attention(q, B, T, NH, NKV, hs); }, D),
                 "gqa dqkv");
  }
}

TEST(GradCheck, RmsNormF32AndBf16Weights) {
  const int N = 5, C = 12;
  const float eps = 1e-6f;
  auto inp = randn(N * C, 60, 2.0), w = randn(C, 61), dout = randn(N * C, 62);
  for (DType dtype : {DType::f32, DType::bf16}) {
    // The reference sees the weights as the kernel stores them (bf16-rounded for bf16).
    std::vector<uint16_t> w16(C);
    std::vector<float> w_seen = w;
    if (dtype == DType::bf16)
      for (int i = 0; i < C; ++i) w_seen[i] = bf16_to_f32(w16[i] = f32_to_bf16(w[i]));
    const void* wp = dtype == DType::f32 ? static_cast<const void*>(w.data()) : w16.data();
    std::vector<float> out(N * C), rstd(N);
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), wp, dtype, N, C, eps);
    Vec X = to_double(inp), W = to_double(w_seen), D = to_double(dout);
    expect_close(out, ref::rmsnorm(X, W, N, C, eps), "rmsnorm forward");
    std::vector<float> dinp(N * C, 1.0f), dw(C, 0.5f);  // both accumulate
    rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), wp, dtype, rstd.data(), N, C);
    Vec gx = numeric_grad(X, [&](const Vec& x) { return ref::rmsnorm(x, W, N, C, eps); }, D);
    for (double& x : gx) x += 1.0;
    expect_close(dinp, gx, "rmsnorm dinp");
    Vec gw = numeric_grad(W, [&](const Vec& ww) { return ref::rmsnorm(X, ww, N, C, eps); }, D);
    for (double& x : gw) x += 0.5;
    expect_close(dw, gw, "rmsnorm dweight");
  }
}

TEST(GradCheck, RotaryEmbeddingOnQueryAndKeyHeads) {
  // A qkv row of NH=2 query, NKV=1 key and 1 value head (hs=8): rope touches the first 3 heads only.
  const int B = 2, T = 6, hs = 8, heads = 3, stride = 4 * hs;
  std::vector<float> inv_freq(hs / 2);
  rope_inv_freq(inv_freq.data(), hs, 10000.0f);
  std::vector<double> f(inv_freq.begin(), inv_freq.end());
  auto x = randn(B * T * stride, 70), dout = randn(B * T * stride, 71);
  std::vector<float> y = x;
  rope_forward(y.data(), inv_freq.data(), B, T, stride, heads, hs);
  Vec X = to_double(x), D = to_double(dout);
  expect_close(y, ref::rope(X, f, B, T, stride, heads, hs), "rope forward");
  for (int i = 3 * hs; i < stride; ++i) EXPECT_EQ(y[i], x[i]) << "value head changed at " << i;
  std::vector<float> dx = dout;
  rope_backward(dx.data(), inv_freq.data(), B, T, stride, heads, hs);
  expect_close(dx, numeric_grad(X, [&](const Vec& xx) { return ref::rope(xx, f, B, T, stride, heads, hs); }, D),
               "rope dx");
}

TEST(RopeInvFreq, PlainAndLlama3Scaling) {
  // Llama-3.2-1B: head size 64, theta 500000, rope_scaling {factor 32, low 1, high 4, original 8192}.
  const int hs = 64;
  const double theta = 500000.0, factor = 32, low = 1, high = 4, old_ctx = 8192, pi = 3.14159265358979323846;
  std::vector<float> plain(hs / 2), scaled(hs / 2);
  rope_inv_freq(plain.data(), hs, static_cast<float>(theta));
  RopeScaling s;
  s.factor = 32.0f;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position = 8192;
  rope_inv_freq(scaled.data(), hs, static_cast<float>(theta), s);
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < hs / 2; ++i) {
    double f = 1.0 / std::pow(theta, 2.0 * i / hs);
    EXPECT_NEAR(plain[i], f, 1e-6 * f) << i;
    double wavelen = 2 * pi / f, want;
    if (wavelen < old_ctx / high) want = f, ++kept;
    else if (wavelen > old_ctx / low) want = f / factor, ++divided;
    else {
      double smooth = (old_ctx / wavelen - low) / (high - low);
      want = (1 - smooth) * f / factor + smooth * f;
      ++blended;
    }
    EXPECT_NEAR(scaled[i], want, 2e-6 * want) << i;
  }
  // The shape exercises all three branches.
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(GradCheck, SwiGLU) {
  const int N = 4, F = 6;
  auto inp = randn(N * 2 * F, 80, 2.0), dout = randn(N * F, 81);
  std::vector<float> out(N * F), dinp(N * 2 * F, 3.0f);  // dinp is overwritten
  swiglu_forward(out.data(), inp.data(), N, F);
  Vec X = to_double(inp), D = to_double(dout);
  expect_close(out, ref::swiglu(X, N, F), "swiglu forward");
  swiglu_backward(dinp.data(), dout.data(), inp.data(), N, F);
  expect_close(dinp, numeric_grad(X, [&](const Vec& x) { return ref::swiglu(x, N, F); }, D), "swiglu dinp");
}

TEST(GradCheck, Gelu) {
  const int n = 40;
  auto inp = randn(n, 13, 2.0), dout = randn(n, 14);
  std::vector<float> out(n), dinp(n);
  gelu_forward(out.data(), inp.data(), n);
  Vec X = to_double(inp), D = to_double(dout);
  expect_close(out, ref::gelu(X), "gelu forward");
  gelu_backward(dinp.data(), inp.data(), dout.data(), n);
  expect_close(dinp, numeric_grad(X, [&](const Vec& x) { return ref::gelu(x); }, D), "gelu dinp");
}

TEST(GradCheck, Embedding) {
  const int B = 2, T = 3, C = 4, V = 5, maxT = 4;
  std::vector<int32_t> tokens = {1, 4, 1, 0, 2, 1};  // repeats: the scatter must add
  auto wte = randn(V * C, 15), wpe = randn(maxT * C, 16), dout = randn(B * T * C, 17);
  std::vector<float> out(B * T * C), dwte(V * C), dwpe(maxT * C);
  embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), DType::f32, B, T, C);
  Vec E = to_double(wte), P = to_double(wpe), D = to_double(dout);
  expect_close(out, ref::embedding(tokens, E, P, B, T, C), "embedding forward");
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  expect_close(dwte, numeric_grad(E, [&](const Vec& e) { return ref::embedding(tokens, e, P, B, T, C); }, D), "dwte");
  expect_close(dwpe, numeric_grad(P, [&](const Vec& p) { return ref::embedding(tokens, E, p, B, T, C); }, D), "dwpe");
}

TEST(GradCheck, CrossEntropyIgnoresPaddedColumns) {
  const int N = 4, V = 6, Vp = 8;
  auto logits = randn(N * Vp, 18, 3.0);
  for (int n = 0; n < N; ++n) logits[n * Vp + 6] = logits[n * Vp + 7] = 100.0f;  // padding must not count
  std::vector<int32_t> targets = {0, 5, 2, 2};
  std::vector<float> losses(N), lse(N), dlogits(N * Vp);
  crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
  Vec L = to_double(logits);
  expect_close(losses, ref::crossentropy(L, targets, N, V, Vp), "crossentropy forward", 1e-5);
  const float dloss = 0.3f;
  crossentropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), dloss, N, V, Vp);
  Vec w(N, dloss);
  expect_close(dlogits, numeric_grad(L, [&](const Vec& l) { return ref::crossentropy(l, targets, N, V, Vp); }, w),
               "crossentropy dlogits");
  for (int n = 0; n < N; ++n) EXPECT_EQ(dlogits[n * Vp + 6], 0.0f);
}

// ---------------------------------------------------------------- image classifiers

struct ConvCase {
  int N, C, H, W, OC, KH, KW, sh, sw, ph, pw;
};

TEST(GradCheck, Conv2d) {
  // Square and rectangular kernels, strides and padding (any kernel/stride/padding, issue 11).
  for (const ConvCase& k : {ConvCase{2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1}, ConvCase{1, 2, 9, 8, 3, 5, 5, 1, 1, 0, 0},
                            ConvCase{2, 2, 8, 9, 3, 3, 2, 2, 3, 1, 0}, ConvCase{1, 1, 6, 6, 2, 1, 1, 2, 2, 0, 0}}) {
    SCOPED_TRACE(testing::Message() << "conv N" << k.N << " C" << k.C << " " << k.H << "x" << k.W << " OC" << k.OC
                                    << " k" << k.KH << "x" << k.KW << " s" << k.sh << "x" << k.sw << " p" << k.ph << "x"
                                    << k.pw);
    Conv2dShape s{k.N, k.C, k.H, k.W, k.OC, k.KH, k.KW, k.sh, k.sw, k.ph, k.pw};
    const size_t in_n = static_cast<size_t>(k.N) * k.C * k.H * k.W, w_n = static_cast<size_t>(k.OC) * k.C * k.KH * k.KW;
    const size_t out_n = static_cast<size_t>(k.N) * k.OC * s.OH() * s.OW();
    auto inp = randn(in_n, 40), w = randn(w_n, 41), b = randn(k.OC, 42), dout = randn(out_n, 43);
    std::vector<float> out(out_n);
    conv2d_forward(out.data(), inp.data(), w.data(), b.data(), s);
    Vec X = to_double(inp), W = to_double(w), Bv = to_double(b), D = to_double(dout);
    auto f = [&](const Vec& x, const Vec& ww, const Vec& bb) {
      return ref::conv2d(x, ww, bb, k.N, k.C, k.H, k.W, k.OC, k.KH, k.KW, k.sh, k.sw, k.ph, k.pw);
    };
    expect_close(out, f(X, W, Bv), "conv forward");
    // Accumulating: parameter gradients land on top of 0.5 / 0.25.
    std::vector<float> dinp(in_n), dw(w_n, 0.5f), db(k.OC, 0.25f);
    conv2d_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s, true);
    expect_close(dinp, numeric_grad(X, [&](const Vec& x) { return f(x, W, Bv); }, D), "conv dinp");
    Vec gw = numeric_grad(W, [&](const Vec& ww) { return f(X, ww, Bv); }, D), gb = numeric_grad(Bv, [&](const Vec& bb) { return f(X, W, bb); }, D);
    Vec gw_acc = gw, gb_acc = gb;
    for (double& x : gw_acc) x += 0.5;
    for (double& x : gb_acc) x += 0.25;
    expect_close(dw, gw_acc, "conv dweight (accumulated)");
    expect_close(db, gb_acc, "conv dbias (accumulated)");
    // Overwriting (fresh gradients): garbage in the buffers is replaced.
    std::fill(dw.begin(), dw.end(), 1e30f);
    std::fill(db.begin(), db.end(), 1e30f);
    conv2d_backward(nullptr, dw.data(), db.data(), dout.data(), inp.data(), w.data(), s, false);
    expect_close(dw, gw, "conv dweight (overwritten)");
    expect_close(db, gb, "conv dbias (overwritten)");
  }
}

TEST(GradCheck, MaxPool2d) {
  struct PoolCase {
    int N, C, H, W, KH, KW, sh, sw, ph, pw;
  };
  for (const PoolCase& k : {PoolCase{2, 3, 8, 8, 2, 2, 2, 2, 0, 0}, PoolCase{1, 2, 7, 9, 3, 3, 2, 2, 1, 1},
                            PoolCase{1, 2, 5, 6, 3, 2, 1, 2, 0, 1}}) {
    SCOPED_TRACE(testing::Message() << "pool " << k.H << "x" << k.W << " k" << k.KH << "x" << k.KW << " s" << k.sh
                                    << "x" << k.sw << " p" << k.ph << "x" << k.pw);
    Pool2dShape s{k.N, k.C, k.H, k.W, k.KH, k.KW, k.sh, k.sw, k.ph, k.pw};
    const size_t in_n = static_cast<size_t>(k.N) * k.C * k.H * k.W, out_n = static_cast<size_t>(k.N) * k.C * s.OH() * s.OW();
    // Distinct values (a shuffled ramp) so that no window has a tie and differences are smooth.
    std::vector<float> inp(in_n);
    Rng rng(44);
    for (size_t i = 0; i < in_n; ++i) inp[i] = static_cast<float>(i) * 0.01f;
    for (size_t i = in_n - 1; i > 0; --i) std::swap(inp[i], inp[rng.below(i + 1)]);
    auto dout = randn(out_n, 45);
    std::vector<float> out(out_n), dinp(in_n, 7.0f);
    std::vector<char> ws(maxpool2d_workspace_bytes(s));
    maxpool2d_forward(out.data(), ws.data(), inp.data(), s);
    auto f = [&](const Vec& x) { return ref::maxpool2d(x, k.N, k.C, k.H, k.W, k.KH, k.KW, k.sh, k.sw, k.ph, k.pw); };
    Vec X = to_double(inp);
    expect_close(out, f(X), "maxpool forward");
    maxpool2d_backward(dinp.data(), dout.data(), ws.data(), s);
    expect_close(dinp, numeric_grad(X, f, to_double(dout)), "maxpool dinp");
  }
}

// Note [Conv layouts] (kernels/cpu/conv.cc): holding activations blocked changes no value. Every
// combination of input and output layouts gives the plain run's bits (forward, data, weight and
// bias gradients; pooling forward and backward), and blocked outputs keep zeros in the padding
// channels. Channel counts below, at and above one block, and not multiples of it.
TEST(ConvLayouts, BlockedEqualsPlainBitwise) {
  const int block = activation_channel_block();
  if (block == 0) GTEST_SKIP() << "oneDNN prefers plain layouts on this CPU: nothing is held blocked";
  auto blocked_of = [](const std::vector<float>& plain, int N, int C, int H, int W) {
    std::vector<float> b(static_cast<size_t>(N) * activation_numel(C, H, W, ActLayout::blocked), -1.0f);
    activation_to_blocked(b.data(), plain.data(), N, C, H, W);
    return b;
  };
  auto plain_of = [](const std::vector<float>& blocked, int N, int C, int H, int W) {
    std::vector<float> p(static_cast<size_t>(N) * C * H * W);
    activation_to_plain(p.data(), blocked.data(), N, C, H, W);
    return p;
  };
  // The padding channels (c >= C) of a blocked tensor are zero.
  auto expect_zero_padding = [&](const std::vector<float>& blocked, int N, int C, int H, int W, const char* what) {
    const int Cp = (C + block - 1) / block * block;
    size_t bad = 0;
    for (int n = 0; n < N; ++n)
      for (int c = C; c < Cp; ++c)
        for (int hw = 0; hw < H * W; ++hw) {
          const size_t at = ((static_cast<size_t>(n) * (Cp / block) + c / block) * H * W + hw) * block + c % block;
          bad += blocked[at] != 0.0f;
        }
    EXPECT_EQ(bad, 0u) << what << ": nonzero padding";
  };
  const ActLayout layouts[] = {ActLayout::plain, ActLayout::blocked};
  for (const ConvCase& k : {ConvCase{3, 10, 12, 12, 20, 5, 5, 1, 1, 0, 0}, ConvCase{2, 1, 9, 9, 10, 5, 5, 1, 1, 0, 0},
                            ConvCase{2, 16, 7, 6, 17, 3, 3, 2, 1, 1, 1}, ConvCase{2, 24, 6, 6, 8, 3, 3, 1, 1, 1, 1}}) {
    SCOPED_TRACE(testing::Message() << "conv C" << k.C << " OC" << k.OC);
    Conv2dShape plain{k.N, k.C, k.H, k.W, k.OC, k.KH, k.KW, k.sh, k.sw, k.ph, k.pw};
    const int OH = plain.OH(), OW = plain.OW();
    const size_t in_n = static_cast<size_t>(k.N) * k.C * k.H * k.W, w_n = static_cast<size_t>(k.OC) * k.C * k.KH * k.KW;
    const size_t out_n = static_cast<size_t>(k.N) * k.OC * OH * OW;
    auto inp = randn(in_n, 50), w = randn(w_n, 51), b = randn(k.OC, 52), dout = randn(out_n, 53);
    std::vector<float> out(out_n), dinp(in_n), dw(w_n), db(k.OC);
    conv2d_forward(out.data(), inp.data(), w.data(), b.data(), plain);
    conv2d_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), plain, false);
    for (ActLayout src : layouts)
      for (ActLayout dst : layouts) {
        if (src == ActLayout::plain && dst == ActLayout::plain) continue;
        SCOPED_TRACE(testing::Message() << "src " << (src == ActLayout::blocked ? "blocked" : "plain") << ", dst "
                                        << (dst == ActLayout::blocked ? "blocked" : "plain"));
        Conv2dShape s = plain;
        s.src_layout = src;
        s.dst_layout = dst;
        const bool bs = src == ActLayout::blocked, bd = dst == ActLayout::blocked;
        std::vector<float> x = bs ? blocked_of(inp, k.N, k.C, k.H, k.W) : inp;
        std::vector<float> g = bd ? blocked_of(dout, k.N, k.OC, OH, OW) : dout;
        std::vector<float> y(static_cast<size_t>(k.N) * activation_numel(k.OC, OH, OW, dst), -1.0f);
        std::vector<float> dx(static_cast<size_t>(k.N) * activation_numel(k.C, k.H, k.W, src), -1.0f);
        std::vector<float> dw2(w_n, 0.0f), db2(k.OC, 0.0f);
        conv2d_forward(y.data(), x.data(), w.data(), b.data(), s);
        conv2d_backward(dx.data(), dw2.data(), db2.data(), g.data(), x.data(), w.data(), s, false);
        if (bd) expect_zero_padding(y, k.N, k.OC, OH, OW, "conv output");
        if (bs) expect_zero_padding(dx, k.N, k.C, k.H, k.W, "conv input gradient");
        EXPECT_EQ(bd ? plain_of(y, k.N, k.OC, OH, OW) : y, out);
        EXPECT_EQ(bs ? plain_of(dx, k.N, k.C, k.H, k.W) : dx, dinp);
        EXPECT_EQ(dw2, dw);
        EXPECT_EQ(db2, db);
      }
  }
  for (int C : {10, 16, 20}) {
    SCOPED_TRACE(testing::Message() << "pool C" << C);
    Pool2dShape plain{2, C, 8, 8, 2, 2, 2, 2, 0, 0};
    const size_t in_n = static_cast<size_t>(2) * C * 64, out_n = static_cast<size_t>(2) * C * 16;
    auto inp = randn(in_n, 54), dout = randn(out_n, 55);
    std::vector<float> out(out_n), dinp(in_n);
    std::vector<char> ws(maxpool2d_workspace_bytes(plain));
    maxpool2d_forward(out.data(), ws.data(), inp.data(), plain);
    maxpool2d_backward(dinp.data(), dout.data(), ws.data(), plain);
    Pool2dShape s = plain;
    s.layout = ActLayout::blocked;
    std::vector<float> y(2 * activation_numel(C, 4, 4, ActLayout::blocked), -1.0f);
    std::vector<float> dx(2 * activation_numel(C, 8, 8, ActLayout::blocked), -1.0f);
    std::vector<char> ws2(maxpool2d_workspace_bytes(s));
    maxpool2d_forward(y.data(), ws2.data(), blocked_of(inp, 2, C, 8, 8).data(), s);
    maxpool2d_backward(dx.data(), blocked_of(dout, 2, C, 4, 4).data(), ws2.data(), s);
    expect_zero_padding(y, 2, C, 4, 4, "pool output");
    expect_zero_padding(dx, 2, C, 8, 8, "pool input gradient");
    EXPECT_EQ(plain_of(y, 2, C, 4, 4), out);
    EXPECT_EQ(plain_of(dx, 2, C, 8, 8), dinp);
  }
}

TEST(GradCheck, Relu) {
  const size_t n = 40;
  auto inp = randn(n, 46), dout = randn(n, 47);
  for (float& x : inp)
    if (std::abs(x) < 1e-3f) x = 0.5f;  // away from the kink, where differences are undefined
  std::vector<float> out(n), dinp(n);
  relu_forward(out.data(), inp.data(), n);
  Vec X = to_double(inp);
  expect_close(out, ref::relu(X), "relu forward");
  relu_backward(dinp.data(), dout.data(), out.data(), n);
  expect_close(dinp, numeric_grad(X, ref::relu, to_double(dout)), "relu dinp");
}

TEST(GradCheck, Dropout) {
  const int N = 6;
  const size_t per = 50, n = N * per;
  const float p = 0.3f;
  auto inp = randn(n, 48), dout = randn(n, 49);
  DropoutKey key{1337, 99, 12};
  std::vector<float> out(n), dinp(n);
  dropout_forward(out.data(), inp.data(), N, per, p, key);
  // The mask the forward used, read off the output (inputs are never exactly 0).
  std::vector<int> keep(n);
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) kept += keep[i] = out[i] != 0.0f;
  EXPECT_GT(kept, n * 0.55);  // about 70% kept
  EXPECT_LT(kept, n * 0.85);
  Vec X = to_double(inp);
  auto f = [&](const Vec& x) { return ref::dropout(x, keep, p); };
  expect_close(out, f(X), "dropout forward");
  dropout_backward(dinp.data(), dout.data(), N, per, p, key);
  expect_close(dinp, numeric_grad(X, f, to_double(dout)), "dropout dinp");
  // Note [Dropout keys]: sample b's mask depends on first_sample + b only, so the same samples
  // split into two micro-batches (two ranks) get the same masks.
  std::vector<float> split(n);
  dropout_forward(split.data(), inp.data(), 2, per, p, key);
  DropoutKey later = key;
  later.first_sample += 2;
  dropout_forward(split.data() + 2 * per, inp.data() + 2 * per, N - 2, per, p, later);
  EXPECT_EQ(split, out);
  // Another step (key) or seed draws another mask.
  std::vector<float> other(n);
  DropoutKey next = key;
  next.key += 1;
  dropout_forward(other.data(), inp.data(), N, per, p, next);
  EXPECT_NE(other, out);
}

TEST(GradCheck, SoftmaxCrossEntropy) {
  const int N = 5, K = 7;
  auto logits = randn(N * K, 50, 3.0);
  std::vector<int32_t> labels = {0, 6, 3, 3, 1};
  std::vector<float> probs(N * K), losses(N), dlogits(N * K);
  int64_t correct = -1;
  float loss = softmax_cross_entropy_forward(probs.data(), losses.data(), logits.data(), labels.data(), N, K, &correct);
  Vec X = to_double(logits);
  const double want = ref::softmax_cross_entropy(X, labels, N, K);
  EXPECT_NEAR(loss, want, 1e-5 * std::max(1.0, want));
  int64_t want_correct = 0;
  for (int n = 0; n < N; ++n)
    want_correct += std::max_element(logits.begin() + n * K, logits.begin() + (n + 1) * K) - (logits.begin() + n * K) == labels[n];
  EXPECT_EQ(correct, want_correct);
  const float scale = 0.5f;
  softmax_cross_entropy_backward(dlogits.data(), probs.data(), labels.data(), N, K, scale);
  Vec w{scale};
  Vec g = numeric_grad(X, [&](const Vec& x) { return Vec{ref::softmax_cross_entropy(x, labels, N, K)}; }, w);
  expect_close(dlogits, g, "cross-entropy dlogits");
}

}  // namespace
}  // namespace zerone::kernels::cpu
