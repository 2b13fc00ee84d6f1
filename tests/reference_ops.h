// Double-precision reference implementations of every backend operation (the oracle of
// tests/kernels/backend_ops_test.cc): the simplest loops that say what each kernel computes,
// written independently of zerone/kernels (no shared code), used for forward values and, through
// finite differences, for gradients.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace zerone::ref {

using Vec = std::vector<double>;

// out (N,OC) = inp (N,C) @ w^T (OC,C) + b
inline Vec linear(const Vec& inp, const Vec& w, const Vec& b, int N, int C, int OC) {
  Vec out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int c = 0; c < C; ++c) s += inp[n * C + c] * w[o * C + c];
      out[n * OC + o] = s;
    }
  return out;
}

inline Vec layernorm(const Vec& inp, const Vec& w, const Vec& b, int N, int C) {
  Vec out(inp.size());
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += inp[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (inp[n * C + c] - m) * (inp[n * C + c] - m);
    v /= C;
    double s = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c) out[n * C + c] = (inp[n * C + c] - m) * s * w[c] + b[c];
  }
  return out;
}

// qkv (B,T,3C) -> out (B,T,C), causal softmax attention per head.
inline Vec attention(const Vec& qkv, int B, int T, int C, int NH) {
  int hs = C / NH;
  Vec out(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> score(t + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < hs; ++i) d += qkv[(b * T + t) * 3 * C + h * hs + i] * qkv[(b * T + u) * 3 * C + C + h * hs + i];
          score[u] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, score[u]);
        }
        double z = 0;
        for (double& s : score) z += (s = std::exp(s - mx));
        for (int u = 0; u <= t; ++u)
          for (int i = 0; i < hs; ++i)
            out[(b * T + t) * C + h * hs + i] += score[u] / z * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
      }
  return out;
}

inline Vec gelu(const Vec& x) {
  Vec out(x.size());
  const double k = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < x.size(); ++i) out[i] = 0.5 * x[i] * (1.0 + std::tanh(k * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return out;
}

inline Vec embedding(const std::vector<int32_t>& tokens, const Vec& wte, const Vec& wpe, int B, int T, int C) {
  Vec out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) out[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
  return out;
}

// Per-row losses over the first V of Vp columns.
inline Vec crossentropy(const Vec& logits, const std::vector<int32_t>& targets, int N, int V, int Vp) {
  Vec out(N);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[n * Vp + v]);
    for (int v = 0; v < V; ++v) z += std::exp(logits[n * Vp + v] - mx);
    out[n] = mx + std::log(z) - logits[n * Vp + targets[n]];
  }
  return out;
}

// LLaMA layers.

// Grouped-query causal attention: qkv (B,T,(NH+2*NKV)*hs) = [q heads | k heads | v heads] per
// token; query head h uses kv head h / (NH/NKV). out (B,T,NH*hs).
inline Vec gqa_attention(const Vec& qkv, int B, int T, int NH, int NKV, int hs) {
  const int R = (NH + 2 * NKV) * hs, G = NH / NKV;
  Vec out(static_cast<size_t>(B) * T * NH * hs, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int kv = h / G;
      for (int t = 0; t < T; ++t) {
        std::vector<double> score(t + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < hs; ++i) d += qkv[(b * T + t) * R + h * hs + i] * qkv[(b * T + u) * R + (NH + kv) * hs + i];
          score[u] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, score[u]);
        }
        double z = 0;
        for (double& sc : score) z += (sc = std::exp(sc - mx));
        for (int u = 0; u <= t; ++u)
          for (int i = 0; i < hs; ++i)
            out[(b * T + t) * NH * hs + h * hs + i] += score[u] / z * qkv[(b * T + u) * R + (NH + NKV + kv) * hs + i];
      }
    }
  return out;
}

// out (N,C) = x / sqrt(mean(x^2) + eps) * w
inline Vec rmsnorm(const Vec& inp, const Vec& w, int N, int C, double eps) {
  Vec out(inp.size());
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += inp[n * C + c] * inp[n * C + c];
    double s = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) out[n * C + c] = inp[n * C + c] * s * w[c];
  }
  return out;
}

// Rotate-half rotary embedding of the first `heads` heads of each (B,T) row of `stride` values,
// angle t * inv_freq[i] for the pair (i, i + hs/2).
inline Vec rope(const Vec& x, const std::vector<double>& inv_freq, int B, int T, int stride, int heads, int hs) {
  Vec out = x;
  const int half = hs / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < half; ++i) {
          size_t base = (static_cast<size_t>(b) * T + t) * stride + h * hs;
          double a = x[base + i], c = x[base + i + half], ang = t * inv_freq[i];
          out[base + i] = a * std::cos(ang) - c * std::sin(ang);
          out[base + i + half] = c * std::cos(ang) + a * std::sin(ang);
        }
  return out;
}

