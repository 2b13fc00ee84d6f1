// The step-time model of `zerone plan` (zero/planner.h): predicted seconds per optimizer step of
// one rank for a set of ZeRO settings, from the machine's measured speeds (GEMM throughput, memory,
// disk and link bandwidth) and the run's shape. It ranks candidate plans; it is not a profiler
// (Note [Cost model] states what it assumes; docs/BENCHMARKS.md compares it with real runs).
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/zero/estimate.h"
#include "zerone/zero/partition.h"

namespace zerone::zero {

// Speeds of one rank's share of the machine. All > 0 where they are used.
// Note [Device speeds]: on a GPU (--device cuda) the device is a machine of its own: its GEMMs,
// its memory (HBM) and the link to the host (PCIe) have speeds that say nothing of the host's, so
// `device_memory_bytes_per_s` > 0 marks a separate device and the terms that run there take the
// device's figures (the GEMM rate is then the GPU's); where it is 0 (cpu, sim) the device is host
// memory and every term takes memory_bytes_per_s.
struct MachineSpeed {
  double gemm_flop_per_s = 0;        // the device's measured GEMM peak (train::plan_machine)
  double memory_bytes_per_s = 0;     // host memory: streaming copy (read + write counted), per rank
  double device_memory_bytes_per_s = 0;  // a separate device's own memory, per rank; 0: host memory
  double disk_bytes_per_s = 0;       // swap reads and writes under --nvme-path, per host (shared by its ranks)
  double link_bytes_per_s = 0;       // collective bytes per rank per second (ring algorithms)
  double host_device_bytes_per_s = 0;  // device <-> host copies (the device host memory: memory_bytes_per_s)
  double link_latency_s = 50e-6;     // per collective call
  double io_latency_s = 200e-6;      // per swap transfer (one sub-group tensor or one unit's shard)
};

// What the cost model reads of a run besides its ZeroConfig.
struct StepWorkload {
  std::vector<size_t> unit_numels;  // the model's units (nn::Model::unit_numels)
  double flops_per_token = 0;       // Note [Model FLOPs] (train/throughput.h); recompute is added here
  int micro_batch = 1, seq = 1, grad_accum = 1;
  int world = 1, ranks_per_host = 1;
  DType dtype = DType::f32;
  int optim_tensors = 2;            // optim::optimizer_state_tensors
  bool activation_checkpointing = false, cpu_checkpointing = false;
  // Activation bytes of one micro-batch without checkpointing (the traffic of the memory-bound
  // kernels), and those moved to the host per micro-step with CPU checkpointing.
  int64_t activation_bytes = 0, host_activation_bytes = 0;
};

// Seconds per optimizer step, by term (Note [Cost model]).
struct StepCost {
  double compute_s = 0;    // GEMM FLOPs (with recompute) at the calibrated share of the peak
  double memory_s = 0;     // activation traffic of the memory-bound kernels, CPU-checkpoint copies
  double optimizer_s = 0;  // the optimizer step's memory traffic and offload copies
  double nvme_s = 0;       // swap I/O not hidden behind compute or the optimizer step
  double comm_s = 0;       // collectives (bytes over the link, plus a latency per call)
  double transfer_s = 0;   // a separate device's parameter copies from the host not hidden behind compute
  double total_s = 0;
  // The largest term's name ("compute", "memory", "optimizer", "nvme", "comm", "transfer").
  std::string bottleneck() const;
};

// The predicted step time of `config` (its stage, offload places, buckets, sub-groups) for
// `work` on `speed`. `estimate` is zero::estimate()'s row for the same settings (its NVMe bytes
// are the swap traffic).
StepCost step_cost(const StepWorkload& work, const ZeroConfig& config, const StageEstimate& estimate,
                   const MachineSpeed& speed);

// Note [Cost model] calibration: the share of the 1024^3 GEMM peak a training step's GEMMs reach,
// and the activation bytes the memory-bound kernels move per activation byte kept (read in
// forward, written and read again in backward). Fitted once against runs on the development
// machine (docs/BENCHMARKS.md "Cost model").
inline constexpr double kGemmEfficiency = 0.6;
inline constexpr double kActivationTrafficFactor = 3.0;

}  // namespace zerone::zero
