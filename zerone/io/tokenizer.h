// The byte-level tokenizer: token b (0..255) is byte b; token 256 is end-of-text, placed between
// documents. Lossless for any input. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zerone::io {

inline constexpr int kByteVocabSize = 257;
inline constexpr int32_t kByteEot = 256;

std::vector<int32_t> byte_encode(std::string_view text);
// Decodes ids < 256 as bytes; end-of-text becomes "\n<|endoftext|>\n"; other ids become "<?id>".
std::string byte_decode(const int32_t* tokens, size_t n);

}  // namespace zerone::io

namespace zerone::io {

// llm.c's GPT-2 tokenizer file (magic 20240328, version 1 or 2), for decoding model output:
// a header of 256 uint32 ([2] vocab size, [3] end-of-text id in version 2), then per token a
// uint8 length and that many bytes. Encoding GPT-2 BPE is not supported (no merges in the file).
class LlmcTokenizer {
 public:
  // Throws Error naming the path for a missing, truncated or malformed file.
  explicit LlmcTokenizer(const std::string& path);
  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  std::string decode(const int32_t* tokens, size_t n) const;

 private:
  std::vector<std::string> pieces_;
  int eot_ = -1;
};

}  // namespace zerone::io
