// `zerone prepare`: text files -> llm.c token shards with the byte-level tokenizer.
// Each file is one document (end-of-text between documents). The first `val_fraction` of the
// token stream becomes PREFIX_val.bin, the rest PREFIX_train.bin (as llm.c's tinyshakespeare).
#pragma once

#include <string>
#include <vector>

namespace zerone::io {

struct PrepareResult {
  std::string train_path, val_path;
  size_t train_tokens = 0, val_tokens = 0;
};

// Throws Error for unreadable inputs, an empty corpus or a val_fraction outside [0, 0.5].
PrepareResult prepare_text_shards(const std::vector<std::string>& text_files, const std::string& out_prefix,
                                  double val_fraction);

}  // namespace zerone::io
