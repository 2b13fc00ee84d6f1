#include "zerone/io/tokenizer.h"

#include "zerone/core/error.h"

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

}  // namespace zerone::io

#include <cstring>

#include "zerone/io/file.h"

namespace zerone::io {

LlmcTokenizer::LlmcTokenizer(const std::string& path) {
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
