#include "zerone/io/prepare.h"

#include "zerone/core/error.h"
#include "zerone/io/file.h"
#include "zerone/io/token_shards.h"
#include "zerone/io/tokenizer.h"

namespace zerone::io {

PrepareResult prepare_text_shards(const std::vector<std::string>& text_files, const std::string& out_prefix,
                                  double val_fraction, const Tokenizer& tokenizer) {
  ZERONE_CHECK(!text_files.empty(), "--text: at least one text file is required");
  ZERONE_CHECK(!out_prefix.empty(), "--out PREFIX is required");
  ZERONE_CHECK(val_fraction >= 0.0 && val_fraction <= 0.5, "--val-fraction ", val_fraction, " is out of range: expected 0..0.5");
  ZERONE_CHECK(tokenizer.can_encode(), "--tokenizer: ", tokenizer.description(), " cannot encode text");
  const DocumentBoundary boundary = tokenizer.document_boundary();
  std::vector<int32_t> tokens;
  for (const std::string& path : text_files) {
    std::vector<int32_t> doc = tokenizer.encode(read_text_file(path, "--text"));
    if (boundary.id >= 0 && (boundary.before_first || !tokens.empty())) tokens.push_back(boundary.id);
    tokens.insert(tokens.end(), doc.begin(), doc.end());
  }
  ZERONE_CHECK(tokens.size() >= 2, "--text: the input holds ", tokens.size(), " tokens; nothing to train on");
  size_t n_val = static_cast<size_t>(val_fraction * static_cast<double>(tokens.size()));
  PrepareResult r;
  r.val_path = out_prefix + "_val.bin";
  r.train_path = out_prefix + "_train.bin";
  r.val_tokens = n_val;
  r.train_tokens = tokens.size() - n_val;
  r.vocab_size = tokenizer.vocab_size();
  write_token_shard(r.val_path, std::vector<int32_t>(tokens.begin(), tokens.begin() + n_val));
  write_token_shard(r.train_path, std::vector<int32_t>(tokens.begin() + n_val, tokens.end()));
  return r;
}

}  // namespace zerone::io
