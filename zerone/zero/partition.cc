#include "zerone/zero/partition.h"

#include <algorithm>
#include <utility>

#include "zerone/core/error.h"
#include "zerone/zero/zeropp.h"

namespace zerone::zero {

using io::kSwapAlignBytes;
using io::swap_aligned;
using optim::sub_groups;
using optim::swap_tensor_bytes;

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

bool speculates(const ZeroConfig& c) {
  const bool nvme = c.offload_optimizer == OffloadDevice::nvme || (c.stage == 3 && c.offload_param == OffloadDevice::nvme);
  // Note [Partial optimizer offload], Note [Optimizer state on NVMe and in host memory]: not with
  // a split optimizer.
  const bool partial = c.offload_optimizer != OffloadDevice::none &&
                       (c.offload_optimizer_ratio < 1.0 ||
                        (c.offload_optimizer == OffloadDevice::nvme && c.offload_optimizer_nvme_ratio < 1.0));
  return c.speculative_step && c.early_step && !c.delayed_update && !partial && (nvme || c.speculate_in_memory);
}

std::vector<size_t> offloaded_prefix(const std::vector<size_t>& shard_numels, size_t sub_group_numel, double ratio) {
  ZERONE_ASSERT(sub_group_numel >= 1 && ratio >= 0.0 && ratio <= 1.0);
  size_t groups = 0;
  for (size_t n : shard_numels) groups += (n + sub_group_numel - 1) / sub_group_numel;
  size_t left = static_cast<size_t>(ratio * static_cast<double>(groups));  // int(ratio * n), as DeepSpeed
  std::vector<size_t> out;
  for (size_t n : shard_numels) {
    const size_t count = (n + sub_group_numel - 1) / sub_group_numel, take = std::min(left, count);
    out.push_back(take == count ? n : take * sub_group_numel);
    left -= take;
  }
  return out;
}

std::vector<size_t> optimizer_shard_numels(const std::vector<size_t>& unit_numels, int world, int rank,
                                           const ZeroConfig& config) {
  std::vector<size_t> out;
  for (size_t numel : unit_numels) out.push_back(config.stage == 0 ? numel : unit_shard(numel, world, rank, config).shard_numel);
  return out;
}

std::vector<size_t> offloaded_optimizer_numels(const std::vector<size_t>& unit_numels, int world, int rank,
                                               const ZeroConfig& config) {
  std::vector<size_t> shards = optimizer_shard_numels(unit_numels, world, rank, config);
  if (config.offload_optimizer == OffloadDevice::none) return std::vector<size_t>(shards.size(), 0);
  return offloaded_prefix(shards, config.sub_group_numel, config.offload_optimizer_ratio);
}

std::vector<size_t> nvme_optimizer_numels(const std::vector<size_t>& unit_numels, int world, int rank,
                                          const ZeroConfig& config) {
  std::vector<size_t> offloaded = offloaded_optimizer_numels(unit_numels, world, rank, config);
  if (config.offload_optimizer != OffloadDevice::nvme) return std::vector<size_t>(offloaded.size(), 0);
  if (config.offload_optimizer_nvme_ratio >= 1.0) return offloaded;
  // The offloaded part of each shard is whole sub-groups (or the whole shard), so its sub-groups
  // are the shard's first ones: counting them again counts the same sub-groups.
  return offloaded_prefix(offloaded, config.sub_group_numel, config.offload_optimizer_nvme_ratio);
}

bool gradients_transient(const std::vector<size_t>& unit_numels, int world, const ZeroConfig& config) {
  const bool partial = config.offload_optimizer != OffloadDevice::none && config.offload_optimizer_ratio < 1.0;
  if (!config.transient_gradients || config.stage < 2 || !config.early_step || config.delayed_update ||
      config.speculative_step || partial)
    return false;
  size_t largest = 0, total = 0;  // shard elements (every rank's shard of a unit is as long)
  for (size_t numel : unit_numels) {
    const size_t shard = unit_shard(numel, world, 0, config).shard_numel;
    largest = std::max(largest, shard);
    total += shard;
  }
  return static_cast<size_t>(kTransientGradBuffers) * largest < total;
}

bool gradient_sums_placeable(const ZeroConfig& config) {
  return config.stage >= 2 && config.offload_optimizer != OffloadDevice::none && config.offload_optimizer_ratio >= 1.0;
}

bool gradients_on_device(const std::vector<size_t>& unit_numels, int world, const ZeroConfig& config) {
  return config.grad_sums_on_device && gradient_sums_placeable(config) && !gradients_transient(unit_numels, world, config);
}

bool gradients_swapped(const std::vector<size_t>& unit_numels, int world, int rank, const ZeroConfig& config) {
  if (config.stage < 2 || config.offload_optimizer != OffloadDevice::nvme || config.delayed_update) return false;
  if (gradients_transient(unit_numels, world, config)) return false;  // Note [Transient gradients]
  if (gradients_on_device(unit_numels, world, config)) return false;  // Note [Gradient sums on the device]
  return nvme_optimizer_numels(unit_numels, world, rank, config) == optimizer_shard_numels(unit_numels, world, rank, config);
}


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
  const bool nvme = config.offload_optimizer == OffloadDevice::nvme;
  const std::vector<size_t> offloaded = offloaded_optimizer_numels(unit_numels, world, rank, config);
  const std::vector<size_t> swapped = nvme_optimizer_numels(unit_numels, world, rank, config);
  const bool grads_swapped = gradients_swapped(unit_numels, world, rank, config);
  const bool grads_transient = gradients_transient(unit_numels, world, config);
  const bool grads_on_device = gradients_on_device(unit_numels, world, config);
  const bool speculation = speculates(config);
  size_t largest_sub_group = 0, largest_grad_slot = 0, largest_grad_shard = 0;
  auto add = [&](MemPlace place, MemCategory category, int64_t bytes, int64_t& total) {
    b.placed.at(place, category) += bytes;
    total += bytes;
  };
  for (size_t u = 0; u < unit_numels.size(); ++u) {
    const size_t numel = unit_numels[u];
    const bool spare = speculation && u > 0;  // Note [Speculative early step]: not the first unit
    UnitShard s = unit_shard(numel, world, rank, config);
    const int64_t P = static_cast<int64_t>(s.padded_numel), S = static_cast<int64_t>(s.shard_numel);
    const int64_t opt_numel = config.stage == 0 ? static_cast<int64_t>(numel) : S;
    const int64_t off = static_cast<int64_t>(offloaded[u]), resident = opt_numel - off;
    const bool sharded = config.stage == 3 && !s.persistent;
    int64_t param = (sharded ? S : P) * ds;
    if (sharded && config.offload_param == OffloadDevice::nvme) param = static_cast<int64_t>(swap_aligned(static_cast<size_t>(param)));
    add(sharded ? offload_place(config.offload_param) : MemPlace::device, MemCategory::param, param, b.param);
    if (spare) {
      // An undo copy of the parameter slice the optimizer writes, or a spare slot for a swapped shard.
      const bool swapped = sharded && config.offload_param == OffloadDevice::nvme;
      add(sharded ? offload_place(config.offload_param) : MemPlace::device, MemCategory::scratch,
          swapped ? param : opt_numel * ds, b.speculation);
    }
    // Note [Partial optimizer offload]: a gradient shard follows the unit's offloaded sub-groups.
    // Note [Gradient sums on the device]: there whatever the optimizer's place.
    const MemPlace grad_place = config.stage <= 1 || off == 0 || grads_on_device ? MemPlace::device : MemPlace::host;
    if (grads_on_device) largest_grad_shard = std::max(largest_grad_shard, static_cast<size_t>(S));
    if (grads_swapped) {  // Note [Gradient swap]
      const size_t slot = swap_tensor_bytes(static_cast<size_t>(S));
      add(MemPlace::nvme, MemCategory::grad, static_cast<int64_t>(slot), b.grad);
      largest_grad_slot = std::max(largest_grad_slot, slot);
    } else if (grads_transient) {  // Note [Transient gradients]: buffers added below
      largest_grad_shard = std::max(largest_grad_shard, static_cast<size_t>(S));
    } else {
      add(grad_place, MemCategory::grad, (config.stage <= 1 ? P : S) * 4, b.grad);
    }
    if (config.delayed_update) {
      // Note [Delayed parameter update]: the optimizer's own gradients and parameters.
      const int64_t n = std::max<int64_t>(opt_numel, 1);
      const MemPlace dpu_place = off == 0 ? MemPlace::device : MemPlace::host;
      add(dpu_place, MemCategory::grad, n * 4, b.grad);
      add(dpu_place, MemCategory::param, n * ds, b.param);
    }
    if (has_master) add(MemPlace::device, MemCategory::master, resident * 4, b.master);
    add(MemPlace::device, MemCategory::optim, K * resident * 4, b.optim);
    // Note [Optimizer state on NVMe and in host memory]: with nvme, the offloaded part's first
    // `on_nvme` elements are swapped and the rest are on the host.
    const int64_t on_nvme = nvme ? static_cast<int64_t>(swapped[u]) : 0;
    const MemPlace in_memory_place = nvme ? MemPlace::host : opt_place;
    if (off > on_nvme) {
      if (has_master) add(in_memory_place, MemCategory::master, (off - on_nvme) * 4, b.master);
      add(in_memory_place, MemCategory::optim, K * (off - on_nvme) * 4, b.optim);
    }
    if (!nvme) {
      // Speculation's undo copy of the in-memory state (master unless f32, K tensors); never
      // under a split optimizer (speculates()), so the whole shard is on opt_place.
      if (spare) add(opt_place, MemCategory::scratch, ((has_master ? 1 : 0) + K) * opt_numel * 4, b.speculation);
    } else {
      for (auto [begin, end] : sub_groups(static_cast<size_t>(on_nvme), config.sub_group_numel)) {
        const int64_t aligned = static_cast<int64_t>(swap_tensor_bytes(end - begin));
        if (has_master) add(MemPlace::nvme, MemCategory::master, aligned, b.master);
        add(MemPlace::nvme, MemCategory::optim, K * aligned, b.optim);
        largest_sub_group = std::max(largest_sub_group, end - begin);
        if (spare) add(MemPlace::nvme, MemCategory::scratch, ((has_master ? 1 : 0) + K) * aligned, b.speculation);
      }
    }
  }
  if (grads_transient) {
    const MemPlace place = config.offload_optimizer == OffloadDevice::none ? MemPlace::device : MemPlace::host;
    add(place, MemCategory::grad, kTransientGradBuffers * static_cast<int64_t>(largest_grad_shard) * 4, b.grad);
  }
  // Note [Gradient sums on the device]: the host buffers the sums are staged in (the delayed
  // update copies them into its own gradient copy instead).
  if (grads_on_device && !config.delayed_update)
    add(MemPlace::host, MemCategory::grad, kDeviceSumStagingBuffers * static_cast<int64_t>(largest_grad_shard) * 4, b.grad);
  if (nvme && largest_sub_group > 0) {
    b.swap = static_cast<int64_t>(config.offload_buffer_count) * ((has_master ? 1 : 0) + K) *
             static_cast<int64_t>(swap_tensor_bytes(largest_sub_group));
  }
  b.swap += static_cast<int64_t>(config.offload_buffer_count) * static_cast<int64_t>(largest_grad_slot);
  if (b.swap > 0) b.placed.at(MemPlace::host, MemCategory::swap) = b.swap;
  // ZeRO++ hpZ: the secondary partition (Note [Secondary partition] in zeropp.h).
  add(MemPlace::device, MemCategory::param,
      static_cast<int64_t>(secondary_partition_bytes(unit_numels, world, dtype, config)), b.param);
  return b;
}

