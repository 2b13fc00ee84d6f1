#include "zerone/train/sample.h"

#include <algorithm>
#include <cmath>

#include <cstdio>
#include <memory>

#include "zerone/core/error.h"
#include "zerone/core/rng.h"
#include "zerone/core/sysinfo.h"
#include "zerone/io/tokenizer.h"
#include "zerone/io/weight_source.h"
#include "zerone/kernels/backend.h"
#include "zerone/train/config.h"
#include "zerone/train/plan.h"
#include "zerone/train/trainer.h"

namespace zerone::train {

void sample(const SampleOptions& o, const std::function<void(const std::string&)>& emit) {
  ZERONE_CHECK(!o.init.empty(), "--init is required: the llm.c checkpoint, Hugging Face model directory or zerone ",
               "checkpoint to sample from");
  ZERONE_CHECK(o.num_tokens >= 1 && o.num_tokens <= 1000000, "--tokens ", o.num_tokens, " is out of range: expected 1..1000000");
  ZERONE_CHECK(std::isfinite(o.temperature) && o.temperature >= 0.0f, "--temperature ", o.temperature, " must be >= 0");
  ZERONE_CHECK(o.top_k >= 0, "--top-k ", o.top_k, " must be >= 0");
  // --init: a Hugging Face directory, a zerone checkpoint or an llm.c file (io/weight_source.h).
  io::WeightSource source(o.init, "--init");
  const std::string& spec = source.spec();
  if (!source.notice().empty()) std::fprintf(stderr, "zerone: notice: %s\n", source.notice().c_str());
  // The tokenizer before the model: its errors are cheaper to find first. A Hugging Face directory
  // that holds its tokenizer (tokenizer.json / tokenizer.model) decodes with it unless --tokenizer.
  std::string tokenizer_path = o.tokenizer.empty() ? source.tokenizer_dir() : o.tokenizer;
  std::unique_ptr<io::Tokenizer> tokenizer =
      tokenizer_path.empty() ? io::make_byte_tokenizer() : io::load_tokenizer(tokenizer_path);
  // The device before the model (Note [Models and their device] in nn/model.h); an unknown or
  // absent device is refused here, as training refuses it.
  check_device_settings(o.device, o.cuda_attention.empty() ? "" : "--cuda-attention");
  const kernels::DeviceKind device = kernels::device_or_default(o.device);
  kernels::DeviceOptions options;  // the defaults unless --cuda-attention is given
  if (!o.cuda_attention.empty()) options.cuda_attention = kernels::parse_cuda_attention(o.cuda_attention);
  kernels::Backend& backend = kernels::use_device(device, options);
  // Refuse a model that cannot fit before allocating it (as training does, Note [Refuse what cannot fit]).
  const DType dtype = resolve_precision(o.precision);
  std::unique_ptr<nn::Model> shape = nn::make_model(spec, dtype, 64, /*allocate=*/false);
  const int vocab = shape->vocab_size(), max_seq = shape->max_seq_len();
  // A tokenizer that was given (or found beside a Hugging Face model) must fit the vocabulary; the
  // default byte-level one decodes any model of up to 257 tokens (256 bytes, then end-of-text).
  const std::string tokenizer_source = o.tokenizer.empty() ? str_cat("the tokenizer of '", o.init, "'") : "--tokenizer";
  ZERONE_CHECK(tokenizer_path.empty() || tokenizer->vocab_size() <= vocab, tokenizer_source, ": ",
               tokenizer->description(), " has ", tokenizer->vocab_size(), " tokens, more than the model's vocabulary of ",
               vocab);
  auto decode = [&](int32_t t) { return tokenizer->decode(&t, 1); };
  ZERONE_CHECK(o.prompt.empty() || o.prompt_tokens.empty(), "--prompt and --prompt-tokens both given: expected one");
  const long double need = static_cast<long double>(shape->num_parameters()) * dtype_size(dtype) +
                           static_cast<long double>(shape->activation_bytes(1, max_seq));
  if (unified_memory(device)) {
    const long long available = available_memory_bytes();
    ZERONE_CHECK(available <= 0 || need <= available, "sampling from '", o.init, "' needs about ",
                 static_cast<double>(need) / (1 << 20), " MiB (parameters and activations), but this host has ",
                 available / (1 << 20), " MiB available");
  } else {
    // Note [Device budget] (train/plan.h): the GPU's free memory less what the ledger cannot see.
    const DeviceBudget cap = device_budget(device, 0, backend.device_memory());
    ZERONE_CHECK(cap.bytes <= 0 || need <= cap.bytes, "sampling from '", o.init, "' needs about ",
                 static_cast<double>(need) / (1 << 20), " MiB of ", kernels::device_kind_name(device),
                 " device memory (parameters and activations), over ", cap.source);
  }
  shape.reset();
  std::unique_ptr<nn::Model> model = nn::make_model(spec, dtype);
  source.load(*model);

  std::vector<int32_t> tokens = o.prompt_tokens;
  if (tokens.empty() && !o.prompt.empty()) {
    ZERONE_CHECK(tokenizer->can_encode(), "--prompt needs a tokenizer that encodes: ", tokenizer->description(),
                 " can only decode (pass --prompt-tokens, or a tokenizer.json / encoder.json)");
    ZERONE_CHECK(!tokenizer_path.empty() || vocab == io::kByteVocabSize || vocab == 256,
                 "--prompt without --tokenizer is encoded byte-level, but this model's vocabulary of ",
                 vocab, " is not byte-level: give --tokenizer (the one the training data was prepared with)");
    tokens = tokenizer->encode(o.prompt);
  }
  if (tokens.empty()) tokens.push_back(vocab > io::kByteEot ? io::kByteEot : 0);
  for (int32_t t : tokens)
    ZERONE_CHECK(t >= 0 && t < vocab, "prompt token ", t, " is out of range for vocabulary ", vocab);
  for (int32_t t : tokens) emit(decode(t));

  Rng rng(o.seed, 0x5a3b1e);
  std::vector<float> probs(vocab);
  for (int i = 0; i < o.num_tokens; ++i) {
    // The context is the last maxT tokens; recompute the forward over it (simple and exact).
    size_t ctx = std::min<size_t>(tokens.size(), max_seq);
    const int32_t* window = tokens.data() + tokens.size() - ctx;
    model->forward(window, nullptr, 1, static_cast<int>(ctx));
    // The logits of the last position (its first vocab elements count), from the device.
    const std::vector<float> logits_row = model->logits_to_host(ctx - 1, 1);
    const float* logits = logits_row.data();
    int32_t next = 0;
    if (o.temperature == 0.0f) {
      next = static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
    } else {
      float threshold = -INFINITY;
      if (o.top_k > 0 && o.top_k < vocab) {
        std::vector<float> sorted(logits, logits + vocab);
        std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
        threshold = sorted[o.top_k - 1];
      }
      float maxv = *std::max_element(logits, logits + vocab);
      double sum = 0.0;
      for (int v = 0; v < vocab; ++v) {
        probs[v] = logits[v] < threshold ? 0.0f : std::exp((logits[v] - maxv) / o.temperature);
        sum += probs[v];
      }
      double u = rng.uniform() * sum, acc = 0.0;
      next = vocab - 1;
      for (int v = 0; v < vocab; ++v) {
        acc += probs[v];
        if (u < acc) { next = v; break; }
      }
    }
    tokens.push_back(next);
    emit(decode(next));
  }
}

}  // namespace zerone::train
