#include "zerone/io/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>

#include "zerone/core/error.h"
#include "zerone/io/file.h"

namespace zerone::io {
namespace {

using json = nlohmann::json;

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Note [Byte alphabet]: GPT-2 maps each byte to a printable code point so that vocabulary entries
// are readable strings: bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF map to themselves, the other 68
// bytes to 256, 257, ... in byte order. No byte maps to U+0020, so "a b" separates a merge pair.
struct ByteAlphabet {
  std::string symbol[256];                       // byte -> UTF-8 of its code point
  std::unordered_map<std::string, uint8_t> byte;  // inverse
  ByteAlphabet() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      append_utf8(symbol[b], printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + next++));
      byte[symbol[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

// The code points of a UTF-8 string, as separate UTF-8 strings (symbols of the byte alphabet).
std::vector<std::string> split_code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0xF0) len = 4;
    else if (c >= 0xE0) len = 3;
    else if (c >= 0xC0) len = 2;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

json parse_json_file(const std::string& path, const char* what) {
  try {
    return json::parse(read_text_file(path, what));
  } catch (const json::exception& e) {
    throw Error(str_cat(what, " '", path, "' is not valid JSON: ", e.what()));
  }
}

}  // namespace

struct BpeTokenizer::Pattern {
  pcre2_code* code = nullptr;
  ~Pattern() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::init(const std::string& pattern, const std::string& source) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pattern_ = std::make_unique<Pattern>();
  pattern_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code, &error_offset, nullptr);
  if (pattern_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof message);
    throw Error(str_cat("tokenizer '", source, "': pre-tokenizer pattern does not compile at offset ", error_offset, ": ",
                        reinterpret_cast<const char*>(message)));
  }
  int max_id = -1;
  for (const auto& [symbol, id] : vocab_) max_id = std::max(max_id, id);
  for (const auto& [text, id] : added_) max_id = std::max(max_id, id);
  vocab_size_ = max_id + 1;
  id_to_symbol_.assign(vocab_size_, std::string());
  is_added_.assign(vocab_size_, false);
  for (const auto& [symbol, id] : vocab_) id_to_symbol_[id] = symbol;
  for (const auto& [text, id] : added_) {
    id_to_symbol_[id] = text;
    is_added_[id] = true;
  }
  // Longest first, so that overlapping special tokens match greedily.
  std::sort(added_.begin(), added_.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const char* name : {"<|endoftext|>", "<|begin_of_text|>"}) {
    for (const auto& [text, id] : added_)
      if (text == name && end_of_text_ < 0) end_of_text_ = id;
    if (end_of_text_ < 0)
      if (auto it = vocab_.find(name); it != vocab_.end()) end_of_text_ = it->second;
  }
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_encoder_json(const std::string& encoder_path,
                                                              const std::string& vocab_bpe_path) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  json encoder = parse_json_file(encoder_path, "tokenizer");
  ZERONE_CHECK(encoder.is_object() && !encoder.empty(), "tokenizer '", encoder_path,
               "' is not an encoder.json (an object of token -> id)");
  for (auto& [symbol, id] : encoder.items()) {
    ZERONE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1 << 24), "tokenizer '",
                 encoder_path, "': token ", json(symbol).dump(), " has id ", id.dump(), ", expected 0..16777215");
    t->vocab_[symbol] = id.get<int32_t>();
  }
  const std::string bpe = read_text_file(vocab_bpe_path, "tokenizer");
  size_t pos = 0, line_no = 0;
  int rank = 0;
  while (pos < bpe.size()) {
    size_t end = bpe.find('\n', pos);
    if (end == std::string::npos) end = bpe.size();
    std::string line = bpe.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    size_t space = line.find(' ');
    ZERONE_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                     line.find(' ', space + 1) == std::string::npos,
                 "tokenizer '", vocab_bpe_path, "' line ", line_no, ": expected a merge 'A B'");
    t->merge_rank_.emplace(std::make_pair(line.substr(0, space), line.substr(space + 1)), rank++);
  }
  if (auto it = t->vocab_.find("<|endoftext|>"); it != t->vocab_.end()) {
    t->added_.emplace_back("<|endoftext|>", it->second);
    t->vocab_.erase(it);
  }
  t->description_ = str_cat("GPT-2 BPE from '", encoder_path, "' + '", vocab_bpe_path, "'");
  t->init(kGpt2Pattern, encoder_path);
  return t;
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_tokenizer_json(const std::string& path) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  json root = parse_json_file(path, "tokenizer");
  auto bad = [&](const std::string& what) { return Error(str_cat("tokenizer '", path, "': ", what)); };
  if (!root.is_object() || !root.contains("model") || !root["model"].is_object()) throw bad("no \"model\" object (not a tokenizer.json?)");
  const json& model = root["model"];
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") throw bad(str_cat("model type '", type, "' is not supported, expected BPE (byte-level)"));
  if (!model.contains("vocab") || !model["vocab"].is_object()) throw bad("model.vocab is not an object");
  for (auto& [symbol, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24))
      throw bad(str_cat("model.vocab entry ", json(symbol).dump(), " has id ", id.dump(), ", expected 0..16777215"));
    t->vocab_[symbol] = id.get<int32_t>();
  }
  if (!model.contains("merges") || !model["merges"].is_array()) throw bad("model.merges is not a list");
  int rank = 0;
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      size_t space = s.find(' ');
      if (space == std::string::npos) throw bad(str_cat("merge ", m.dump(), " is not 'A B'"));
      t->merge_rank_.emplace(std::make_pair(s.substr(0, space), s.substr(space + 1)), rank++);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      t->merge_rank_.emplace(std::make_pair(m[0].get<std::string>(), m[1].get<std::string>()), rank++);
    } else {
      throw bad(str_cat("merge ", m.dump(), " is neither 'A B' nor [A, B]"));
    }
  }
  t->ignore_merges_ = model.value("ignore_merges", false);
  if (root.contains("added_tokens") && root["added_tokens"].is_array())
    for (const json& a : root["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["id"].is_number_integer() ||
          !a["content"].is_string())
        throw bad(str_cat("added_tokens entry ", a.dump(), " lacks an integer id or a string content"));
      t->added_.emplace_back(a["content"].get<std::string>(), a["id"].get<int32_t>());
      t->vocab_.erase(a["content"].get<std::string>());
    }
  // Pre-tokenizer: ByteLevel (GPT-2 pattern unless use_regex is false) or Sequence[Split, ByteLevel].
  std::string pattern;
  const json pre = root.contains("pre_tokenizer") ? root["pre_tokenizer"] : json();
  auto byte_level = [&](const json& p, bool regex_default) {
    if (p.value("add_prefix_space", false)) t->add_prefix_space_ = true;
    if (p.value("use_regex", regex_default)) pattern = kGpt2Pattern;
  };
  if (pre.is_object() && pre.value("type", "") == "ByteLevel") {
    byte_level(pre, true);
  } else if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers")) {
    for (const json& p : pre["pretokenizers"]) {
      const std::string ptype = p.value("type", "");
      if (ptype == "Split") {
        if (!p.contains("pattern") || !p["pattern"].is_object() || !p["pattern"].contains("Regex"))
          throw bad("Split pre-tokenizer without a Regex pattern is not supported");
        if (p.value("behavior", "Isolated") != "Isolated" || p.value("invert", false))
          throw bad("Split pre-tokenizer behaviour other than Isolated is not supported");
        pattern = p["pattern"]["Regex"].get<std::string>();
      } else if (ptype == "ByteLevel") {
        byte_level(p, false);
      } else {
        throw bad(str_cat("pre-tokenizer '", ptype, "' is not supported (expected Split and ByteLevel)"));
      }
    }
  } else {
    throw bad(str_cat("pre_tokenizer ", pre.dump().substr(0, 80), " is not supported: expected ByteLevel (byte-level BPE)"));
  }
  if (pattern.empty()) throw bad("the pre-tokenizer has no splitting pattern");
  t->description_ = str_cat("byte-level BPE from '", path, "'");
  t->init(pattern, path);
  return t;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const ByteAlphabet& alphabet = byte_alphabet();
  std::vector<std::string> symbols;
  symbols.reserve(piece.size());
  std::string whole;
  for (unsigned char c : piece) {
    symbols.push_back(alphabet.symbol[c]);
    whole += alphabet.symbol[c];
  }
  if (ignore_merges_)
    if (auto it = vocab_.find(whole); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  // Merge the lowest-ranked adjacent pair, every occurrence left to right, until none is a merge.
  while (symbols.size() > 1) {
    int best = INT_MAX;
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_rank_.find({symbols[i], symbols[i + 1]});
      if (it != merge_rank_.end() && it->second < best) best = it->second, best_i = i;
    }
    if (best == INT_MAX) break;
    const std::string first = symbols[best_i], second = symbols[best_i + 1];
    std::vector<std::string> merged;
    merged.reserve(symbols.size());
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == first && symbols[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(std::move(symbols[i]));
        ++i;
      }
    }
    symbols = std::move(merged);
  }
  for (const std::string& s : symbols) {
    auto it = vocab_.find(s);
    ZERONE_CHECK(it != vocab_.end(), description_, ": symbol ", json(s).dump(), " is not in the vocabulary (the merges and ",
                 "the vocabulary disagree)");
    out.push_back(it->second);
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view input) const {
  std::string owned;
  if (add_prefix_space_ && !input.empty() && input.front() != ' ') {
    owned = " " + std::string(input);
    input = owned;
  }
  std::vector<int32_t> out;
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(pattern_->code, nullptr);
  ZERONE_CHECK(match != nullptr, "out of memory creating a regex match block");
  // Splits `text` (no added tokens inside) into pre-tokens; bytes no pattern branch matches
  // (invalid UTF-8) become pieces of their own, so nothing is lost.
  auto split = [&](std::string_view text) {
    size_t pos = 0;
    while (pos < text.size()) {
      int rc = pcre2_match(pattern_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0, match, nullptr);
      if (rc < 0) {
        encode_piece(text.substr(pos), out);
        return;
      }
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
      size_t begin = ov[0], end = ov[1];
      if (begin > pos) encode_piece(text.substr(pos, begin - pos), out);
      if (end == begin) {  // an empty match: step over one byte
        encode_piece(text.substr(begin, 1), out);
        pos = begin + 1;
        continue;
      }
      encode_piece(text.substr(begin, end - begin), out);
      pos = end;
    }
  };
  size_t pos = 0;
  while (pos < input.size()) {
    // The earliest added token at or after pos (longest first at equal positions).
    size_t best = std::string_view::npos;
    const std::pair<std::string, int32_t>* token = nullptr;
    for (const auto& a : added_) {
      size_t at = input.find(a.first, pos);
      if (at != std::string_view::npos && (at < best)) best = at, token = &a;
    }
    if (token == nullptr) {
      split(input.substr(pos));
      break;
    }
    split(input.substr(pos, best - pos));
    out.push_back(token->second);
    pos = best + token->first.size();
  }
  pcre2_match_data_free(match);
  return out;
}

std::string BpeTokenizer::decode(const int32_t* tokens, size_t n) const {
  const ByteAlphabet& alphabet = byte_alphabet();
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    int32_t id = tokens[i];
    if (id < 0 || id >= vocab_size_ || (id_to_symbol_[id].empty() && !is_added_[id])) {
      out += str_cat("<?", id, ">");
    } else if (is_added_[id]) {
      out += id_to_symbol_[id];
    } else {
      for (const std::string& cp : split_code_points(id_to_symbol_[id])) {
        auto it = alphabet.byte.find(cp);
        if (it != alphabet.byte.end()) out.push_back(static_cast<char>(it->second));
        else out += cp;  // not a byte symbol: keep as is
      }
    }
  }
  return out;
}

}  // namespace zerone::io
