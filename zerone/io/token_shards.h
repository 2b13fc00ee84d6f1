// llm.c token shards and the batch loader.
//
// Shard format (llm.c): a header of 256 int32 — [0] magic, [1] version, [2] number of tokens —
// then the tokens: magic 20240520 version 1 stores uint16 tokens; magic 20240801 version 7 stores
// uint32 tokens. A dataset is the concatenation, in sorted path order, of every file matching a glob.
//
// Batches (DESIGN §4, issue 2; Note [Samples] in train/batch_source.h): the loader addresses
// samples, sequences of T+1 tokens; sample i of an epoch starts at token i*T of the concatenation,
// with (tokens - 1) / T samples per epoch. A micro-batch is B consecutive sample indices of the
// endless stream (sample j is sample j mod n of epoch j / n); its inputs are the first T tokens of
// each sample, the targets the same shifted by one. Without shuffling, micro-batch s of B samples
// is the chunk of B*T+1 tokens at token s*B*T, as llm.c reads step s (llm.c starts its next epoch
// at the first chunk that does not fit; here the stream wraps by samples, so the samples of an
// epoch do not depend on B). With shuffling, the samples of each epoch are visited in a
// permutation drawn from (seed, epoch). Every token id is checked against the vocabulary when
// read, and the trainer scans every token once at start-up (find_token_outside) so a bad id is
// found before the first step.
//
// Note [No mmap for data]: shards are read with pread, not mapped. A mapped file that shrinks or is
// truncated under a running job kills it with SIGBUS; a short pread is an Error naming the file.
// A shard replaced by rename keeps being read from the file that was opened.
//
// Thread-safety: a TokenDataset is immutable after construction and may be shared (pread needs no
// file position); a DataLoader caches the current epoch's permutation and is for one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zerone/io/file.h"

namespace zerone::io {

inline constexpr int32_t kShardMagicU16 = 20240520;  // version 1, uint16 tokens
inline constexpr int32_t kShardMagicU32 = 20240801;  // version 7, uint32 tokens
inline constexpr size_t kShardHeaderInts = 256;

// A sequence of token ids addressed by position. Implementations are immutable once built.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual size_t num_tokens() const = 0;
  // Copies tokens [offset, offset+count) into out, checking each < vocab_size (Error naming where
  // the bad token is otherwise). Requires offset + count <= num_tokens().
  virtual void read(size_t offset, size_t count, int32_t* out, int vocab_size) const = 0;
  // The position of the first token in [begin, end) whose id is >= vocab_size, if any.
  virtual std::optional<size_t> find_token_outside(int vocab_size, size_t begin, size_t end) const = 0;
  // "token 70000 at position 12 of 'x.bin'": where the token at global `position` is and what it holds.
  virtual std::string describe(size_t position) const = 0;
};

// Tokens held in memory (the built-in corpus, tests).
class InMemoryTokens : public TokenSource {
 public:
  explicit InMemoryTokens(std::vector<int32_t> tokens, std::string name = "in-memory tokens")
      : tokens_(std::move(tokens)), name_(std::move(name)) {}
  size_t num_tokens() const override { return tokens_.size(); }
  void read(size_t offset, size_t count, int32_t* out, int vocab_size) const override;
  std::optional<size_t> find_token_outside(int vocab_size, size_t begin, size_t end) const override;
  std::string describe(size_t position) const override;

 private:
  std::vector<int32_t> tokens_;
  std::string name_;
};

class TokenDataset : public TokenSource {
 public:
  // Opens every file matching `pattern`. Throws Error for no match, bad magic or version, or a
  // size that disagrees with the header's token count. `what` names the flag for messages.
  explicit TokenDataset(const std::string& pattern, const std::string& what = "--data");

  size_t num_tokens() const override { return total_tokens_; }
  size_t num_files() const { return files_.size(); }
  void read(size_t offset, size_t count, int32_t* out, int vocab_size) const override;
  std::optional<size_t> find_token_outside(int vocab_size, size_t begin, size_t end) const override;
  std::string describe(size_t position) const override;

 private:
  struct Shard {
    std::string path;
    FileDescriptor fd;
    size_t first_token;  // position of this shard's first token in the concatenation
    size_t num_tokens;
    int bytes_per_token;
  };
  // Index of the shard holding global token `position` (< num_tokens()).
  size_t shard_of(size_t position) const;
  // Reads `count` raw tokens of `shard` from its token `local` on, widened to uint32.
  void read_raw(const Shard& shard, size_t local, size_t count, uint32_t* out) const;
  std::vector<Shard> files_;
  size_t total_tokens_ = 0;
};

// Writes tokens as one llm.c shard (atomically). Version 1 (uint16) when every id < 65536 and
// `force_u32` is false, else version 7 (uint32).
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, bool force_u32 = false);
// The same into an open file (for writers of several files at once, write_files_atomically).
void write_token_shard_body(std::FILE* f, const std::vector<int32_t>& tokens, bool force_u32, const std::string& path);

class DataLoader {
 public:
  // B, T > 0. Throws Error when the dataset holds fewer than B*T+1 tokens.
  DataLoader(const TokenSource& data, int B, int T, int vocab_size, bool shuffle, uint64_t seed);
  // Fills inputs (B,T) and targets (B,T) from samples first_sample .. first_sample+B-1 of the
  // endless stream (any non-negative index; wraps by epoch, a micro-batch may straddle two).
  void load(uint64_t first_sample, int32_t* inputs, int32_t* targets);
  uint64_t samples_per_epoch() const { return num_samples_; }
  // Whole micro-batches of B samples in one epoch (>= 1): an evaluation pass.
  uint64_t batches_per_epoch() const { return num_samples_ / static_cast<uint64_t>(B_); }

 private:
  // Token offset of sample `sample` of the stream.
  uint64_t sample_start(uint64_t sample);

  const TokenSource& data_;
  int B_, T_, vocab_size_;
  bool shuffle_;
  uint64_t seed_;
  uint64_t num_samples_;
  int64_t perm_epoch_ = -1;
  std::vector<uint64_t> perm_;  // shuffled: the current epoch's sample order
  std::vector<int32_t> buffer_;
};

}  // namespace zerone::io
