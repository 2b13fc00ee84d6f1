// The memory planner of `zerone plan`, `zerone train --auto-fit` and the advice of every "does not
// fit" refusal: it searches the settings that decide where a run's bytes live (ZeRO stage,
// optimizer and parameter offload with the partial ratio, activation and CPU checkpointing,
// bucket and prefetch sizes, sub-group size and staging buffers, the micro-batch when the global
// batch is fixed), prices each candidate's memory with the exact estimate arithmetic
// (zero::estimate, the engine's own partition and activation tables, so a plan's bytes are the
// ledger's) and its speed with the cost model (zero/cost_model.h), and returns the fastest that
// fits the budgets, the runners-up and, when nothing fits, the smallest budget per place that
// would.
//
// Note [Fit]: what "fits" compares. Per rank the estimate gives device, host and NVMe bytes. On a
// machine whose device is its RAM (a CPU build, --device cpu or sim) device and host are the same
// memory: device + host of every rank on the host must fit the host budget, and the device bytes
// of one rank the device cap (--device-mem-limit) when one is set. With a separate device (cuda)
// the device bytes of a rank fit the device budget and the host bytes of the host's ranks the
// host budget. NVMe bytes of the host's ranks fit the free disk under --nvme-path. The budgets are
// the caller's (measured or given); nothing here measures. The estimate counts what the ledger
// counts; the program, the kernels' scratch and the data readers are not in it, so a measured
// memory budget is lowered by a reserve (train::plan_machine: 5% and 256 MiB per rank).
//
// Determinism: the search order is fixed and ties go to the earlier candidate, so the same
// request gives the same plan on every rank (`--auto-fit` relies on it).
// Thread-safety: make_plan() switches the model's checkpointing flags while it searches (restored before it returns): one call per model at a
// time. Failure: throws Error for an impossible request (world < 1, seq beyond the model).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zerone/nn/model.h"
#include "zerone/optim/optimizers.h"
#include "zerone/zero/cost_model.h"
#include "zerone/zero/estimate.h"
#include "zerone/zero/partition.h"

namespace zerone::zero {

struct MemoryBudget {
  bool unified = true;        // device and host are the same RAM (Note [Fit])
  int64_t device_bytes = 0;   // per rank; 0: no cap (unified) / unknown
  int64_t host_bytes = 0;     // per host
  int64_t nvme_bytes = -1;    // free disk under --nvme-path per host; -1: no NVMe path (no NVMe offload)
  int ranks_per_host = 1;
};

// What a plan needs of each budget (Note [Fit]): device per rank, memory (host, or device + host
// when unified) and NVMe per host.
struct PlaceNeed {
  int64_t device = 0, memory = 0, nvme = 0;
};
PlaceNeed place_need(const StageEstimate& e, const MemoryBudget& budget);
// The budgets `need` exceeds, one phrase each ("host memory 27.8 GiB over 23.0 GiB"); empty: fits.
std::vector<std::string> overflows(const PlaceNeed& need, const MemoryBudget& budget);

// The settings a plan chooses.
struct PlanChoice {
  ZeroConfig zero;
  bool activation_checkpointing = false, cpu_checkpointing = false;
  int micro_batch = 1, grad_accum = 1;
};

struct PlanRequest {
  nn::Model* model = nullptr;  // shape only (make_model(..., allocate=false)); see Thread-safety
  DType dtype = DType::f32;
  optim::OptimizerOptions optimizer;
  int world = 1, seq = 1;
  int micro_batch = 1, grad_accum = 1;  // per rank; with micro_batch_free their product is fixed
  bool micro_batch_free = false;
  double flops_per_token = 0;           // Note [Model FLOPs]; 0: 6 x parameters
  ZeroConfig base;                      // what the planner does not choose (early step, ZeRO++, ...);
                                        // its transient_gradients as at one micro-step a step
  // How the run's collectives move (Note [Staged collective bytes] in partition.h): what they
  // stage through host memory counts in every candidate's estimate.
  CollectiveRoute collectives = CollectiveRoute::direct;
  // The user's own choices, held fixed; unset: the planner chooses.
  std::optional<int> stage;
  std::optional<OffloadDevice> offload_optimizer, offload_param;
  std::optional<double> offload_optimizer_ratio;
  std::optional<double> offload_optimizer_nvme_ratio;  // Note [Optimizer state on NVMe and in host memory]
  std::optional<bool> grad_sums_on_device;             // Note [Gradient sums on the device]
  std::optional<bool> activation_checkpointing, cpu_checkpointing;
  std::optional<size_t> reduce_bucket_numel, prefetch_numel, sub_group_numel;
  std::optional<int> buffer_count;
  MemoryBudget budget;
  MachineSpeed speed;
};

struct PlanCandidate {
  PlanChoice choice;
  StageEstimate estimate;
  PlaceNeed need;
  std::vector<std::string> overflow;  // empty: fits
  StepCost cost;
  bool fits() const { return overflow.empty(); }
};

struct RunnerUp {
  PlanCandidate candidate;
  std::string why;  // "23% slower: nvme 1.2 s/step more", "host memory 27.8 GiB over 23.0 GiB"
};

struct Plan {
  std::optional<PlanCandidate> best;  // the fastest that fits
  std::vector<RunnerUp> runners_up;   // the best of each other family (stage, offload places, checkpointing)
  size_t candidates = 0, fitting = 0;
  // When nothing fits: per place the smallest budget with which some candidate fits while the
  // other budgets stay as given (nullopt: none fits by that place alone), and the needs of the
  // candidate with the least memory.
  std::optional<int64_t> min_device_bytes, min_memory_bytes, min_nvme_bytes;
  std::optional<PlanCandidate> smallest;
};

// Searches every candidate the request leaves open (see the header comment).
Plan make_plan(const PlanRequest& request);

// The "auto" sizes (Note [Auto sizes]): reduce and prefetch buckets of the largest unit's padded
// elements, a sub-group size that keeps the staging buffers at an eighth of the offloaded state.
size_t auto_bucket_numel(const std::vector<size_t>& unit_numels, int world);
size_t auto_sub_group_numel(const std::vector<size_t>& unit_numels, int world, int stage, int buffer_count);

// A short label of a candidate's family: "stage 3, optimizer nvme, param cpu, checkpointing".
std::string family_label(const PlanChoice& choice);

}  // namespace zerone::zero
