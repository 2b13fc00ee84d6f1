// `zerone estimate`: per-rank memory of a run before running it, from the same partition
// arithmetic the engine allocates with (partition.h) and the model's own activation table, so the
// model-state figures equal the memory ledger's exactly. Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "zerone/nn/model.h"
#include "zerone/zero/partition.h"

namespace zerone::zero {

struct StageEstimate {
  int stage = 0;
  ModelStateBytes model_state;  // per rank, at the end of a step
  WorkingSetBytes working_set;  // per rank, bound on transient buffers (Note [Working-set bound])
  int64_t activations = 0;      // per rank, for one micro-batch (live through backward)
  int64_t total() const { return model_state.total() + working_set.total() + activations; }
};

// One row per stage (or only `only_stage`), for rank 0 (all ranks hold equal shards). `model` needs
// no storage (make_model(..., allocate=false)): only its unit shapes and activation table are read.
std::vector<StageEstimate> estimate(const nn::Model& model, int world, DType dtype, int micro_batch, int seq,
                                    const ZeroConfig& base, std::optional<int> only_stage);

}  // namespace zerone::zero
