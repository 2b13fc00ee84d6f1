#include "zerone/zero/partition.h"

#include <algorithm>
#include <utility>

#include "zerone/core/error.h"

namespace zerone::zero {

const char* offload_device_name(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::none: return "none";
    case OffloadDevice::cpu: return "cpu";
    case OffloadDevice::nvme: return "nvme";
  }
  return "?";
}

OffloadDevice parse_offload_device(const std::string& text, const std::string& what) {
  if (text == "none") return OffloadDevice::none;
  if (text == "cpu") return OffloadDevice::cpu;
  if (text == "nvme") return OffloadDevice::nvme;
  throw Error(str_cat(what, " '", text, "': expected none, cpu or nvme"));
}

MemPlace offload_place(OffloadDevice device) {
  return device == OffloadDevice::none ? MemPlace::device : device == OffloadDevice::cpu ? MemPlace::host : MemPlace::nvme;
}

std::vector<std::pair<size_t, size_t>> sub_groups(size_t shard_numel, size_t sub_group_numel) {
  ZERONE_ASSERT(sub_group_numel >= 1);
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t b = 0; b < shard_numel; b += sub_group_numel) out.emplace_back(b, std::min(shard_numel, b + sub_group_numel));
  return out;
}

bool speculates(const ZeroConfig& c) {
  const bool nvme = c.offload_optimizer == OffloadDevice::nvme || (c.stage == 3 && c.offload_param == OffloadDevice::nvme);
  return c.speculative_step && c.early_step && !c.delayed_update && (nvme || c.speculate_in_memory);
}

size_t swap_aligned(size_t bytes) { return (bytes + kSwapAlignBytes - 1) / kSwapAlignBytes * kSwapAlignBytes; }
size_t swap_tensor_bytes(size_t numel) { return swap_aligned(numel * sizeof(float)); }

int64_t PlacedBytes::place_total(MemPlace p) const {
  int64_t t = 0;
  for (size_t c = 0; c < MemoryLedger::kCategories; ++c) t += get(p, static_cast<MemCategory>(c));
  return t;
}

size_t padded_numel(size_t numel, int world) {
  size_t align = kShardAlign * static_cast<size_t>(world);
  return (numel + align - 1) / align * align;
}

UnitShard unit_shard(size_t numel, int world, int rank, const ZeroConfig& config) {
  ZERONE_ASSERT(world >= 1 && rank >= 0 && rank < world);
  UnitShard s;
  s.numel = numel;
  s.padded_numel = padded_numel(numel, world);
  s.shard_numel = s.padded_numel / world;
  s.shard_begin = static_cast<size_t>(rank) * s.shard_numel;
  s.persistent = config.stage == 3 && numel < config.persistence_threshold;
  return s;
}

