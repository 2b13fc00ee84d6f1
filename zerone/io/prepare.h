// `zerone prepare`: text files -> llm.c token shards with a tokenizer (tokenizer.h; byte-level by
// default). Each file is one document, marked as the tokenizer's DocumentBoundary says (GPT-2:
// <|endoftext|> before each document, as llm.c's data scripts; SentencePiece: BOS; byte-level:
// end-of-text between documents). The first `val_fraction` of the token stream becomes
// PREFIX_val.bin, the rest PREFIX_train.bin (as llm.c's tinyshakespeare); uint16 shards when every
// id fits, else uint32.
#pragma once

#include <string>
#include <vector>

#include "zerone/io/tokenizer.h"

namespace zerone::io {

struct PrepareResult {
  std::string train_path, val_path;
  size_t train_tokens = 0, val_tokens = 0;
  int vocab_size = 0;  // the tokenizer's: the smallest vocabulary a model training on the shards needs
};

// Throws Error for unreadable inputs, an empty corpus or a val_fraction outside [0, 0.5].
PrepareResult prepare_text_shards(const std::vector<std::string>& text_files, const std::string& out_prefix,
                                  double val_fraction, const Tokenizer& tokenizer);

}  // namespace zerone::io
