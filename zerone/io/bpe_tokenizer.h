// Byte-level BPE (GPT-2, and the tokenizer.json of LLaMA-3 style models).
//
// Encoding: the text is split by the pre-tokenizer's regular expression (GPT-2's
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ unless tokenizer.json
// gives a Split pattern; matched with PCRE2 in UTF + Unicode-property mode, invalid UTF-8
// tolerated), each piece's bytes are mapped to GPT-2's printable byte alphabet (bytes_to_unicode),
// and the merges are applied lowest rank first until none applies; each resulting symbol is a
// vocabulary entry. Added/special tokens (tokenizer.json added_tokens, e.g. <|endoftext|>) are
// matched verbatim in the text first. Decoding maps symbols back to bytes, so
// decode(encode(x)) == x for any byte string.
//
// Thread-safety: immutable after construction; encode uses per-call PCRE2 match data.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "zerone/io/tokenizer.h"

namespace zerone::io {

class BpeTokenizer : public Tokenizer {
 public:
  // From a Hugging Face tokenizer.json (model.type "BPE", pre_tokenizer ByteLevel or a Sequence
  // of Split + ByteLevel). Throws Error naming the file and the unsupported or malformed part.
  static std::unique_ptr<BpeTokenizer> from_tokenizer_json(const std::string& path);
  // From OpenAI's encoder.json + vocab.bpe (GPT-2); <|endoftext|> is the end-of-text token.
  static std::unique_ptr<BpeTokenizer> from_encoder_json(const std::string& encoder_path, const std::string& vocab_bpe_path);
  ~BpeTokenizer() override;

  std::string description() const override { return description_; }
  int vocab_size() const override { return vocab_size_; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const int32_t* tokens, size_t n) const override;
  DocumentBoundary document_boundary() const override { return {end_of_text_, true}; }

 private:
  BpeTokenizer() = default;
  // Finishes construction: compiles the pattern, builds reverse maps. Throws Error on a bad pattern.
  void init(const std::string& pattern, const std::string& source);
  // Appends the ids of one pre-tokenized piece (raw bytes).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::string description_;
  std::unordered_map<std::string, int32_t> vocab_;     // symbol (byte alphabet, UTF-8) -> id
  std::vector<std::string> id_to_symbol_;
  std::map<std::pair<std::string, std::string>, int> merge_rank_;
  std::vector<std::pair<std::string, int32_t>> added_;  // special tokens matched verbatim
  std::vector<bool> is_added_;
  int32_t end_of_text_ = -1;
  int vocab_size_ = 0;
  bool ignore_merges_ = false;     // tokenizer.json: a piece found whole in the vocabulary is one token
  bool add_prefix_space_ = false;  // ByteLevel add_prefix_space
  struct Pattern;
  std::unique_ptr<Pattern> pattern_;
};

// The SentencePiece model at `path` (Debian's libsentencepiece). Throws Error naming the path.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);

}  // namespace zerone::io