ModelStateBytes model_state_bytes(const std::vector<size_t>& unit_numels, int world, int rank, DType dtype,
                                  const ZeroConfig& config, int optim_tensors) {
  ZERONE_ASSERT(optim_tensors >= 0);
  ModelStateBytes b;
  const int64_t K = optim_tensors;
  const int64_t ds = static_cast<int64_t>(dtype_size(dtype));
  const bool has_master = dtype != DType::f32;
  const MemPlace opt_place = offload_place(config.offload_optimizer);
  const MemPlace grad_shard_place = config.offload_optimizer == OffloadDevice::none ? MemPlace::device : MemPlace::host;
  const bool nvme = config.offload_optimizer == OffloadDevice::nvme;
  size_t largest_sub_group = 0;
  const bool speculation = speculates(config);
  for (size_t u = 0; u < unit_numels.size(); ++u) {
    const size_t numel = unit_numels[u];
    const bool spare = speculation && u > 0;  // Note [Speculative early step]: not the first unit
    UnitShard s = unit_shard(numel, world, rank, config);
    const int64_t P = static_cast<int64_t>(s.padded_numel), S = static_cast<int64_t>(s.shard_numel);
    const int64_t opt_numel = config.stage == 0 ? static_cast<int64_t>(numel) : S;
    const bool sharded = config.stage == 3 && !s.persistent;
    int64_t param = (sharded ? S : P) * ds;
    if (sharded && config.offload_param == OffloadDevice::nvme) param = static_cast<int64_t>(swap_aligned(static_cast<size_t>(param)));
    const int64_t grad = (config.stage <= 1 ? P : S) * 4;
    b.param += param;
    b.placed.at(sharded ? offload_place(config.offload_param) : MemPlace::device, MemCategory::param) += param;
    if (spare) {
      // An undo copy of the parameter slice the optimizer writes, or a spare slot for a swapped shard.
      const bool swapped = sharded && config.offload_param == OffloadDevice::nvme;
      const int64_t undo = swapped ? param : opt_numel * ds;
      b.speculation += undo;
      b.placed.at(sharded ? offload_place(config.offload_param) : MemPlace::device, MemCategory::scratch) += undo;
    }
    b.grad += grad;
    b.placed.at(config.stage <= 1 ? MemPlace::device : grad_shard_place, MemCategory::grad) += grad;
    if (!nvme) {
      b.master += has_master ? opt_numel * 4 : 0;
      b.optim += K * opt_numel * 4;
      if (spare) {
        b.speculation += ((has_master ? 1 : 0) + K) * opt_numel * 4;
        b.placed.at(opt_place, MemCategory::scratch) += ((has_master ? 1 : 0) + K) * opt_numel * 4;
      }
    } else {
      for (auto [begin, end] : sub_groups(static_cast<size_t>(opt_numel), config.sub_group_numel)) {
        const int64_t aligned = static_cast<int64_t>(swap_tensor_bytes(end - begin));
        b.master += has_master ? aligned : 0;
        b.optim += K * aligned;
        largest_sub_group = std::max(largest_sub_group, end - begin);
        if (spare) {
          b.speculation += ((has_master ? 1 : 0) + K) * aligned;
          b.placed.at(MemPlace::nvme, MemCategory::scratch) += ((has_master ? 1 : 0) + K) * aligned;
        }
      }
    }
  }
  b.placed.at(opt_place, MemCategory::master) = b.master;
  b.placed.at(opt_place, MemCategory::optim) = b.optim;
  if (nvme && largest_sub_group > 0) {
    b.swap = static_cast<int64_t>(config.optimizer_buffer_count) * ((has_master ? 1 : 0) + K) *
             static_cast<int64_t>(swap_tensor_bytes(largest_sub_group));
    b.placed.at(MemPlace::host, MemCategory::swap) = b.swap;
  }
  return b;
}

WorkingSetBytes working_set_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype,
                                  const ZeroConfig& config) {
  WorkingSetBytes b;
  if (config.stage < 2) return b;
  // The two largest padded units, over all units and over those whose parameters are sharded.
  size_t top1 = 0, top2 = 0, sharded1 = 0, sharded2 = 0, sum_p = 0, sum_sharded_p = 0;
  size_t sum_aligned = 0, max_aligned = 0, sharded_units = 0;
  auto rank_two = [](size_t v, size_t& first, size_t& second) {
    if (v > first) second = std::exchange(first, v);
    else if (v > second) second = v;
  };
  for (size_t numel : unit_numels) {
    UnitShard s = unit_shard(numel, world, 0, config);
    rank_two(s.padded_numel, top1, top2);
    sum_p += s.padded_numel;
    if (config.stage == 3 && !s.persistent) {
      rank_two(s.padded_numel, sharded1, sharded2);
      sum_sharded_p += s.padded_numel;
      const size_t aligned = swap_aligned(s.shard_numel * dtype_size(dtype));
      sum_aligned += aligned;
      max_aligned = std::max(max_aligned, aligned);
      ++sharded_units;
    }
  }
  const size_t reducing = std::max(config.reduce_bucket_numel, top1);
  const int64_t ds = static_cast<int64_t>(dtype_size(dtype));
  b.param = static_cast<int64_t>(std::min(sum_sharded_p, sharded1 + sharded2 + config.prefetch_numel)) * ds;
  b.grad = static_cast<int64_t>(std::min(sum_p, reducing + top1 + top2)) * 4;
  b.comm = static_cast<int64_t>(std::min(sum_p, reducing + top1) / static_cast<size_t>(world)) * 4;
  if (config.stage == 3 && config.offload_param == OffloadDevice::nvme) {
    const size_t window = (sharded1 + sharded2 + config.prefetch_numel) / static_cast<size_t>(world) * dtype_size(dtype) +
                          kSwapAlignBytes * sharded_units;
    b.host = static_cast<int64_t>(std::max(std::min(sum_aligned, window), std::min(sum_aligned, 3 * max_aligned)));
  }
  return b;
}

}  // namespace zerone::zero
