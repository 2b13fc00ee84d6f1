#include "zerone/zero/partition.h"

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

}  // namespace zerone::zero
