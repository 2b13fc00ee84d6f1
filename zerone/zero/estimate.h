// `zerone estimate`: per-rank memory of a run before running it, from the same partition
// arithmetic the engine allocates with (partition.h) and the model's own activation table, so the
// model-state figures equal the memory ledger's exactly. Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "zerone/comm/comm_choice.h"
#include "zerone/core/memory.h"
#include "zerone/kernels/backend.h"
#include "zerone/nn/model.h"
#include "zerone/optim/optimizers.h"
#include "zerone/zero/partition.h"

namespace zerone::zero {

// Per rank. The working set and activations are on the device (the saved block inputs on the host
// with CPU checkpointing); model state where Note [Offload places] puts it.
struct StageEstimate {
  int stage = 0;
  ModelStateBytes model_state;  // per rank, at the end of a step
  WorkingSetBytes working_set;  // per rank, bound on transient buffers (Note [Working-set bound])
  int64_t activations = 0;       // per rank on the device, for one micro-batch (live through backward)
  int64_t host_activations = 0;  // per rank on the host (Note [CPU checkpointing] in nn/model.h)
  // Per rank on the host, for collectives staged through it (Note [Staged collective bytes]).
  int64_t staged_collectives = 0;
  // Per rank on the device: the scratch the device backend keeps for the model's and the engine's
  // operations (Note [Backend scratch] in kernels/scratch.h; cuda only), in the ledger's device
  // scratch.
  int64_t backend_scratch = 0;
  int64_t device() const {
    return model_state.placed.place_total(MemPlace::device) + working_set.device() + activations + backend_scratch;
  }
  int64_t host() const {
    return model_state.placed.place_total(MemPlace::host) + working_set.on_host() + host_activations + staged_collectives;
  }
  int64_t nvme() const { return model_state.placed.place_total(MemPlace::nvme); }
  // Bytes in memory (device + host): on this CPU build both are RAM.
  int64_t total() const { return device() + host(); }
};

// Every byte of the estimate by (place, category): model state, working set and activations, as
// the ledger keeps them.
PlacedBytes placed_bytes(const StageEstimate& e);

// One line per (place, category) with bytes, e.g. "device param 1.2 MiB, host optim 3.4 MiB, ...".
std::string describe_places(const StageEstimate& e);

// How a run on `device` at `world` ranks moves its collectives over device buffers (Note [Staged
// collective bytes] in partition.h) when `library` runs them (comm::choose_comm_library, the
// function the trainer decides with): only the cpu device's memory is host memory.
inline CollectiveRoute collective_route(kernels::DeviceKind device, int world, comm::CommLibrary library) {
  if (world <= 1 || device == kernels::DeviceKind::cpu) return CollectiveRoute::direct;
  return library == comm::CommLibrary::nccl ? CollectiveRoute::native : CollectiveRoute::staged;
}

// One row per stage (or only `only_stage`), for rank 0 (all ranks hold equal shards). `model` needs
// no storage (make_model(..., allocate=false)): only its unit shapes, activation table and scratch
// count (for the device it is counted for: nn::Model::count_for_device) are read.
// The offload settings of `base` apply to the stages that can use them (optimizer: 1-3; param: 3).
// The optimizer state is `optimizer`'s (optim::optimizer_state_tensors). `route`: how the run's
// collectives move (collective_route above), which decides its staged_collectives.
std::vector<StageEstimate> estimate(const nn::Model& model, int world, DType dtype, int micro_batch, int seq,
                                    const ZeroConfig& base, const optim::OptimizerOptions& optimizer,
                                    std::optional<int> only_stage, CollectiveRoute route = CollectiveRoute::direct);

}  // namespace zerone::zero
