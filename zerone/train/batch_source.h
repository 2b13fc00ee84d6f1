// Where the trainer's micro-batches come from (Note [Batches] in nn/model.h): a BatchSource turns a
// position in its endless stream of samples into an nn::Batch of the next B samples. Token shards
// (io::DataLoader) and image datasets (io/idx.h) are the two kinds; the trainer's step loop sees
// only this interface.
//
// Note [Samples]: the data position is counted in samples (sequences or images), as Megatron's
// consumed_samples, never in micro-batches. Step s of a run that has consumed S samples before it
// reads the global batch of G = micro-batch x accumulation x world samples S .. S+G-1, and
// micro-step k on rank r reads its B of them from S + (k*world + r)*B (the sample's place in the
// global batch is also its dropout key, Note [Dropout keys]). The sample a stream position names
// does not depend on B, the world size or the accumulation (a shuffled epoch permutes samples, not
// micro-batches), so every split of the same global batch trains on the same samples, and a run
// resumed with another split continues the uninterrupted run's trajectory (train/checkpoint.h).
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
  // The B samples from `first_sample` of the stream (any non-negative index; a training source
  // wraps by epoch). An evaluation source's last batch of a pass may be short.
  virtual nn::Batch load(uint64_t first_sample) = 0;
  // Micro-batches of B samples in one pass over the data (an evaluation reads batch i at sample i*B).
  virtual uint64_t batches_per_epoch() const = 0;
  // Samples in one epoch of the stream (a training source's epoch length, Note [Resume position]).
  virtual uint64_t samples_per_epoch() const = 0;
  // B: samples per load().
  virtual int micro_batch() const = 0;
};

// Token sequences of io::DataLoader: (B,T) inputs and next-token targets.
class TokenBatches final : public BatchSource {
 public:
  TokenBatches(const io::TokenSource& tokens, int B, int T, int vocab_size, bool shuffle, uint64_t seed);
  nn::Batch load(uint64_t first_sample) override;
  uint64_t batches_per_epoch() const override { return loader_.batches_per_epoch(); }
  uint64_t samples_per_epoch() const override { return loader_.samples_per_epoch(); }
  int micro_batch() const override { return B_; }

 private:
  io::DataLoader loader_;
  int B_, T_;
  std::vector<int32_t> inputs_, targets_;
};

// Images with class labels; pixels scaled to [0, 1] (x / 255).
//
// Note [Image epochs]: training sources count in whole steps: an epoch is floor(N / global batch)
// steps of `global_batch` samples (the remainder is dropped, as PyTorch's DataLoader with
// drop_last), and epoch e reads the samples in the order of a permutation seeded by (seed, e), or
// in file order with shuffle off. The permutation is over the whole dataset, so the global batch
// of a step does not depend on how it is split across ranks. Evaluation sources (global_batch 0)
// read every sample once in file order, the last batch holding the remainder.
class ImageBatches final : public BatchSource {
 public:
  // Takes the dataset. Throws Error naming `flag` and the labels file when a label is >= classes,
  // when the sample shape differs from `input_shape` (the model's), or when a training source
  // holds less than one global batch.
  ImageBatches(io::ImageDataset data, const std::string& flag, const std::vector<int64_t>& input_shape, int classes,
               int B, int64_t global_batch, bool shuffle, uint64_t seed);
  nn::Batch load(uint64_t first_sample) override;
  uint64_t batches_per_epoch() const override;
  uint64_t samples_per_epoch() const override { return samples_per_epoch_; }
  int micro_batch() const override { return B_; }
  // Training sources: optimizer steps per epoch.
  uint64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t num_samples() const { return data_.count; }

 private:
  io::ImageDataset data_;
  int B_;
  bool shuffle_;
  uint64_t seed_;
  uint64_t samples_per_epoch_ = 0, steps_per_epoch_ = 0;
  int64_t perm_epoch_ = -1;
  std::vector<uint32_t> perm_;
  std::vector<float> features_;
  std::vector<int32_t> labels_;
};

}  // namespace zerone::train
