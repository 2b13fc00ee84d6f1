#include "zerone/zero/partition.h"

#include <algorithm>
#include <utility>

#include "zerone/core/error.h"

namespace zerone::zero {

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
                                  const ZeroConfig& config) {
  ModelStateBytes b;
  const int64_t ds = static_cast<int64_t>(dtype_size(dtype));
  const bool has_master = dtype != DType::f32;
  for (size_t numel : unit_numels) {
    UnitShard s = unit_shard(numel, world, rank, config);
    const int64_t P = static_cast<int64_t>(s.padded_numel), S = static_cast<int64_t>(s.shard_numel);
    const int64_t opt_numel = config.stage == 0 ? static_cast<int64_t>(numel) : S;
    b.param += (config.stage == 3 && !s.persistent ? S : P) * ds;
    b.grad += (config.stage <= 1 ? P : S) * 4;
    b.master += has_master ? opt_numel * 4 : 0;
    b.optim += 2 * opt_numel * 4;
  }
  return b;
}

WorkingSetBytes working_set_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype,
                                  const ZeroConfig& config) {
  WorkingSetBytes b;
  if (config.stage < 2) return b;
  // The two largest padded units, over all units and over those whose parameters are sharded.
  size_t top1 = 0, top2 = 0, sharded1 = 0, sharded2 = 0, sum_p = 0, sum_sharded_p = 0;
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
    }
  }
  const size_t reducing = std::max(config.reduce_bucket_numel, top1);
  const int64_t ds = static_cast<int64_t>(dtype_size(dtype));
  b.param = static_cast<int64_t>(std::min(sum_sharded_p, sharded1 + sharded2 + config.prefetch_numel)) * ds;
  b.grad = static_cast<int64_t>(std::min(sum_p, reducing + top1 + top2)) * 4;
  b.comm = static_cast<int64_t>(std::min(sum_p, reducing + top1) / static_cast<size_t>(world)) * 4;
  return b;
}

}  // namespace zerone::zero
