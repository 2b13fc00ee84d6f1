// Where one run's optimizer state lives, as plain data, and the function that builds the optimizer
// it calls for: in memory (adamw.h, sgd.h) on the device or the host, swapped to NVMe (swapped.h),
// or split in two of those (split_optimizer.h). The ZeRO engine fills a StatePlacement from its layout
// (zero/partition.h) and never names a concrete optimizer.
//
// Thread-safety: plain values; make_optimizer is reentrant (the optimizers it builds are not).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "zerone/core/memory.h"
#include "zerone/io/aio.h"
#include "zerone/optim/optimizers.h"
#include "zerone/optim/swapped.h"

namespace zerone::optim {

struct StatePlacement {
  // Where offloaded state goes: MemPlace::host (ZeRO-Offload) or MemPlace::nvme (ZeRO-Infinity);
  // MemPlace::device offloads nothing.
  MemPlace offload_place = MemPlace::device;
  // Per shard, how many of its elements have their state offloaded (Note [Partial optimizer
  // offload] in zero/partition.h): all of them, none, or a prefix. Empty: none.
  std::vector<size_t> offloaded_numels;
  // offload_place nvme only: per shard, how many of its offloaded elements (a prefix of them) are
  // swapped, the rest being in host memory (Note [Optimizer state on NVMe and in host memory] in
  // zero/partition.h). Empty: all of them.
  std::vector<size_t> nvme_numels;
  // Offloaded state in sub-groups of at most this many elements, this many in flight
  // (offload_optimizer.sub_group_size, buffer_count).
  size_t sub_group_numel = 0;
  int offload_buffer_count = 0;
  // NVMe only: the swap settings and the run's swap directory (which must outlive the optimizer).
  NvmeConfig nvme;
  io::SwapDirectory* swap_dir = nullptr;
  // State swapped whole to NVMe only: per shard, whether it gets spare slots (Note [Speculative
  // early step]); where the initial master reads each shard's parameters (SwappedOptimizer).
  std::vector<char> spare_slots;
  SwappedOptimizer::ParamSource param_source;
};

// True when `placement` puts the state of every element of `shard_numels` on NVMe (the
// SwappedOptimizer make_optimizer builds for it), false for none or part of it.
bool swaps_all_state(const std::vector<size_t>& shard_numels, const StatePlacement& placement);

// The optimizer the options name over `shards`, its state where `placement` says:
//   nothing offloaded          in memory on the device (make_optimizer(..., MemPlace::device));
//   everything to the host     in memory on the host;
//   everything to NVMe         SwappedOptimizer;
//   NVMe and host memory       SplitOptimizer: SwappedOptimizer for the swapped prefix of each
//                              shard, in memory on the host for the rest;
//   a prefix of each shard     SplitOptimizer: one of the above for the prefix, the rest in
//                              memory on the device.
// Throws Error like the optimizer it builds (options it refuses, swap file failures).
std::unique_ptr<Optimizer> make_optimizer(std::vector<ShardRef> shards, DType param_dtype,
                                          const OptimizerOptions& options, const StatePlacement& placement);

}  // namespace zerone::optim
