#include "zerone/optim/split_optimizer.h"

#include <algorithm>

#include "zerone/core/error.h"

namespace zerone::optim {

namespace {
// Elements [begin, end) of `s` as a shard of their own.
ShardRef slice(const ShardRef& s, size_t begin, size_t end, DType dtype) {
  ShardRef out;
  out.param = s.param ? static_cast<char*>(s.param) + begin * dtype_size(dtype) : nullptr;
  out.grad = s.grad ? s.grad + begin : nullptr;
  out.numel = end - begin;
  for (auto [b, e] : s.decay_ranges) {
    b = std::max(b, begin);
    e = std::min(e, end);
    if (b < e) out.decay_ranges.emplace_back(b - begin, e - begin);
  }
  return out;
}
}  // namespace

SplitOptimizer::SplitOptimizer(std::vector<ShardRef> shards, const std::vector<size_t>& cut, DType param_dtype,
                               const OptimizerOptions& options, const MakePart& make_leading,
                               const MakePart& make_trailing)
    : shards_(std::move(shards)), param_dtype_(param_dtype), options_(options) {
  ZERONE_ASSERT(cut.size() == shards_.size());
  std::vector<ShardRef> leading_parts, trailing_parts;
  split_.resize(shards_.size());
  for (size_t i = 0; i < shards_.size(); ++i) {
    const size_t n = shards_[i].numel, at = cut[i];
    ZERONE_ASSERT(at <= n);
    split_[i].trailing_begin = at;
    if (at > 0) {
      split_[i].leading = leading_parts.size();
      leading_shard_.push_back(i);
      leading_parts.push_back(slice(shards_[i], 0, at, param_dtype));
    }
    if (at < n) {
      split_[i].trailing = trailing_parts.size();
      trailing_shard_.push_back(i);
      trailing_parts.push_back(slice(shards_[i], at, n, param_dtype));
    }
  }
  ZERONE_ASSERT(!leading_parts.empty() && !trailing_parts.empty(), "a split optimizer with nothing to split");
  leading_ = make_leading(std::move(leading_parts), leading_shard_);
  trailing_ = make_trailing(std::move(trailing_parts), trailing_shard_);
  ZERONE_ASSERT(leading_->supports_shard_steps() && trailing_->supports_shard_steps());
  ZERONE_ASSERT(leading_->state_names() == trailing_->state_names());
}

void SplitOptimizer::set_param(size_t i, void* param) {
  shards_[i].param = param;
  const Split& s = split_[i];
  if (s.leading != kNoShard) leading_->set_param(s.leading, param);
  if (s.trailing != kNoShard)
    trailing_->set_param(s.trailing, param ? static_cast<char*>(param) + s.trailing_begin * dtype_size(param_dtype_) : nullptr);
}

void SplitOptimizer::set_grad(size_t i, const float* grad) {
  shards_[i].grad = grad;
  const Split& s = split_[i];
  if (s.leading != kNoShard) leading_->set_grad(s.leading, grad);
  if (s.trailing != kNoShard) trailing_->set_grad(s.trailing, grad ? grad + s.trailing_begin : nullptr);
}

void SplitOptimizer::begin_step(float lr, float grad_scale) {
  leading_->begin_step(lr, grad_scale);
  trailing_->begin_step(lr, grad_scale);
}

PendingSum SplitOptimizer::update_shard(size_t i, size_t next_shard) {
  const Split& s = split_[i];
  PendingSum sumsq;
  if (s.leading != kNoShard) {
    // A swapped part reads the next shard's part ahead, when it has one.
    const size_t next = next_shard == kNoShard ? kNoShard : split_[next_shard].leading;
    sumsq += leading_->update_shard(s.leading, next);
  }
  if (s.trailing != kNoShard)
    sumsq += trailing_->update_shard(s.trailing, next_shard == kNoShard ? kNoShard : split_[next_shard].trailing);
  return sumsq;
}

void SplitOptimizer::end_step() {
  leading_->end_step();
  trailing_->end_step();
}

std::vector<std::string> SplitOptimizer::state_names() const { return trailing_->state_names(); }

void SplitOptimizer::export_state(const std::function<void(const StatePiece&, const float* data)>& fn) {
  // Pieces of each part, moved to the engine shard's coordinates.
  leading_->export_state([&](const StatePiece& p, const float* data) {
    fn(StatePiece{leading_shard_[p.shard], p.tensor, p.begin, p.count}, data);
  });
  trailing_->export_state([&](const StatePiece& p, const float* data) {
    const size_t i = trailing_shard_[p.shard];
    fn(StatePiece{i, p.tensor, split_[i].trailing_begin + p.begin, p.count}, data);
  });
}

void SplitOptimizer::import_state(const std::function<void(const StatePiece&, float* data)>& fn) {
  leading_->import_state([&](const StatePiece& p, float* data) {
    fn(StatePiece{leading_shard_[p.shard], p.tensor, p.begin, p.count}, data);
  });
  trailing_->import_state([&](const StatePiece& p, float* data) {
    const size_t i = trailing_shard_[p.shard];
    fn(StatePiece{i, p.tensor, split_[i].trailing_begin + p.begin, p.count}, data);
  });
}

int64_t SplitOptimizer::steps_taken() const { return trailing_->steps_taken(); }

void SplitOptimizer::set_steps_taken(int64_t steps) {
  leading_->set_steps_taken(steps);
  trailing_->set_steps_taken(steps);
}

}  // namespace zerone::optim
