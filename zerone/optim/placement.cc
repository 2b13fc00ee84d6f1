#include "zerone/optim/placement.h"

#include <algorithm>

#include "zerone/core/error.h"
#include "zerone/optim/partial_offload.h"

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
  return placement.offload_place == MemPlace::nvme && offloaded > 0 && offloaded == total;
}

std::unique_ptr<Optimizer> make_optimizer(std::vector<ShardRef> shards, DType param_dtype,
                                          const OptimizerOptions& options, const StatePlacement& placement) {
  std::vector<size_t> numels;
  for (const ShardRef& s : shards) numels.push_back(s.numel);
  const auto [offloaded, total] = offloaded_and_total(numels, placement);
  if (offloaded == 0) return make_optimizer(std::move(shards), param_dtype, options, MemPlace::device);
  if (offloaded < total) {
    // Note [Partial optimizer offload]: no spare slots (no speculative step with a partial offload).
    ZERONE_ASSERT(std::find(placement.spare_slots.begin(), placement.spare_slots.end(), 1) == placement.spare_slots.end(),
                  "spare swap slots asked of a partial optimizer offload");
    return std::make_unique<PartialOffloadOptimizer>(std::move(shards), placement.offloaded_numels, param_dtype, options,
                                                     placement.offload_place, placement.sub_group_numel,
                                                     placement.offload_buffer_count, placement.nvme, placement.swap_dir);
  }
  if (placement.offload_place == MemPlace::host) return make_optimizer(std::move(shards), param_dtype, options, MemPlace::host);
  ZERONE_ASSERT(placement.swap_dir != nullptr, "optimizer state on NVMe without a swap directory");
  return std::make_unique<SwappedOptimizer>(std::move(shards), param_dtype, options, placement.sub_group_numel,
                                            placement.offload_buffer_count, placement.nvme, *placement.swap_dir,
                                            placement.spare_slots, placement.param_source);
}

}  // namespace zerone::optim