// inp (N,2F) = [gate | up]; out (N,F) = gate * sigmoid(gate) * up
inline Vec swiglu(const Vec& inp, int N, int F) {
  Vec out(static_cast<size_t>(N) * F);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < F; ++i) {
      double g = inp[n * 2 * F + i], u = inp[n * 2 * F + F + i];
      out[n * F + i] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

// ---- image classifiers (nn/sequential.h)

// inp (N,C,H,W), w (OC,C,KH,KW), b (OC) -> out (N,OC,OH,OW); zero padding, floor output size.
inline Vec conv2d(const Vec& inp, const Vec& w, const Vec& b, int N, int C, int H, int W, int OC, int KH, int KW,
                  int sh, int sw, int ph, int pw) {
  const int OH = (H + 2 * ph - KH) / sh + 1, OW = (W + 2 * pw - KW) / sw + 1;
  Vec out(static_cast<size_t>(N) * OC * OH * OW);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o)
      for (int y = 0; y < OH; ++y)
        for (int x = 0; x < OW; ++x) {
          double s = b.empty() ? 0.0 : b[o];
          for (int c = 0; c < C; ++c)
            for (int i = 0; i < KH; ++i)
              for (int j = 0; j < KW; ++j) {
                const int iy = y * sh - ph + i, ix = x * sw - pw + j;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                s += inp[((static_cast<size_t>(n) * C + c) * H + iy) * W + ix] * w[((static_cast<size_t>(o) * C + c) * KH + i) * KW + j];
              }
          out[((static_cast<size_t>(n) * OC + o) * OH + y) * OW + x] = s;
        }
  return out;
}

// inp (N,C,H,W) -> out (N,C,OH,OW), max over each window (padding excluded).
inline Vec maxpool2d(const Vec& inp, int N, int C, int H, int W, int KH, int KW, int sh, int sw, int ph, int pw) {
  const int OH = (H + 2 * ph - KH) / sh + 1, OW = (W + 2 * pw - KW) / sw + 1;
  Vec out(static_cast<size_t>(N) * C * OH * OW);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int y = 0; y < OH; ++y)
        for (int x = 0; x < OW; ++x) {
          double m = -1e300;
          for (int i = 0; i < KH; ++i)
            for (int j = 0; j < KW; ++j) {
              const int iy = y * sh - ph + i, ix = x * sw - pw + j;
              if (iy >= 0 && iy < H && ix >= 0 && ix < W) m = std::max(m, inp[((static_cast<size_t>(n) * C + c) * H + iy) * W + ix]);
            }
          out[((static_cast<size_t>(n) * C + c) * OH + y) * OW + x] = m;
        }
  return out;
}

inline Vec relu(const Vec& inp) {
  Vec out(inp.size());
  for (size_t i = 0; i < inp.size(); ++i) out[i] = inp[i] > 0 ? inp[i] : 0.0;
  return out;
}

// out = inp * keep / (1 - p) with a given 0/1 keep mask.
inline Vec dropout(const Vec& inp, const std::vector<int>& keep, double p) {
  Vec out(inp.size());
  for (size_t i = 0; i < inp.size(); ++i) out[i] = keep[i] ? inp[i] / (1.0 - p) : 0.0;
  return out;
}

// Mean over N rows of -log softmax(logits (N,K))[label].
inline double softmax_cross_entropy(const Vec& logits, const std::vector<int32_t>& labels, int N, int K) {
  double total = 0;
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int k = 0; k < K; ++k) mx = std::max(mx, logits[n * K + k]);
    for (int k = 0; k < K; ++k) z += std::exp(logits[n * K + k] - mx);
    total += std::log(z) + mx - logits[n * K + labels[n]];
  }
  return total / N;
}

// ---- saved statistics and per-row values of the layers above

// Per-row mean and 1/sqrt(var + 1e-5) of layernorm (the kernels save them for backward).
inline void layernorm_stats(const Vec& inp, int N, int C, Vec& mean, Vec& rstd) {
  mean.assign(N, 0.0);
  rstd.assign(N, 0.0);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += inp[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (inp[n * C + c] - m) * (inp[n * C + c] - m);
    mean[n] = m;
    rstd[n] = 1.0 / std::sqrt(v / C + 1e-5);
  }
}

// Per-row 1/sqrt(mean(x^2) + eps) of rmsnorm.
inline Vec rmsnorm_rstd(const Vec& inp, int N, int C, double eps) {
  Vec out(N);
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += inp[n * C + c] * inp[n * C + c];
    out[n] = 1.0 / std::sqrt(ss / C + eps);
  }
  return out;
}

