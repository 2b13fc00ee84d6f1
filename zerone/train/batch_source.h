// Where the trainer's micro-batches come from (Note [Batches] in nn/model.h): a BatchSource turns a
// chunk index into an nn::Batch. Token shards (io::DataLoader) and image datasets (io/idx.h) are
// the two kinds; the trainer's step loop sees only this interface.
//
// The global-batch rule: micro-step k of step s on rank r reads chunk (s*accum + k)*world + r, so
// every world size and accumulation split with the same global batch trains on the same samples.
//
// Thread-safety: one thread. A returned Batch borrows the source's buffers until the next load().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zerone/io/idx.h"
#include "zerone/io/token_shards.h"
#include "zerone/nn/model.h"

namespace zerone::train {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Chunk `chunk` (any non-negative index; a source wraps by epoch).
  virtual nn::Batch load(uint64_t chunk) = 0;
  // Chunks in one pass over the data.
  virtual uint64_t chunks_per_epoch() const = 0;
};

// Token sequences of io::DataLoader: (B,T) inputs and next-token targets.
class TokenBatches final : public BatchSource {
 public:
  TokenBatches(const io::TokenSource& tokens, int B, int T, int vocab_size, bool shuffle, uint64_t seed);
  nn::Batch load(uint64_t chunk) override;
  uint64_t chunks_per_epoch() const override { return loader_.chunks_per_epoch(); }

 private:
  io::DataLoader loader_;
  int B_, T_;
  std::vector<int32_t> inputs_, targets_;
};

// Images with class labels; pixels scaled to [0, 1] (x / 255).
//
// Note [Image epochs]: training sources count in whole steps: an epoch is floor(N / global batch)
// steps of `chunks_per_step` = accum * world chunks of B samples (the remainder is dropped, as
// PyTorch's DataLoader with drop_last), and epoch e reads the samples in the order of a
// permutation seeded by (seed, e), or in file order with shuffle off. The permutation is over
// the whole dataset, so the global batch of a step does not depend on how it is split across ranks.
// Evaluation sources (chunks_per_step 0) read every sample once in file order, the last chunk
// holding the remainder.
class ImageBatches final : public BatchSource {
 public:
  // Takes the dataset. Throws Error naming `flag` and the labels file when a label is >= classes,
  // when the sample shape differs from `input_shape` (the model's), or when a training source
  // holds less than one global batch.
  ImageBatches(io::ImageDataset data, const std::string& flag, const std::vector<int64_t>& input_shape, int classes,
               int B, int chunks_per_step, bool shuffle, uint64_t seed);
  nn::Batch load(uint64_t chunk) override;
  uint64_t chunks_per_epoch() const override { return chunks_per_epoch_; }
  // Training sources: optimizer steps per epoch.
  uint64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t num_samples() const { return data_.count; }

 private:
  io::ImageDataset data_;
  int B_;
  bool shuffle_;
  uint64_t seed_;
  uint64_t chunks_per_epoch_ = 0, steps_per_epoch_ = 0;
  int64_t perm_epoch_ = -1;
  std::vector<uint32_t> perm_;
  std::vector<float> features_;
  std::vector<int32_t> labels_;
};

}  // namespace zerone::train
