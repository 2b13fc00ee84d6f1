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
  ZERONE_CHECK(out_prefix.back() != '/', "--out '", out_prefix, "' ends with '/': expected a prefix such as ",
               out_prefix, "corpus (the shards are PREFIX_train.bin and PREFIX_val.bin)");
  ZERONE_CHECK(val_fraction >= 0.0 && val_fraction <= 0.5, "--val-fraction ", val_fraction, " is out of range: expected 0..0.5");
  ZERONE_CHECK(tokenizer.can_encode(), "--tokenizer: ", tokenizer.description(), " cannot encode text");
  // Outputs first (Note [No late errors] in train/trainer.cc): both writable, neither an input.
  const std::string train_path = out_prefix + "_train.bin", val_path = out_prefix + "_val.bin";
  for (const std::string& out : {train_path, val_path}) {
    check_atomic_output(out, "--out");
    for (const std::string& in : text_files)
      ZERONE_CHECK(!same_file(out, in), "--out: '", out, "' is the --text file '", in, "': writing would destroy it");
  }
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
  r.val_path = val_path;
  r.train_path = train_path;
  r.val_tokens = n_val;
  r.train_tokens = tokens.size() - n_val;
  r.vocab_size = tokenizer.vocab_size();
  // Both shards or neither: a pair from two different corpora would silently mislead.
  const std::vector<int32_t> val(tokens.begin(), tokens.begin() + n_val), train(tokens.begin() + n_val, tokens.end());
  write_files_atomically({r.train_path, r.val_path}, [&](size_t i, std::FILE* f) {
    write_token_shard_body(f, i == 0 ? train : val, /*force_u32=*/false, i == 0 ? r.train_path : r.val_path);
  });
  return r;
}

}  // namespace zerone::io
