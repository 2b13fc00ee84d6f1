// Text generation from a trained model (`zerone sample`). Thread-safety: one call at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zerone::train {

struct SampleOptions {
  std::string init;                    // llm.c checkpoint or Hugging Face model directory (required)
  std::string prompt;                  // text, encoded with the tokenizer (byte-level: a vocab-256/257 model)
  std::vector<int32_t> prompt_tokens;  // or token ids directly (not both)
  std::string tokenizer;               // any tokenizer load_tokenizer reads (io/tokenizer.h); empty: the HF
                                       // directory's own tokenizer if it has one, else byte-level
  int num_tokens = 256;
  float temperature = 1.0f;            // 0: greedy
  int top_k = 0;                       // 0: no truncation
  uint64_t seed = 1337;
  std::string precision;               // empty: as training would choose
  std::string device;                  // cpu | sim | cuda (--device); empty: as training would choose
  std::string cuda_attention;          // flash | plain (--cuda-attention, for cuda); empty: flash
};

// Generates and streams decoded text to `emit` as it goes: the model and its forward on the
// device (`device`, chosen as training chooses it), the sampling on the host from the last
// position's logits copied through the backend, so every device gives the same text where its
// logits are the same bits (cpu and sim always). Throws Error for bad input, a device this machine
// lacks, or a model that cannot fit the device (or the host, for cpu and sim).
void sample(const SampleOptions& options, const std::function<void(const std::string&)>& emit);

}  // namespace zerone::train
