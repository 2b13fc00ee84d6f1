#include "zerone/train/markov_source.h"

#include <algorithm>
#include <cmath>

#include "zerone/core/error.h"
#include "zerone/core/rng.h"

namespace zerone::train {

MarkovSource::MarkovSource(uint64_t seed, int order, double sharpness) : alphabet_("abcdefghijklmnopqrstuvwxyz .,;!?") {
  K_ = static_cast<int>(alphabet_.size());
  ZERONE_CHECK(order >= 1 && order <= 3, "Markov source order ", order, " is out of range: expected 1..3");
  S_ = 1;
  for (int i = 0; i < order; ++i) S_ *= K_;
  const int K = K_, S = S_;
  std::vector<double> probs(static_cast<size_t>(S) * K);  // (S contexts, K next symbols)
  cdf_.resize(probs.size());
  Rng rng(seed, 0x3a7c0f);
  for (int ctx = 0; ctx < S; ++ctx) {
    double* row = &probs[static_cast<size_t>(ctx) * K];
    double maxz = -1e300;
    for (int j = 0; j < K; ++j) maxz = std::max(maxz, row[j] = sharpness * rng.normal());
    double sum = 0.0;
    for (int j = 0; j < K; ++j) sum += row[j] = std::exp(row[j] - maxz);
    double acc = 0.0;
    for (int j = 0; j < K; ++j) {
      row[j] /= sum;
      cdf_[static_cast<size_t>(ctx) * K + j] = acc += row[j];
    }
  }
  // Stationary law of the context chain (.., a, b) -> (.., b, c) by power iteration.
  std::vector<double> pi(S, 1.0 / S), next(S);
  for (int iter = 0; iter < 10000; ++iter) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int ctx = 0; ctx < S; ++ctx) {
      for (int c = 0; c < K; ++c) next[(ctx * K + c) % S] += pi[ctx] * probs[static_cast<size_t>(ctx) * K + c];
    }
    double diff = 0.0;
    for (int i = 0; i < S; ++i) diff += std::abs(next[i] - pi[i]);
    pi.swap(next);
    if (diff < 1e-14) break;
  }
  stationary_ = pi;
  double h = 0.0;
  for (int ctx = 0; ctx < S; ++ctx) {
    double row_h = 0.0;
    for (int j = 0; j < K; ++j) {
      double p = probs[static_cast<size_t>(ctx) * K + j];
      if (p > 0) row_h -= p * std::log(p);
    }
    h += pi[ctx] * row_h;
  }
  entropy_rate_ = h;
}

std::vector<int32_t> MarkovSource::generate(size_t n, uint64_t stream) const {
  const int K = K_;
  Rng rng(0x9e11, stream);
  auto draw = [&](const double* cdf, int count) {
    double u = rng.uniform() * cdf[count - 1];
    return static_cast<int>(std::upper_bound(cdf, cdf + count, u) - cdf) % count;
  };
  // Start from the stationary law over contexts.
  std::vector<double> pi_cdf(stationary_.size());
  double acc = 0.0;
  for (size_t i = 0; i < stationary_.size(); ++i) pi_cdf[i] = acc += stationary_[i];
  int ctx = draw(pi_cdf.data(), static_cast<int>(pi_cdf.size()));
  std::vector<int32_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    int c = draw(&cdf_[static_cast<size_t>(ctx) * K], K);
    out[i] = static_cast<unsigned char>(alphabet_[c]);
    ctx = (ctx * K + c) % S_;
  }
  return out;
}

}  // namespace zerone::train
