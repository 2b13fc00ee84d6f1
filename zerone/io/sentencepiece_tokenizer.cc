// SentencePiece models through Debian's libsentencepiece (Note: we wrap, not reimplement: the
// unigram/BPE segmentation and normalization rules are the library's).
#include <sentencepiece_processor.h>

#include "zerone/core/error.h"
#include "zerone/io/bpe_tokenizer.h"
#include "zerone/io/file.h"

namespace zerone::io {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    open_regular_file(path, "--tokenizer");  // the type checks (no FIFO, no directory)
    const auto status = processor_.Load(path);
    ZERONE_CHECK(status.ok(), "--tokenizer: '", path, "' is neither a tokenizer.json, an encoder.json, an llm.c ",
                 "tokenizer nor a SentencePiece model (", status.ToString(), ")");
  }
  std::string description() const override { return "SentencePiece model '" + path_ + "'"; }
  int vocab_size() const override { return processor_.GetPieceSize(); }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    ZERONE_CHECK(status.ok(), "SentencePiece '", path_, "' cannot encode: ", status.ToString());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  std::string decode(const int32_t* tokens, size_t n) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      std::string text;
      if (!run.empty() && processor_.Decode(run, &text).ok()) out += text;
      run.clear();
    };
    for (size_t i = 0; i < n; ++i) {
      if (tokens[i] < 0 || tokens[i] >= vocab_size()) {
        flush();
        out += str_cat("<?", tokens[i], ">");
      } else {
        run.push_back(tokens[i]);
      }
    }
    flush();
    return out;
  }
  DocumentBoundary document_boundary() const override { return {processor_.bos_id(), true}; }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace zerone::io
