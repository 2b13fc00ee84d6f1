#include "zerone/io/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "zerone/core/error.h"
#include "zerone/io/bpe_tokenizer.h"
#include "zerone/io/file.h"

namespace zerone::io {

std::vector<int32_t> byte_encode(std::string_view text) {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string byte_decode(const int32_t* tokens, size_t n) {
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    int32_t t = tokens[i];
    if (t >= 0 && t < 256) out.push_back(static_cast<char>(t));
    else if (t == kByteEot) out += "\n<|endoftext|>\n";
    else out += str_cat("<?", t, ">");
  }
  return out;
}

namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::string description() const override { return "byte-level"; }
  int vocab_size() const override { return kByteVocabSize; }
  std::vector<int32_t> encode(std::string_view text) const override { return byte_encode(text); }
  std::string decode(const int32_t* tokens, size_t n) const override { return byte_decode(tokens, n); }
  DocumentBoundary document_boundary() const override { return {kByteEot, false}; }
};

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string sibling(const std::string& path, const std::string& name) {
  size_t slash = path.rfind('/');
  return (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + name;
}

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  struct stat st;
  ZERONE_CHECK(::stat(path.c_str(), &st) == 0, "--tokenizer: cannot open '", path, "': ", std::strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    for (const char* name : {"tokenizer.json", "tokenizer.model"})
      if (is_file(path + "/" + name)) return load_tokenizer(path + "/" + name);
    if (is_file(path + "/encoder.json")) return load_tokenizer(path + "/encoder.json");
    throw Error(str_cat("--tokenizer: directory '", path, "' holds no tokenizer.json, tokenizer.model or encoder.json"));
  }
  // Sniff the first bytes: JSON, an llm.c tokenizer (magic 20240328), else SentencePiece (protobuf).
  size_t size = 0;
  FileDescriptor fd = open_regular_file(path, "--tokenizer", &size);
  char head[4] = {};
  read_exactly(fd.get(), head, std::min<size_t>(size, 4), 0, path);
  size_t i = 0;
  while (i < 4 && i < size && std::isspace(static_cast<unsigned char>(head[i]))) ++i;
  if (i < size && i < 4 && head[i] == '{') {
    // encoder.json has vocab.bpe beside it and no "model" key; tokenizer.json has "model".
    const std::string bpe = sibling(path, "vocab.bpe");
    if (path.size() >= 12 && path.compare(path.size() - 12, 12, "encoder.json") == 0) {
      ZERONE_CHECK(is_file(bpe), "--tokenizer: '", path, "' is an encoder.json but '", bpe, "' (its merges) is missing");
      return BpeTokenizer::from_encoder_json(path, bpe);
    }
    return BpeTokenizer::from_tokenizer_json(path);
  }
  uint32_t magic = 0;
  std::memcpy(&magic, head, std::min<size_t>(size, 4));
  if (size >= 4 && magic == 20240328u) return std::make_unique<LlmcTokenizer>(path);
  return load_sentencepiece(path);
}

}  // namespace zerone::io

#include <cstring>

#include "zerone/io/file.h"

namespace zerone::io {

LlmcTokenizer::LlmcTokenizer(const std::string& path) : path_(path) {
  MappedFile file(path);
  const size_t header_bytes = 256 * sizeof(uint32_t);
  ZERONE_CHECK(file.size() >= header_bytes, "tokenizer '", path, "' is truncated: ", file.size(), " bytes");
  uint32_t h[256];
  std::memcpy(h, file.data(), header_bytes);
  ZERONE_CHECK(h[0] == 20240328u, "'", path, "' is not an llm.c tokenizer: magic ", h[0], ", expected 20240328");
  ZERONE_CHECK(h[1] == 1 || h[1] == 2, "tokenizer '", path, "': version ", h[1], ", expected 1 or 2");
  ZERONE_CHECK(h[2] > 0 && h[2] <= (1u << 24), "tokenizer '", path, "': implausible vocabulary size ", h[2]);
  if (h[1] == 2) eot_ = static_cast<int>(h[3]);
  size_t pos = header_bytes;
  pieces_.reserve(h[2]);
  for (uint32_t i = 0; i < h[2]; ++i) {
    ZERONE_CHECK(pos < file.size(), "tokenizer '", path, "' is truncated at token ", i, " of ", h[2]);
    size_t len = file.data()[pos++];
    ZERONE_CHECK(pos + len <= file.size(), "tokenizer '", path, "' is truncated at token ", i, " of ", h[2]);
    pieces_.emplace_back(reinterpret_cast<const char*>(file.data() + pos), len);
    pos += len;
  }
}

std::vector<int32_t> LlmcTokenizer::encode(std::string_view) const {
  throw Error(str_cat("tokenizer '", path_, "' is an llm.c tokenizer file, which can only decode (it has no merges); ",
                      "give a tokenizer.json or encoder.json + vocab.bpe to encode"));
}

std::string LlmcTokenizer::decode(const int32_t* tokens, size_t n) const {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    int32_t t = tokens[i];
    if (t == eot_) out += "\n<|endoftext|>\n";
    else if (t >= 0 && t < vocab_size()) out += pieces_[t];
    else out += str_cat("<?", t, ">");
  }
  return out;
}

}  // namespace zerone::io
