#include "zerone/train/batch_source.h"

#include <numeric>

#include "zerone/core/error.h"
#include "zerone/core/rng.h"

namespace zerone::train {

TokenBatches::TokenBatches(const io::TokenSource& tokens, int B, int T, int vocab_size, bool shuffle, uint64_t seed)
    : loader_(tokens, B, T, vocab_size, shuffle, seed),
      B_(B),
      T_(T),
      inputs_(static_cast<size_t>(B) * T),
      targets_(inputs_.size()) {}

nn::Batch TokenBatches::load(uint64_t first_sample) {
  loader_.load(first_sample, inputs_.data(), targets_.data());
  nn::Batch b;
  b.size = B_;
  b.seq = T_;
  b.tokens = inputs_.data();
  b.targets = targets_.data();
  return b;
}

namespace {
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += str_cat(s.empty() ? "" : "x", d);
  return s;
}
}  // namespace

ImageBatches::ImageBatches(io::ImageDataset data, const std::string& flag, const std::vector<int64_t>& input_shape,
                           int classes, int B, int64_t global_batch, bool shuffle, uint64_t seed)
    : data_(std::move(data)), B_(B), shuffle_(shuffle), seed_(seed) {
  ZERONE_CHECK(data_.sample_shape == input_shape, flag, " '", data_.images_path, "' holds ", shape_text(data_.sample_shape),
               " images, but the model takes ", shape_text(input_shape), " inputs");
  for (int64_t i = 0; i < data_.count; ++i)
    ZERONE_CHECK(data_.labels[i] < classes, flag, " '", data_.labels_path, "': label ", int{data_.labels[i]}, " of sample ",
                 i, " is out of range for the model's ", classes, " classes (0..", classes - 1, ")");
  if (global_batch > 0) {
    const uint64_t global = static_cast<uint64_t>(global_batch);
    steps_per_epoch_ = static_cast<uint64_t>(data_.count) / global;
    ZERONE_CHECK(steps_per_epoch_ >= 1, flag, " '", data_.images_path, "' holds ", data_.count,
                 " samples, fewer than one global batch of ", global, " (micro-batch x accumulation x world)");
    samples_per_epoch_ = steps_per_epoch_ * global;
  } else {
    samples_per_epoch_ = static_cast<uint64_t>(data_.count);
  }
  features_.resize(static_cast<size_t>(B) * data_.sample_numel());
  labels_.resize(B);
}

uint64_t ImageBatches::batches_per_epoch() const {
  return (samples_per_epoch_ + static_cast<uint64_t>(B_) - 1) / static_cast<uint64_t>(B_);
}

nn::Batch ImageBatches::load(uint64_t first_sample) {
  // Training: B samples, which may straddle two epochs (after a resume with another global batch);
  // evaluation: up to the end of the pass.
  const int n = steps_per_epoch_ > 0
                    ? B_
                    : static_cast<int>(std::min<uint64_t>(B_, samples_per_epoch_ - first_sample % samples_per_epoch_));
  const size_t per = data_.sample_numel();
  for (int b = 0; b < n; ++b) {
    const uint64_t stream = first_sample + static_cast<uint64_t>(b);
    const int64_t epoch = static_cast<int64_t>(stream / samples_per_epoch_);
    const uint64_t index = stream % samples_per_epoch_;
    if (shuffle_ && epoch != perm_epoch_) {
      // Fisher-Yates with the epoch's own stream (Note [Image epochs]).
      perm_.resize(data_.count);
      std::iota(perm_.begin(), perm_.end(), 0u);
      Rng rng(seed_, 0x1d8e4e27c47d124full + static_cast<uint64_t>(epoch));
      for (size_t i = perm_.size() - 1; i > 0; --i) std::swap(perm_[i], perm_[rng.below(i + 1)]);
      perm_epoch_ = epoch;
    }
    const size_t s = shuffle_ ? perm_[index] : index;
    const uint8_t* px = data_.pixels.data() + s * per;
    float* out = features_.data() + static_cast<size_t>(b) * per;
    for (size_t i = 0; i < per; ++i) out[i] = static_cast<float>(px[i]) / 255.0f;  // as torchvision ToTensor
    labels_[b] = data_.labels[s];
  }
  nn::Batch batch;
  batch.size = n;
  batch.features = features_.data();
  batch.targets = labels_.data();
  return batch;
}

}  // namespace zerone::train
