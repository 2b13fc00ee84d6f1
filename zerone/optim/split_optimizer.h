// An optimizer whose shards are cut in two at a per-shard element, each part stepped by an
// optimizer of its own: the leading elements of every shard by one, the rest by the other. Each
// part sees a slice of the shard (parameters, gradients and weight-decay ranges cut at the same
// element) and every element is updated by the same update_slice as without the cut, so the
// numbers are those of any other placement bit for bit; only the reported sum of squares adds its
// two parts in another order. optim/placement.cc builds it for
//   - a partial offload, DeepSpeed's offload_optimizer.ratio (Note [Partial optimizer offload] in
//     zero/partition.h): the leading part offloaded (to the host or NVMe), the rest on the device;
//   - optimizer state split between NVMe and host memory (Note [Optimizer state on NVMe and in
//     host memory] in zero/partition.h): the leading part swapped, the rest on the host;
// and the two nest (a leading part that is itself split).
//
// Checkpoints go through export_state/import_state (unit coordinates, as any optimizer): the
// disk-to-disk copy of swapped state (Note [Checkpoints of swapped state]) is not used for a split
// optimizer. It keeps no undo copies and no spare slots: no speculative early step over it.
//
// Thread-safety: one thread at a time, as the optimizers it is made of.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zerone/optim/optimizers.h"

namespace zerone::optim {

class SplitOptimizer final : public Optimizer {
 public:
  // Builds the optimizer of one part from its slices; `shard_of[k]` is the engine shard that
  // parts[k] was cut from.
  using MakePart =
      std::function<std::unique_ptr<Optimizer>(std::vector<ShardRef> parts, const std::vector<size_t>& shard_of)>;
  // `cut[i]` leading elements of shard i go to the optimizer `make_leading` builds, the rest to
  // the one of `make_trailing`. Both parts must be non-empty and step shard by shard. Throws
  // Error as the optimizers the two build do.
  SplitOptimizer(std::vector<ShardRef> shards, const std::vector<size_t>& cut, DType param_dtype,
                 const OptimizerOptions& options, const MakePart& make_leading, const MakePart& make_trailing);

  void set_param(size_t i, void* param) override;
  void set_grad(size_t i, const float* grad) override;
  size_t num_shards() const override { return shards_.size(); }
  size_t numel(size_t i) const override { return shards_[i].numel; }
  const float* grad(size_t i) const override { return shards_[i].grad; }

  bool supports_shard_steps() const override { return true; }
  void begin_step(float lr, float grad_scale) override;
  PendingSum update_shard(size_t i, size_t next_shard = kNoShard) override;
  void end_step() override;

  std::string type_name() const override { return optimizer_name(options_); }
  std::vector<std::string> state_names() const override;
  void export_state(const std::function<void(const StatePiece&, const float* data)>& fn) override;
  void import_state(const std::function<void(const StatePiece&, float* data)>& fn) override;
  int64_t steps_taken() const override;
  void set_steps_taken(int64_t steps) override;

 private:
  // Where shard i's two parts are: index into the part's optimizer (kNoShard: no such part) and
  // the first element of the shard the trailing part holds.
  struct Split {
    size_t leading = kNoShard, trailing = kNoShard;
    size_t trailing_begin = 0;  // == cut[i]
  };
  std::vector<ShardRef> shards_;
  std::vector<Split> split_;
  std::vector<size_t> leading_shard_, trailing_shard_;  // part index -> engine shard
  DType param_dtype_;
  OptimizerOptions options_;
  std::unique_ptr<Optimizer> leading_, trailing_;
};

}  // namespace zerone::optim
