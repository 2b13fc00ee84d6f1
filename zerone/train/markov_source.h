// The built-in corpus of the default run: a seeded Markov chain of order 1 or more over 32
// printable bytes whose entropy rate is known exactly, so a run can be judged against the true
// floor (no model can do better than H nats/token on average).
//
// The context is the last `order` symbols (K^order contexts). Transition rows are
// softmax(sharpness * z) with z ~ N(0, 1) from the seed, so every transition has positive
// probability: the context chain is irreducible and aperiodic, its stationary law is unique and
// found by power iteration, and H = sum_ctx pi(ctx) * entropy(row ctx).
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zerone::train {

class MarkovSource {
 public:
  explicit MarkovSource(uint64_t seed, int order = 1, double sharpness = 2.5);

  // The symbols as byte values (token ids of the byte-level tokenizer).
  const std::string& alphabet() const { return alphabet_; }
  // Entropy rate in nats per token.
  double entropy_rate() const { return entropy_rate_; }
  // n tokens of the chain, started from the stationary law; `stream` selects an independent run.
  std::vector<int32_t> generate(size_t n, uint64_t stream) const;

 private:
  int K_, S_;  // symbols, contexts (K^order)
  std::string alphabet_;
  std::vector<double> cdf_;    // cumulative rows, for sampling
  std::vector<double> stationary_;  // (S)
  double entropy_rate_ = 0.0;
};

}  // namespace zerone::train