WorkingSetBytes working_set_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype,
                                  const ZeroConfig& config) {
  WorkingSetBytes b;
  if (config.stage >= 1 && config.offload_optimizer != OffloadDevice::none && !config.device_is_host_memory) {
    size_t largest = 0;  // the largest offloaded part of a shard (every rank's is as long)
    for (size_t n : offloaded_optimizer_numels(unit_numels, world, 0, config)) largest = std::max(largest, n);
    const size_t element = dtype == DType::f32 || config.stage == 1 ? sizeof(float) : dtype_size(dtype);
    b.host_scratch = static_cast<int64_t>(optim::kKeptStagingBuffers * largest * element);
  }
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
  // ZeRO++ qwZ and qgZ: their quantized communication buffers (Note [ZeRO++ working set] in zeropp.h).
  const WorkingSetBytes zeropp = zeropp_working_set_bytes(unit_numels, world, dtype, config);
  b.comm += zeropp.comm;
  b.host += zeropp.host;
  return b;
}

int64_t staged_collective_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype,
                                const ZeroConfig& config, CollectiveRoute route) {
  if (world <= 1 || route == CollectiveRoute::direct) return 0;
  int64_t sum_p = 0;
  for (size_t numel : unit_numels) sum_p += static_cast<int64_t>(unit_shard(numel, world, 0, config).padded_numel);
  const int64_t ds = static_cast<int64_t>(dtype_size(dtype));
  const WorkingSetBytes w = working_set_bytes(unit_numels, world, dtype, config);
  int64_t in_flight = 0;
  if (route == CollectiveRoute::native) {
    const bool host_grads = config.stage >= 2 && config.offload_optimizer != OffloadDevice::none &&
                            !gradients_on_device(unit_numels, world, config);
    const bool host_params = config.stage == 3 && config.offload_param != OffloadDevice::none;
    in_flight = (host_grads ? w.grad : 0) + (host_params ? w.param : 0);
  } else {
    switch (config.stage) {
      case 0:
      case 1: in_flight = 4 * sum_p; break;
      case 2: in_flight = std::max(w.grad, ds * sum_p); break;
      default: in_flight = w.param + w.grad; break;
    }
  }
  return in_flight + kStagedScalarBytes;
}

}  // namespace zerone::zero
