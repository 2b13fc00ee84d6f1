// ZeRO partition arithmetic (DESIGN §2-§3), shared by the engine and `zerone estimate` so that the
// prediction and the memory ledger agree to the byte.
//
// Unit u has numel_u real elements, padded to P_u = ceil(numel_u / (world*64)) * world*64; rank r
// owns the shard [r*S_u, (r+1)*S_u) with S_u = P_u / world. Per rank, at the end of a step:
//
//   stage | param (compute dtype)        | grad (f32)  | master (f32, bf16 only) | optim (m, v f32)
//   0     | sum P_u                      | sum P_u     | sum numel_u             | 2 sum numel_u
//   1     | sum P_u                      | sum P_u     | sum S_u                 | 2 sum S_u
//   2     | sum P_u                      | sum S_u     | sum S_u                 | 2 sum S_u
//   3     | sum S_u (+ P_u persistent)   | sum S_u     | sum S_u                 | 2 sum S_u
//
// "persistent" units (numel < stage3_param_persistence_threshold) keep their full parameters at
// stage 3 instead of a shard. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zerone/core/dtype.h"

namespace zerone::zero {

inline constexpr size_t kShardAlign = 64;

struct ZeroConfig {
  int stage = 0;
  size_t reduce_bucket_numel = 500'000'000;          // reduce_bucket_size (elements)
  size_t allgather_bucket_numel = 500'000'000;       // allgather_bucket_size (elements)
  size_t prefetch_numel = 50'000'000;                // stage3_prefetch_bucket_size (elements)
  size_t persistence_threshold = 100'000;            // stage3_param_persistence_threshold (elements)
};

struct UnitShard {
  size_t numel = 0;         // real elements of the unit
  size_t padded_numel = 0;  // P_u
  size_t shard_numel = 0;   // S_u
  size_t shard_begin = 0;   // r * S_u
  bool persistent = false;  // stage 3: full parameters stay resident
};

size_t padded_numel(size_t numel, int world);
UnitShard unit_shard(size_t numel, int world, int rank, const ZeroConfig& config);

struct ModelStateBytes {
  int64_t param = 0, grad = 0, master = 0, optim = 0;
  int64_t total() const { return param + grad + master + optim; }
};

// Per-rank model-state bytes at the end of a step (the table above).
ModelStateBytes model_state_bytes(const std::vector<size_t>& unit_numels, int world, int rank, DType dtype,
                                  const ZeroConfig& config);

// Note [Working-set bound]: stages 2-3 also hold transient buffers while a step runs (the engine
// pools them, Note [Working-set pool] in core/memory.h). With P_1 >= P_2 the two largest units
// (a unit's backward touches at most two: the head reads the tied embedding) and B, F the reduce
// and prefetch bucket sizes in elements, per rank:
//   param (stage 3, compute dtype): gathered units = the units in use (<= P_1 + P_2) plus the
//          prefetch window (<= F, counting units already gathered): min(sum P, P_1 + P_2 + F).
//   grad (f32): full gradients of the units in backward (<= P_1 + P_2) plus those still being
//          reduce-scattered (the engine waits while they exceed max(B, P_1)):
//          min(sum P, max(B, P_1) + P_1 + P_2).
//   comm (f32): a landing shard for each unit being reduced after the first micro-step:
//          min(sum S, (max(B, P_1) + P_1) / world).
// Stages 0-1 have none (their full buffers are model state). Sums run over non-persistent units
// for `param`. A bound, not a prediction: the ledger's `comm` (idle pooled buffers) at the end of
// a step stays at or below `total()`.
struct WorkingSetBytes {
  int64_t param = 0, grad = 0, comm = 0;
  int64_t total() const { return param + grad + comm; }
};
WorkingSetBytes working_set_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype,
                                  const ZeroConfig& config);

}  // namespace zerone::zero