// The causal softmax probabilities (B,NH,T,T) of grouped-query attention (gqa_attention's layout;
// NKV = NH and hs = C/NH is plain attention's (B,T,3C)), zero above the diagonal.
inline Vec gqa_attention_probs(const Vec& qkv, int B, int T, int NH, int NKV, int hs) {
  const int R = (NH + 2 * NKV) * hs, G = NH / NKV;
  Vec att(static_cast<size_t>(B) * NH * T * T, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double* row = &att[((static_cast<size_t>(b) * NH + h) * T + t) * T];
        double mx = -1e300, z = 0;
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < hs; ++i) d += qkv[(b * T + t) * R + h * hs + i] * qkv[(b * T + u) * R + (NH + h / G) * hs + i];
          row[u] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, row[u]);
        }
        for (int u = 0; u <= t; ++u) z += (row[u] = std::exp(row[u] - mx));
        for (int u = 0; u <= t; ++u) row[u] /= z;
      }
  return att;
}

// Each row's logsumexp of its causal scaled scores (B,NH,T): what a flash kernel saves
// (Note [Attention's saved state] in zerone/kernels/backend.h).
inline Vec gqa_attention_lse(const Vec& qkv, int B, int T, int NH, int NKV, int hs) {
  const int R = (NH + 2 * NKV) * hs, G = NH / NKV;
  Vec lse(static_cast<size_t>(B) * NH * T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> score(t + 1);
        double mx = -1e300, z = 0;
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < hs; ++i) d += qkv[(b * T + t) * R + h * hs + i] * qkv[(b * T + u) * R + (NH + h / G) * hs + i];
          score[u] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, score[u]);
        }
        for (double sc : score) z += std::exp(sc - mx);
        lse[(static_cast<size_t>(b) * NH + h) * T + t] = mx + std::log(z);
      }
  return lse;
}

// The gradient (B,T,(NH+2*NKV)*hs) of sum(gqa_attention(qkv) * dout) with respect to qkv, by the
// chain rule (dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = dS K / sqrt(hs), dK = dS^T Q /
// sqrt(hs), dV = P^T dO); for shapes where finite differences would take too long. The test of
// the flash tiling checks it against finite differences (tests/kernels/flash_tiles_test.cc).
inline Vec gqa_attention_grad(const Vec& qkv, const Vec& dout, int B, int T, int NH, int NKV, int hs) {
  const int R = (NH + 2 * NKV) * hs, G = NH / NKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const Vec P = gqa_attention_probs(qkv, B, T, NH, NKV, hs);
  Vec g(qkv.size(), 0.0);
  auto at = [&](int b, int t, int head) { return (static_cast<size_t>(b) * T + t) * R + static_cast<size_t>(head) * hs; };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int kq = NH + h / G, vq = NH + NKV + h / G;
      for (int t = 0; t < T; ++t) {
        const double* p = &P[((static_cast<size_t>(b) * NH + h) * T + t) * T];
        const size_t o = (static_cast<size_t>(b) * T + t) * NH * hs + static_cast<size_t>(h) * hs;
        std::vector<double> dp(t + 1);
        double D = 0;
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < hs; ++i) d += dout[o + i] * qkv[at(b, u, vq) + i];
          dp[u] = d;
          D += p[u] * d;
        }
        for (int u = 0; u <= t; ++u) {
          const double ds = p[u] * (dp[u] - D);
          for (int i = 0; i < hs; ++i) {
            g[at(b, t, h) + i] += scale * ds * qkv[at(b, u, kq) + i];
            g[at(b, u, kq) + i] += scale * ds * qkv[at(b, t, h) + i];
            g[at(b, u, vq) + i] += p[u] * dout[o + i];
          }
        }
      }
    }
  return g;
}

// Per-row log-sum-exp over the first V of Vp columns.
inline Vec logsumexp(const Vec& logits, int N, int V, int Vp) {
  Vec out(N);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[n * Vp + v]);
    for (int v = 0; v < V; ++v) z += std::exp(logits[n * Vp + v] - mx);
    out[n] = mx + std::log(z);
  }
  return out;
}

// Row-wise softmax of logits (N,K).
inline Vec softmax(const Vec& logits, int N, int K) {
  Vec out(logits.size());
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int k = 0; k < K; ++k) mx = std::max(mx, logits[n * K + k]);
    for (int k = 0; k < K; ++k) z += (out[n * K + k] = std::exp(logits[n * K + k] - mx));
    for (int k = 0; k < K; ++k) out[n * K + k] /= z;
  }
  return out;
}

