#include "zerone/train/sample.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "zerone/core/error.h"
#include "zerone/core/rng.h"
#include "zerone/io/llmc_checkpoint.h"
#include "zerone/io/tokenizer.h"
#include "zerone/nn/gpt2.h"
#include "zerone/train/trainer.h"

namespace zerone::train {

void sample(const SampleOptions& o, const std::function<void(const std::string&)>& emit) {
  ZERONE_CHECK(!o.init.empty(), "--init FILE is required: the llm.c checkpoint to sample from");
  ZERONE_CHECK(o.num_tokens >= 1 && o.num_tokens <= 1000000, "--tokens ", o.num_tokens, " is out of range: expected 1..1000000");
  ZERONE_CHECK(std::isfinite(o.temperature) && o.temperature >= 0.0f, "--temperature ", o.temperature, " must be >= 0");
  ZERONE_CHECK(o.top_k >= 0, "--top-k ", o.top_k, " must be >= 0");
  nn::GPT2Config config = io::read_llmc_config(o.init);
  nn::GPT2 model(config, resolve_precision(o.precision));
  io::load_llmc_checkpoint(o.init, model);

  std::unique_ptr<io::LlmcTokenizer> tokenizer;
  if (!o.tokenizer.empty()) tokenizer = std::make_unique<io::LlmcTokenizer>(o.tokenizer);
  auto decode = [&](int32_t t) { return tokenizer ? tokenizer->decode(&t, 1) : io::byte_decode(&t, 1); };

  // --prompt is byte-encoded: right only for byte-level models (zerone prepare's vocabulary of 257,
  // or 256 bytes without end-of-text) whose output is byte-decoded too.
  ZERONE_CHECK(o.prompt.empty() || o.prompt_tokens.empty(), "--prompt and --prompt-tokens both given: pass one");
  std::vector<int32_t> tokens = o.prompt_tokens;
  if (!o.prompt.empty()) {
    ZERONE_CHECK(o.tokenizer.empty(), "--prompt is encoded byte by byte, which --tokenizer's vocabulary does not ",
                 "use (llm.c's tokenizer file only decodes): pass --prompt-tokens instead");
    ZERONE_CHECK(config.vocab_size == io::kByteVocabSize || config.vocab_size == 256,
                 "--prompt is encoded byte by byte, but this model's vocabulary has ", config.vocab_size,
                 " tokens, not the byte vocabulary of ", io::kByteVocabSize, ": pass --prompt-tokens instead");
    tokens = io::byte_encode(o.prompt);
  }
  if (tokens.empty()) tokens.push_back(config.vocab_size > io::kByteEot ? io::kByteEot : 0);
  for (int32_t t : tokens)
    ZERONE_CHECK(t >= 0 && t < config.vocab_size, "prompt token ", t, " is out of range for vocabulary ", config.vocab_size);
  for (int32_t t : tokens) emit(decode(t));

  Rng rng(o.seed, 0x5a3b1e);
  std::vector<float> probs(config.vocab_size);
  for (int i = 0; i < o.num_tokens; ++i) {
    // The context is the last maxT tokens; recompute the forward over it (simple and exact).
    size_t ctx = std::min<size_t>(tokens.size(), config.max_seq_len);
    const int32_t* window = tokens.data() + tokens.size() - ctx;
    model.forward(window, nullptr, 1, static_cast<int>(ctx));
    const float* logits = model.logits() + (ctx - 1) * config.padded_vocab_size;  // (Vp) of the last position
    int32_t next = 0;
    if (o.temperature == 0.0f) {
      next = static_cast<int32_t>(std::max_element(logits, logits + config.vocab_size) - logits);
    } else {
      float threshold = -INFINITY;
      if (o.top_k > 0 && o.top_k < config.vocab_size) {
        std::vector<float> sorted(logits, logits + config.vocab_size);
        std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
        threshold = sorted[o.top_k - 1];
      }
      float maxv = *std::max_element(logits, logits + config.vocab_size);
      double sum = 0.0;
      for (int v = 0; v < config.vocab_size; ++v) {
        probs[v] = logits[v] < threshold ? 0.0f : std::exp((logits[v] - maxv) / o.temperature);
        sum += probs[v];
      }
      double u = rng.uniform() * sum, acc = 0.0;
      next = config.vocab_size - 1;
      for (int v = 0; v < config.vocab_size; ++v) {
        acc += probs[v];
        if (u < acc) { next = v; break; }
      }
    }
    tokens.push_back(next);
    emit(decode(next));
  }
}

}  // namespace zerone::train
