#include "zerone/optim/partial_offload.h"

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

PartialOffloadOptimizer::PartialOffloadOptimizer(std::vector<ShardRef> shards, const std::vector<size_t>& offloaded,
                                                 DType param_dtype, const OptimizerOptions& options,
                                                 MemPlace offload_place, size_t sub_group_numel, int offload_buffer_count,
                                                 const NvmeConfig& nvme, io::SwapDirectory* dir)
    : shards_(std::move(shards)), param_dtype_(param_dtype), options_(options) {
  ZERONE_ASSERT(offloaded.size() == shards_.size() && offload_place != MemPlace::device);
  std::vector<ShardRef> off_parts, res_parts;
  split_.resize(shards_.size());
  for (size_t i = 0; i < shards_.size(); ++i) {
    const size_t n = shards_[i].numel, cut = offloaded[i];
    ZERONE_ASSERT(cut <= n);
    split_[i].resident_begin = cut;
    if (cut > 0) {
      split_[i].offloaded = off_parts.size();
      offloaded_shard_.push_back(i);
      off_parts.push_back(slice(shards_[i], 0, cut, param_dtype));
    }
    if (cut < n) {
      split_[i].resident = res_parts.size();
      resident_shard_.push_back(i);
      res_parts.push_back(slice(shards_[i], cut, n, param_dtype));
    }
  }
  ZERONE_ASSERT(!off_parts.empty() && !res_parts.empty(), "a partial offload with nothing to split");
  resident_ = make_optimizer(std::move(res_parts), param_dtype, options, MemPlace::device);
  if (offload_place == MemPlace::nvme) {
    ZERONE_ASSERT(dir != nullptr);
    offloaded_ = std::make_unique<SwappedOptimizer>(std::move(off_parts), param_dtype, options, sub_group_numel,
                                                    offload_buffer_count, nvme, *dir);
  } else {
    offloaded_ = make_optimizer(std::move(off_parts), param_dtype, options, MemPlace::host);
  }
  ZERONE_ASSERT(offloaded_->supports_shard_steps() && resident_->supports_shard_steps());
  ZERONE_ASSERT(offloaded_->state_names() == resident_->state_names());
}

void PartialOffloadOptimizer::set_param(size_t i, void* param) {
  shards_[i].param = param;
  const Split& s = split_[i];
  if (s.offloaded != kNoShard) offloaded_->set_param(s.offloaded, param);
  if (s.resident != kNoShard)
    resident_->set_param(s.resident, param ? static_cast<char*>(param) + s.resident_begin * dtype_size(param_dtype_) : nullptr);
}

void PartialOffloadOptimizer::set_grad(size_t i, const float* grad) {
  shards_[i].grad = grad;
  const Split& s = split_[i];
  if (s.offloaded != kNoShard) offloaded_->set_grad(s.offloaded, grad);
  if (s.resident != kNoShard) resident_->set_grad(s.resident, grad ? grad + s.resident_begin : nullptr);
}

void PartialOffloadOptimizer::begin_step(float lr, float grad_scale) {
  offloaded_->begin_step(lr, grad_scale);
  resident_->begin_step(lr, grad_scale);
}

double PartialOffloadOptimizer::update_shard(size_t i, size_t next_shard) {
  const Split& s = split_[i];
  double sumsq = 0.0;
  if (s.offloaded != kNoShard) {
    // The swap reads the next shard's offloaded part ahead, when it has one.
    const size_t next = next_shard == kNoShard ? kNoShard : split_[next_shard].offloaded;
    sumsq += offloaded_->update_shard(s.offloaded, next);
  }
  if (s.resident != kNoShard) sumsq += resident_->update_shard(s.resident);
  return sumsq;
}

void PartialOffloadOptimizer::end_step() {
  offloaded_->end_step();
  resident_->end_step();
}

std::vector<std::string> PartialOffloadOptimizer::state_names() const { return resident_->state_names(); }

void PartialOffloadOptimizer::export_state(const std::function<void(const StatePiece&, const float* data)>& fn) {
  // Pieces of each part, moved to the engine shard's coordinates.
  offloaded_->export_state([&](const StatePiece& p, const float* data) {
    fn(StatePiece{offloaded_shard_[p.shard], p.tensor, p.begin, p.count}, data);
  });
  resident_->export_state([&](const StatePiece& p, const float* data) {
    const size_t i = resident_shard_[p.shard];
    fn(StatePiece{i, p.tensor, split_[i].resident_begin + p.begin, p.count}, data);
  });
}

void PartialOffloadOptimizer::import_state(const std::function<void(const StatePiece&, float* data)>& fn) {
  offloaded_->import_state([&](const StatePiece& p, float* data) {
    fn(StatePiece{offloaded_shard_[p.shard], p.tensor, p.begin, p.count}, data);
  });
  resident_->import_state([&](const StatePiece& p, float* data) {
    const size_t i = resident_shard_[p.shard];
    fn(StatePiece{i, p.tensor, split_[i].resident_begin + p.begin, p.count}, data);
  });
}

int64_t PartialOffloadOptimizer::steps_taken() const { return resident_->steps_taken(); }

void PartialOffloadOptimizer::set_steps_taken(int64_t steps) {
  offloaded_->set_steps_taken(steps);
  resident_->set_steps_taken(steps);
}

}  // namespace zerone::optim
