// Tokenizers: text <-> token ids, for `zerone prepare` (encoding corpora into token shards) and
// `zerone sample` (encoding prompts, decoding output).
//
//  - byte-level (no file): token b (0..255) is byte b, token 256 is end-of-text between documents.
//    Lossless for any input.
//  - GPT-2 byte-level BPE (bpe_tokenizer.h): a Hugging Face tokenizer.json (model type BPE with a
//    ByteLevel pre-tokenizer, GPT-2 or LLaMA-3 style), or OpenAI's encoder.json + vocab.bpe.
//  - SentencePiece (a .model file, e.g. LLaMA-2's tokenizer.model), through Debian's libsentencepiece.
//  - llm.c's GPT-2 tokenizer file (magic 20240328): decode only (it has no merges).
//
// Thread-safety: a loaded Tokenizer is immutable; encode and decode may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zerone::io {

inline constexpr int kByteVocabSize = 257;
inline constexpr int32_t kByteEot = 256;

std::vector<int32_t> byte_encode(std::string_view text);
// Decodes ids < 256 as bytes; end-of-text becomes "\n<|endoftext|>\n"; other ids become "<?id>".
std::string byte_decode(const int32_t* tokens, size_t n);

// Where documents are marked in a token stream: `id` before each document (llm.c's GPT-2 shards
// start every document with <|endoftext|>; SentencePiece models with BOS), or only between
// documents (the byte-level tokenizer, for compatibility with existing shards).
struct DocumentBoundary {
  int32_t id = -1;  // -1: none
  bool before_first = true;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "byte-level", "GPT-2 BPE from 'tokenizer.json'", ...
  virtual std::string description() const = 0;
  // One more than the largest id this tokenizer produces or decodes.
  virtual int vocab_size() const = 0;
  virtual bool can_encode() const { return true; }
  // Throws Error if the tokenizer cannot encode (llm.c tokenizer files).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids outside the vocabulary decode as "<?id>"; special tokens as their text.
  virtual std::string decode(const int32_t* tokens, size_t n) const = 0;
  virtual DocumentBoundary document_boundary() const = 0;
};

// The byte-level tokenizer.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Loads the tokenizer at `path`, detected from the file: a directory (its tokenizer.json, else
// tokenizer.model, else encoder.json + vocab.bpe), a *.json file (tokenizer.json format, or
// encoder.json with vocab.bpe beside it), a SentencePiece model (protobuf), or an llm.c tokenizer
// file. Throws Error naming the path and what was expected for anything else or a malformed file.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// llm.c's GPT-2 tokenizer file (magic 20240328, version 1 or 2), for decoding model output:
// a header of 256 uint32 ([2] vocab size, [3] end-of-text id in version 2), then per token a
// uint8 length and that many bytes. Encoding is not supported (no merges in the file).
class LlmcTokenizer : public Tokenizer {
 public:
  // Throws Error naming the path for a missing, truncated or malformed file.
  explicit LlmcTokenizer(const std::string& path);
  std::string description() const override { return "llm.c tokenizer '" + path_ + "' (decode only)"; }
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  bool can_encode() const override { return false; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const int32_t* tokens, size_t n) const override;
  DocumentBoundary document_boundary() const override { return {eot_, true}; }

 private:
  std::string path_;
  std::vector<std::string> pieces_;
  int eot_ = -1;
};

}  // namespace zerone::io