// Inverse rotary frequencies 1 / theta^(2i/hs), with Hugging Face's llama3 rule when factor > 0:
// wavelengths above original/low divided by factor, below original/high kept, blended between.
inline Vec rope_inv_freq(int hs, double theta, double factor = 0, double low = 1, double high = 4,
                         double original = 8192) {
  const double pi = 3.14159265358979323846;
  Vec out(hs / 2);
  for (int i = 0; i < hs / 2; ++i) {
    double f = 1.0 / std::pow(theta, 2.0 * i / hs);
    if (factor > 0) {
      const double wavelen = 2 * pi / f;
      if (wavelen > original / low) f /= factor;
      else if (wavelen >= original / high) {
        const double smooth = (original / wavelen - low) / (high - low);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
    out[i] = f;
  }
  return out;
}

// ---- optimizers (torch.optim.AdamW and torch.optim.SGD, one tensor, in double)

struct AdamWRef {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0, grad_scale = 1;
};
// One step `step` (1-based) over p, m, v with gradients g.
inline void adamw_step(Vec& p, Vec& m, Vec& v, const Vec& g, const AdamWRef& h, int step) {
  const double bc1 = 1 - std::pow(h.beta1, step), bc2 = 1 - std::pow(h.beta2, step);
  for (size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] * h.grad_scale;
    p[i] *= 1 - h.lr * h.weight_decay;
    m[i] = h.beta1 * m[i] + (1 - h.beta1) * gi;
    v[i] = h.beta2 * v[i] + (1 - h.beta2) * gi * gi;
    p[i] -= h.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + h.eps);
  }
}

struct SGDRef {
  double lr = 1e-2, momentum = 0, dampening = 0, weight_decay = 0, grad_scale = 1;
  bool nesterov = false;
};
// One step over p (and the momentum buffer b when momentum != 0); `first`: b starts as the gradient.
inline void sgd_step(Vec& p, Vec& b, const Vec& g, const SGDRef& h, bool first) {
  for (size_t i = 0; i < p.size(); ++i) {
    double gi = g[i] * h.grad_scale + h.weight_decay * p[i];
    if (h.momentum != 0) {
      b[i] = first ? gi : h.momentum * b[i] + (1 - h.dampening) * gi;
      gi = h.nesterov ? gi + h.momentum * b[i] : b[i];
    }
    p[i] -= h.lr * gi;
  }
}

// ---- number formats

// x rounded to bfloat16 (8 significant bits, f32's exponent range), to nearest, ties to even;
// beyond the largest bfloat16 it is infinite. NaN and infinities pass through.
inline double round_bf16(double x) {
  if (!std::isfinite(x) || x == 0) return x;
  const int e = std::max(std::ilogb(x), -126);
  const double q = std::ldexp(1.0, e - 7);
  const double r = std::nearbyint(x / q) * q;  // the default rounding mode: ties to even
  const double max_bf16 = std::ldexp(255.0, 120);
  return std::abs(r) > max_bf16 ? std::copysign(INFINITY, x) : r;
}

// x rounded to IEEE half (11 significant bits, exponents -14..15), as round_bf16.
inline double round_f16(double x) {
  if (!std::isfinite(x) || x == 0) return x;
  const int e = std::max(std::ilogb(x), -14);
  const double q = std::ldexp(1.0, e - 10);
  const double r = std::nearbyint(x / q) * q;
  return std::abs(r) > 65504.0 ? std::copysign(INFINITY, x) : r;
}

// ---- channel-blocked activations (nChw<block>c: channels padded to the block with zeros)

inline size_t blocked_index(int n, int c, int hw, int C, int HW, int block) {
  const int Cp = (C + block - 1) / block * block;
  return ((static_cast<size_t>(n) * (Cp / block) + c / block) * HW + hw) * block + c % block;
}
inline Vec to_blocked(const Vec& plain, int N, int C, int H, int W, int block) {
  const int Cp = (C + block - 1) / block * block;
  Vec out(static_cast<size_t>(N) * Cp * H * W, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int hw = 0; hw < H * W; ++hw)
        out[blocked_index(n, c, hw, C, H * W, block)] = plain[(static_cast<size_t>(n) * C + c) * H * W + hw];
  return out;
}
inline Vec to_plain(const Vec& blocked, int N, int C, int H, int W, int block) {
  Vec out(static_cast<size_t>(N) * C * H * W);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int hw = 0; hw < H * W; ++hw)
        out[(static_cast<size_t>(n) * C + c) * H * W + hw] = blocked[blocked_index(n, c, hw, C, H * W, block)];
  return out;
}

}  // namespace zerone::ref
