// The run's side of the memory planner (zero/planner.h): the machine's budgets and speeds
// (measured here or given), the planner's request built from a run's settings (what the user
// gave is held fixed), a plan applied back to the settings (so --print-config / `zerone plan --out`
// writes a config that `zerone train --config` runs unchanged), the plan as a table and as JSON,
// `--auto-fit`, and the advice of every "does not fit" refusal (Note [Advice that leads somewhere]).
//
// Ownership: plain values. Failure: throws Error naming the flag for bad input (a budget below 0,
// an unreadable --nvme-path). Thread-safety: measurement runs kernels on the calling thread's
// OpenMP team; the rest are pure functions except auto_fit, which talks to the communicator.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zerone/comm/communicator.h"
#include "zerone/nn/model.h"
#include "zerone/train/config.h"
#include "zerone/zero/planner.h"

namespace zerone::train {

// The machine flags of `zerone plan` (and of --auto-fit: all measured). 0 / negative: measure.
struct PlanMachineOptions {
  int ranks_per_host = 0;        // 0: all of the world on this host
  double host_mem_gib = 0;       // per host; 0: the memory available now (what train's start-up check uses)
  double disk_free_gib = -1;     // under --nvme-path; -1: statvfs of it
  double gemm_tflops = 0;        // per rank; 0: measured with every core, divided among the host's ranks
  double memory_gbps = 0;        // per rank; 0: measured (a streaming copy)
  double disk_gbps = 0;          // 0: measured under --nvme-path (a 64 MiB write and read)
  double link_gbps = 0;          // per rank; 0: the memory bandwidth within a host, 1.25 GB/s across hosts
  // Note [Device speeds]: a GPU's own memory and its link to the host, GB/s; 0: measured on the GPU
  // (as gemm_tflops is then the GPU's). Refused where the device is host memory.
  double device_memory_gbps = 0;
  double host_device_gbps = 0;
};

struct PlanMachine {
  zero::MemoryBudget budget;
  zero::MachineSpeed speed;
  std::vector<std::string> sources;  // how each figure was obtained, for the report
};

// Whether the run's device is this host's RAM (Note [Fit]): --device cpu or sim, or no --device
// where the default device is the cpu.
bool unified_memory(const TrainConfig& cfg);
bool unified_memory(kernels::DeviceKind device);

// Note [Device budget]: the device bytes per rank a run may fill with what the estimate counts
// (its device() bytes, the ledger's). On cpu and sim the device is host memory (Note [Fit] in
// zero/planner.h): only --device-mem-limit caps it. On cuda the GPU's usable bytes cap it too
// (kernels::DeviceMemory::usable_bytes: free, and before the process has a CUDA context total less
// the context's reserve; Note [Device memory the ledger cannot see] in
// kernels/backend.h), the smaller of the two when both are known; a GPU not present here (nullopt
// memory) leaves the limit alone. The start-up check passes the backend's measurement, estimate
// and plan kernels::device_memory(kind) (no backend made).
struct DeviceBudget {
  int64_t bytes = 0;   // per rank; 0: no cap
  std::string source;  // what set it, for messages: "--device-mem-limit 2 GiB", "the GPU's ..."
};
DeviceBudget device_budget(kernels::DeviceKind device, double device_mem_limit_gib,
                           const std::optional<kernels::DeviceMemory>& memory);

// Note [Gradient sums on the device] (zero/partition.h): with --grad-accumulators auto, `zcfg`
// (zero_config of `cfg`) keeps the sums on the device only where the estimate of the run at
// `stage` (micro-batch of cfg, `seq`) with them fits `budget` in every place (Note [Fit]), the
// device with kAutoDeviceHeadroom of its bytes to spare; else they are host memory, as before.
// Returns zcfg, so changed or not. Ranks decide alike only where their budgets are alike: the
// trainer agrees over its ranks after this.
inline constexpr double kAutoDeviceHeadroom = 0.05;
zero::ZeroConfig fit_grad_sums(const TrainConfig& cfg, const nn::Model& model, DType dtype, int world, int seq,
                               int stage, zero::ZeroConfig zcfg, const zero::MemoryBudget& budget,
                               zero::CollectiveRoute route);

// A model without storage made to estimate or plan the run of `cfg` counts the activations and the
// backend's scratch of the run's device (--device, --cuda-attention; Note [Attention's saved state]
// in kernels/backend.h, Note [Backend scratch] in kernels/scratch.h), which need not be the device
// installed here.
void count_for_run_device(nn::Model& shape, const TrainConfig& cfg);

// How a run of `cfg` at `world` ranks will move its collectives (Note [Staged collective bytes] in
// zero/partition.h): the trainer's choice of library (comm::choose_comm_library, Note [Choosing
// NCCL]) assuming each rank has a GPU of its own; ranks sharing one run MPI, as --comm mpi says.
// Throws Error for a --comm nccl that cannot run on the run's device or in this build.
zero::CollectiveRoute planned_collective_route(const TrainConfig& cfg, int world);

// Budgets and speeds for a run of `cfg` at `world` ranks. Measures what `options` leaves open.
PlanMachine plan_machine(const TrainConfig& cfg, int world, DType dtype, const PlanMachineOptions& options);

// The planner's request for `cfg` on `shape` (a model without storage; its checkpointing flags are
// switched while planning). Settings the user gave are held fixed; the micro-batch is free when
// --train-batch-size is given without --micro-batch.
zero::PlanRequest plan_request(const TrainConfig& cfg, nn::Model& shape, DType dtype, int world,
                               const PlanMachine& machine);

// Writes the choice into `cfg` (and marks those settings given), so that effective_config_json
// writes them.
void apply_plan(const zero::PlanChoice& choice, TrainConfig& cfg);

// The plan as a table (chosen settings, bytes per place and category, predicted s/step, the
// runners-up with why they lost, or when nothing fits the smallest budget per place) and as JSON.
std::string plan_text(const zero::Plan& plan, const zero::PlanRequest& request, const PlanMachine& machine,
                      const TrainConfig& cfg, size_t runners_up);
nlohmann::ordered_json plan_json(const zero::Plan& plan, const zero::PlanRequest& request, const PlanMachine& machine,
                                 const TrainConfig& cfg);
// {"device.param": bytes, ...}: every nonzero (place, category), as the metrics' "mem" names them.
nlohmann::ordered_json places_json(const zero::PlacedBytes& bytes);
// The settings flags of a choice: "--zero-stage 3 --offload-optimizer nvme ...".
std::string choice_flags(const zero::PlanChoice& choice);

// Bytes of each buffer of the host memory probe (Note [Host memory speed with every core], plan.cc)
// on a machine whose last-level cache totals `cache_bytes` and with `available_bytes` of memory
// left to this process (either 0: unknown): twice the cache, within 256 MiB .. 1 GiB, and at most
// an eighth of what is available (the two buffers a quarter), though never under 64 MiB.
size_t memory_probe_bytes(long long cache_bytes, long long available_bytes);

// `zerone plan` with the run's own flags (model, batch, precision, world, budgets, --config).
std::string plan_command(const TrainConfig& cfg, int world, int ranks_per_host);

// Note [Advice that leads somewhere]: for a run `cfg` whose estimate `mine` overflows `budget`,
// the categories that overflow and the settings that fix it, each checked by the estimate; never
// what is already set or cannot exist. Ends with the `zerone plan` command line.
// `model` is read for its spec and shapes only.
std::string fit_advice(const TrainConfig& cfg, const nn::Model& model, DType dtype, int world,
                       const zero::MemoryBudget& budget, const zero::StageEstimate& mine);

// `zerone train --auto-fit`: plans `cfg` (rank 0 measures the machine and broadcasts it, so every
// rank computes the same plan), prints the plan on rank 0 and returns the settings to run.
// Throws Error naming the smallest budgets when nothing fits.
TrainConfig auto_fit(TrainConfig cfg, comm::Communicator& comm);

}  // namespace zerone::train
