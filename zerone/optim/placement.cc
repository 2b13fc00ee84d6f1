#include "zerone/optim/placement.h"

#include <algorithm>

#include "zerone/core/error.h"
#include "zerone/optim/split_optimizer.h"

namespace zerone::optim {

namespace {
// Elements offloaded over all shards, and all elements.
std::pair<size_t, size_t> offloaded_and_total(const std::vector<size_t>& shard_numels, const StatePlacement& placement) {
  size_t offloaded = 0, total = 0;
  for (size_t i = 0; i < shard_numels.size(); ++i) {
    total += shard_numels[i];
    if (placement.offload_place != MemPlace::device && i < placement.offloaded_numels.size())
      offloaded += placement.offloaded_numels[i];
  }
  return {offloaded, total};
}
}  // namespace

bool swaps_all_state(const std::vector<size_t>& shard_numels, const StatePlacement& placement) {
  const auto [offloaded, total] = offloaded_and_total(shard_numels, placement);
  size_t swapped = offloaded;
  if (!placement.nvme_numels.empty()) {
    swapped = 0;
    for (size_t n : placement.nvme_numels) swapped += n;
  }
  return placement.offload_place == MemPlace::nvme && offloaded > 0 && swapped == total;
}

std::unique_ptr<Optimizer> make_optimizer(std::vector<ShardRef> shards, DType param_dtype,
                                          const OptimizerOptions& options, const StatePlacement& placement) {
  std::vector<size_t> numels;
  for (const ShardRef& s : shards) numels.push_back(s.numel);
  const auto [offloaded, total] = offloaded_and_total(numels, placement);
  if (offloaded == 0) return make_optimizer(std::move(shards), param_dtype, options, MemPlace::device);
  const bool whole = swaps_all_state(numels, placement);  // one SwappedOptimizer over everything
  // Note [Partial optimizer offload], Note [Optimizer state on NVMe and in host memory]: no spare
  // slots for a split optimizer (it never speculates).
  ZERONE_ASSERT(whole || std::find(placement.spare_slots.begin(), placement.spare_slots.end(), 1) == placement.spare_slots.end(),
                "spare swap slots asked of a split optimizer");
  using Parts = std::vector<ShardRef>;
  using ShardOf = std::vector<size_t>;
  auto in_memory = [&](MemPlace place) {
    return [&, place](Parts parts, const ShardOf&) { return make_optimizer(std::move(parts), param_dtype, options, place); };
  };
  auto swapped = [&](Parts parts, const ShardOf&) -> std::unique_ptr<Optimizer> {
    ZERONE_ASSERT(placement.swap_dir != nullptr, "optimizer state on NVMe without a swap directory");
    return std::make_unique<SwappedOptimizer>(std::move(parts), param_dtype, options, placement.sub_group_numel,
                                              placement.offload_buffer_count, placement.nvme, *placement.swap_dir,
                                              whole ? placement.spare_slots : std::vector<char>{},
                                              whole ? placement.param_source : nullptr);
  };
  // The offloaded parts (the whole shards, or their offloaded prefixes).
  auto offloaded_part = [&](Parts parts, const ShardOf& shard_of) -> std::unique_ptr<Optimizer> {
    if (placement.offload_place == MemPlace::host) return in_memory(MemPlace::host)(std::move(parts), shard_of);
    std::vector<size_t> cut;  // the swapped prefix of each part
    size_t swapped_numel = 0, part_numel = 0;
    for (size_t k = 0; k < parts.size(); ++k) {
      cut.push_back(placement.nvme_numels.empty() ? parts[k].numel : placement.nvme_numels[shard_of[k]]);
      ZERONE_ASSERT(cut.back() <= parts[k].numel, "more swapped than offloaded elements");
      swapped_numel += cut.back();
      part_numel += parts[k].numel;
    }
    if (swapped_numel == part_numel) return swapped(std::move(parts), shard_of);
    if (swapped_numel == 0) return in_memory(MemPlace::host)(std::move(parts), shard_of);
    return std::make_unique<SplitOptimizer>(std::move(parts), cut, param_dtype, options, swapped, in_memory(MemPlace::host));
  };
  ShardOf every(shards.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = i;
  if (offloaded == total) return offloaded_part(std::move(shards), every);
  return std::make_unique<SplitOptimizer>(std::move(shards), placement.offloaded_numels, param_dtype, options,
                                          offloaded_part, in_memory(MemPlace::device));
}

}  // namespace zerone::optim
