// Partial optimizer offload, DeepSpeed's offload_optimizer.ratio (Note [Partial optimizer offload]
// in zero/partition.h): one optimizer over the engine's shards whose state is split in two. The leading
// elements of each shard that offloaded_prefix() names run on an offloaded optimizer (AdamW/SGD with
// its state on the host, or the NVMe-swapped SwappedOptimizer), the rest on an in-memory optimizer
// with its state on the device. Each part sees a slice of the shard (parameters, gradients and
// weight-decay ranges cut at the same element), and every element is updated by the same
// update_slice as without the split, so the numbers are those of any other placement bit for bit;
// only the reported sum of squares adds its two parts in another order.
//
// Checkpoints go through export_state/import_state (unit coordinates, as any optimizer): the
// disk-to-disk copy of swapped state (Note [Checkpoints of swapped state]) is not used for a split
// optimizer, whose device part has no file.
//
// Thread-safety: one thread at a time, as the optimizers it is made of.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zerone/io/aio.h"
#include "zerone/optim/optimizers.h"
#include "zerone/optim/swapped.h"

namespace zerone::optim {

class PartialOffloadOptimizer final : public Optimizer {
 public:
  // `offloaded[i]` (zero::offloaded_prefix) leading elements of shard i go to `offload_place`
  // (host, or nvme: then the swap of `dir`, the run's swap directory, with sub_group_numel,
  // offload_buffer_count and `nvme`); the rest stays on the device. Throws Error as the optimizers it
  // builds do.
  PartialOffloadOptimizer(std::vector<ShardRef> shards, const std::vector<size_t>& offloaded, DType param_dtype,
                          const OptimizerOptions& options, MemPlace offload_place, size_t sub_group_numel,
                          int offload_buffer_count, const NvmeConfig& nvme, io::SwapDirectory* dir);

  void set_param(size_t i, void* param) override;
  void set_grad(size_t i, const float* grad) override;
  size_t num_shards() const override { return shards_.size(); }
  size_t numel(size_t i) const override { return shards_[i].numel; }
  const float* grad(size_t i) const override { return shards_[i].grad; }

  bool supports_shard_steps() const override { return true; }
  void begin_step(float lr, float grad_scale) override;
  double update_shard(size_t i, size_t next_shard = kNoShard) override;
  void end_step() override;

  std::string type_name() const override { return optimizer_name(options_); }
  std::vector<std::string> state_names() const override;
  void export_state(const std::function<void(const StatePiece&, const float* data)>& fn) override;
  void import_state(const std::function<void(const StatePiece&, float* data)>& fn) override;
  int64_t steps_taken() const override;
  void set_steps_taken(int64_t steps) override;

 private:
  // Where shard i's two parts are: index into the part's optimizer (kNoShard: no such part) and
  // the first element of the shard the part holds.
  struct Split {
    size_t offloaded = kNoShard, resident = kNoShard;
    size_t resident_begin = 0;  // == the offloaded prefix's length
  };
  std::vector<ShardRef> shards_;
  std::vector<Split> split_;
  std::vector<size_t> offloaded_shard_, resident_shard_;  // part index -> engine shard
  DType param_dtype_;
  OptimizerOptions options_;
  std::unique_ptr<Optimizer> offloaded_, resident_;
};

}  // namespace zerone::optim
