// Double-precision reference implementations of the GPT-2 layers: the simplest loops that say
// what each kernel computes, written independently of zerone/kernels (no shared code), used as the
// oracle for forward values and, through finite differences, for gradients.
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

}  // namespace zerone::ref
