#include "zerone/zero/cost_model.h"

#include <algorithm>
#include <cmath>

#include "zerone/core/error.h"

namespace zerone::zero {

// Note [Cost model]: per rank and optimizer step, with T = micro_batch x seq x grad_accum tokens,
// N the model's elements, P the padded elements, S the rank's shard, f = (world - 1) / world:
//   compute   flops_per_token x T (x 4/3 with activation checkpointing: one more forward of the
//             6 N per token) / (GEMM peak x kGemmEfficiency). The peak is the measured 1024^3 one
//             (a GPU's: 8192^3 through its backend, Note [Device speeds]).
//   memory    kActivationTrafficFactor x activation bytes x micro-steps (x 4/3 with recompute)
//             / memory bandwidth: the elementwise kernels, softmax and layer norms stream their
//             activations; CPU checkpointing adds a copy out and back of the saved block inputs.
//   optimizer the step streams, per element it updates (N at stage 0, S above): the f32 gradient,
//             master (bf16/fp16) and K state tensors read and written back, the parameter
//             written; AdamW in bf16: 4 + 2x4 + 2x2x4 + 2 = 30 bytes. Offloading the optimizer to
//             the host adds the copies of the gradient shard there and the parameters back over
//             host_device_bytes_per_s (on a CPU build a memory copy); at stages 2-3 on a separate
//             device each later micro-step's shard is added to the host's sum on the device, the
//             sum going there and back (Note [Host sums added on the device]): 4 bytes per element
//             for the first micro-step, 8 more for each later one (added, not overlapped); with
//             the sums on the device (Note [Gradient sums on the device]) 4 bytes once a step.
//   nvme      bytes read and written under --nvme-path over disk bandwidth / ranks per host:
//             optimizer state (master + K tensors) read and written once per step; swapped
//             gradient accumulators (Note [Gradient swap]) read and written once per micro-step;
//             swapped parameter shards read in forward and backward (and recompute) of every
//             micro-step and written at the step; plus io_latency_s per transfer.
//             Overlap, as the engine achieves it: the optimizer's swap with at least 2 staging
//             buffers is pipelined with the step (pipeline_read / pipeline_write), so it costs
//             max(step, I/O) plus one sub-group's read and write to fill the pipeline; with one
//             buffer they add. Parameter reads are prefetched while earlier units compute when
//             the prefetch window holds the next unit (stage3_prefetch_bucket_size >= the
//             largest unit), else they add. Gradient swap adds.
//   comm      ring collectives, per rank: stage 0 all-reduces the gradients once per step
//             (2 f P x 4 bytes), stage 1 reduce-scatters them once (f P x 4) and all-gathers the
//             updated parameters (f P x dtype), stage 2 reduce-scatters every micro-step, stage 3
//             gathers the parameters for forward, backward (and recompute) of every micro-step
//             and reduce-scatters every micro-step; plus link_latency_s per call (one per bucket
//             of reduce_bucket_size elements, at least one per unit). Not overlapped: on a CPU
//             the collectives and the kernels share the same cores and memory.
//   transfer  a separate device only (Note [Device speeds]): with --offload-param cpu the shard of
//             every parameter gather comes over from the host (padded / world x dtype bytes per
//             gather, as often as the NVMe parameter reads above) and the part of the shard the
//             device updated goes back once per step, at host_device_bytes_per_s; prefetched under
//             compute on the same rule as the NVMe parameter reads. With --offload-param nvme the
//             shards cross the link too, pipelined with the disk: the slower of the two bounds
//             their reads. With the device separate, the memory term and the
//             optimizer's on-device share take device_memory_bytes_per_s, the offloaded share of
//             the optimizer the host's memory_bytes_per_s.
// The terms then add: compute, memory, optimizer (or the overlapped swap), un-hidden I/O, comm,
// un-hidden host-device copies.
// The engine's early step (the optimizer during the rest of backward) is not counted as overlap
// for the same reason as communication. What it leaves out: kernel launch and Python-free
// overheads per unit (small), the cost of --delayed-update's thread, ZeRO++ quantization.

std::string StepCost::bottleneck() const {
  std::pair<double, const char*> terms[] = {
      {compute_s, "compute"}, {memory_s, "memory"},  {optimizer_s, "optimizer"},
      {nvme_s, "nvme"},       {comm_s, "comm"},      {transfer_s, "transfer"}};
  return std::max_element(std::begin(terms), std::end(terms))->second;
}

StepCost step_cost(const StepWorkload& w, const ZeroConfig& c, const StageEstimate& e, const MachineSpeed& m) {
  ZERONE_ASSERT(m.gemm_flop_per_s > 0 && m.memory_bytes_per_s > 0 && w.world >= 1 && w.grad_accum >= 1);
  StepCost out;
  const double micro_steps = w.grad_accum;
  const double tokens = static_cast<double>(w.micro_batch) * w.seq * micro_steps;
  const double recompute = w.activation_checkpointing ? 4.0 / 3.0 : 1.0;
  // Note [Device speeds]: the device's own memory, or host memory where the device is the host.
  const bool separate_device = m.device_memory_bytes_per_s > 0;
  const double device_bw = separate_device ? m.device_memory_bytes_per_s : m.memory_bytes_per_s;
  const double copy_bw = m.host_device_bytes_per_s > 0 ? m.host_device_bytes_per_s : m.memory_bytes_per_s;
  out.compute_s = w.flops_per_token * tokens * recompute / (m.gemm_flop_per_s * kGemmEfficiency);
  // CPU checkpointing's copies out and back cross the host link of a separate device.
  const double checkpoint_copies = w.cpu_checkpointing ? 2.0 * static_cast<double>(w.host_activation_bytes) : 0.0;
  if (separate_device) {
    out.memory_s = (kActivationTrafficFactor * static_cast<double>(w.activation_bytes) * recompute / device_bw +
                    checkpoint_copies / copy_bw) * micro_steps;
  } else {
    out.memory_s = (kActivationTrafficFactor * static_cast<double>(w.activation_bytes) * recompute + checkpoint_copies) *
                   micro_steps / m.memory_bytes_per_s;
  }

  // Elements the optimizer updates on this rank, the padded total, the largest unit.
  double stepped = 0, padded = 0, largest = 0, units = 0;
  for (size_t n : w.unit_numels) {
    const UnitShard s = unit_shard(n, w.world, 0, c);
    stepped += static_cast<double>(c.stage == 0 ? n : s.shard_numel);
    padded += static_cast<double>(s.padded_numel);
    largest = std::max(largest, static_cast<double>(s.padded_numel));
    units += 1;
  }
  const double ds = static_cast<double>(dtype_size(w.dtype));
  const double master = w.dtype == DType::f32 ? 0.0 : 1.0;
  const double bytes_per_element = 4.0 + 2.0 * 4.0 * (master + w.optim_tensors) + ds;
  // A separate device steps its share in its own memory, the host the offloaded share in host
  // memory; offloading adds the copies of the gradient shard over and the parameters back (which
  // stay on the host where the parameters are offloaded there too: the transfer term below counts
  // their way to the device).
  const double offloaded = c.offload_optimizer != OffloadDevice::none ? stepped * c.offload_optimizer_ratio : 0.0;
  const bool params_on_host = separate_device && c.offload_param == OffloadDevice::cpu;
  double step_s = separate_device ? (stepped - offloaded) * bytes_per_element / device_bw +
                                        offloaded * bytes_per_element / m.memory_bytes_per_s
                                  : stepped * bytes_per_element / m.memory_bytes_per_s;
  // At stages 2-3 on a separate device every later micro-step also takes the host's sum to the
  // device and back (Note [Host sums added on the device]): 8 bytes more each.
  // Note [Gradient sums on the device]: there only the final sum crosses.
  const bool host_sums = c.stage >= 2 && separate_device && !gradients_on_device(w.unit_numels, w.world, c);
  const double grad_crossings = host_sums ? 2.0 * micro_steps - 1.0 : 1.0;
  if (offloaded > 0) step_s += offloaded * (4.0 * grad_crossings + (params_on_host ? 0.0 : ds)) / copy_bw;

  // Swap traffic (bytes per step on this rank) from the estimate's NVMe places.
  const double disk_bw = m.disk_bytes_per_s > 0 ? m.disk_bytes_per_s / std::max(1, w.ranks_per_host) : 0.0;
  auto nvme_bytes = [&](MemCategory cat) {
    return static_cast<double>(e.model_state.placed.get(MemPlace::nvme, cat));
  };
  const double opt_io = 2.0 * (nvme_bytes(MemCategory::master) + nvme_bytes(MemCategory::optim));
  const double grad_io = 2.0 * micro_steps * nvme_bytes(MemCategory::grad);
  const double param_reads = (w.activation_checkpointing ? 3.0 : 2.0) * micro_steps;
  const double param_io = (param_reads + 1.0) * nvme_bytes(MemCategory::param);
  double opt_s = step_s, hidden_param_s = 0, exposed_io_s = 0;
  if (opt_io + grad_io + param_io > 0) {
    ZERONE_ASSERT(disk_bw > 0);
    // The swapped sub-groups (Note [Optimizer state on NVMe and in host memory]: with an NVMe
    // ratio below 1 only the first ones).
    double sub_groups = 0;
    for (size_t n : nvme_optimizer_numels(w.unit_numels, w.world, 0, c))
      sub_groups += std::ceil(static_cast<double>(n) / static_cast<double>(c.sub_group_numel));
    const double opt_transfers = opt_io > 0 ? 2.0 * (master + w.optim_tensors) * sub_groups : 0.0;
    const double opt_io_s = opt_io / disk_bw + opt_transfers * m.io_latency_s;
    if (opt_io > 0 && c.offload_buffer_count >= 2) {
      const double one_group = std::min(static_cast<double>(c.sub_group_numel), stepped);
      const double fill_s = 2.0 * (master + w.optim_tensors) * one_group * 4.0 / disk_bw;
      opt_s = std::max(step_s, opt_io_s) + fill_s;
    } else {
      opt_s = step_s + opt_io_s;
    }
    exposed_io_s = grad_io / disk_bw + (grad_io > 0 ? 2.0 * micro_steps * units * m.io_latency_s : 0.0);
    double param_s = param_io / disk_bw + (param_io > 0 ? (param_reads + 1.0) * units * m.io_latency_s : 0.0);
    // On a separate device the shards read also cross the host link, pipelined with the disk
    // (Note [Device speeds]): the slower of the two bounds them.
    if (separate_device && param_io > 0) param_s = std::max(param_s, param_io / copy_bw);
    if (param_io > 0 && static_cast<double>(c.prefetch_numel) >= largest) hidden_param_s = param_s;
    else exposed_io_s += param_s;
    out.nvme_s = exposed_io_s + (opt_s - step_s);
  }
  out.optimizer_s = step_s;

  if (w.world > 1) {
    const double f = (w.world - 1.0) / w.world;
    const double bucket = std::max(static_cast<double>(c.reduce_bucket_numel), largest);
    const double reduce_calls = std::max(units, std::ceil(padded / bucket));
    double bytes = 0, calls = 0;
    switch (c.stage) {
      case 0: bytes = 2.0 * f * padded * 4.0; calls = reduce_calls; break;
      case 1: bytes = f * padded * (4.0 + ds); calls = reduce_calls + units; break;
      case 2: bytes = f * padded * (4.0 * micro_steps + ds); calls = reduce_calls * micro_steps + units; break;
      default: {
        const double gathers = (w.activation_checkpointing ? 3.0 : 2.0) * micro_steps;
        bytes = f * padded * (4.0 * micro_steps + ds * gathers);
        calls = reduce_calls * micro_steps + units * gathers;
      }
    }
    const double link_bw = m.link_bytes_per_s > 0 ? m.link_bytes_per_s : m.memory_bytes_per_s;
    out.comm_s = bytes / link_bw + calls * m.link_latency_s;
  }
  // Note [Device speeds]: parameter shards held by the host cross to a separate device at every
  // gather (prefetched as the NVMe reads are) and back once per step.
  // (Parameters are offloaded to the host or to NVMe, never both: at most one of them is hidden.)
  // The write-back is the shard the device updated: what the host's optimizer updates is there.
  double hidden_copy_s = 0;
  if (params_on_host) {
    const double gathers = (w.activation_checkpointing ? 3.0 : 2.0) * micro_steps;
    const double copies_s = (gathers * padded / w.world + (stepped - offloaded)) * ds / copy_bw;
    if (static_cast<double>(c.prefetch_numel) >= largest) hidden_copy_s = copies_s;
    else out.transfer_s = copies_s;
  }
  const double compute_total = out.compute_s + out.memory_s;
  const double hidden_s = std::max(hidden_param_s, hidden_copy_s);
  out.total_s = std::max(compute_total, hidden_s) + opt_s + exposed_io_s + out.comm_s + out.transfer_s;
  // The hidden parameter I/O or copies that compute could not cover show as NVMe or host-device time.
  (hidden_copy_s > 0 ? out.transfer_s : out.nvme_s) += std::max(compute_total, hidden_s) - compute_total;
  return out;
}

}  // namespace zerone::zero
