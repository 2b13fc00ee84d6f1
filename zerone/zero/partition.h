// ZeRO partition arithmetic (DESIGN §2-§3), shared by the engine and `zerone estimate` so that the
// prediction and the memory ledger agree to the byte.
//
// Unit u has numel_u real elements, padded to P_u = ceil(numel_u / (world*64)) * world*64; rank r
// owns the shard [r*S_u, (r+1)*S_u) with S_u = P_u / world. Per rank, at the end of a step:
//
//   stage | param (compute dtype)        | grad (f32)  | master (f32, bf16 only) | optim (K f32 tensors)
//   0     | sum P_u                      | sum P_u     | sum numel_u             | K sum numel_u
//   1     | sum P_u                      | sum P_u     | sum S_u                 | K sum S_u
//   2     | sum P_u                      | sum S_u     | sum S_u                 | K sum S_u
//   3     | sum S_u (+ P_u persistent)   | sum S_u     | sum S_u                 | K sum S_u
//   3 hpZ | + sum P_u / H (not persistent), ZeRO++'s secondary partition (zeropp.h), on the device
//
// K is the optimizer's state tensors per element (optim::optimizer_state_tensors): AdamW 2 (m, v),
// SGD 1 (momentum buffer) with momentum, else 0.
//
// "persistent" units (numel < stage3_param_persistence_threshold) keep their full parameters at
// stage 3 instead of a shard.
//
// Note [Offload places]: which place (core/memory.h, Note [Places]) each model-state byte lives in:
//   param  full (stages 0-2, persistent units): device; stage-3 shards: --offload-param
//          (none: device, cpu: host, nvme: nvme, each shard rounded up to 4 KiB in "params.swp")
//   grad   stages 0-1 full: device; stages 2-3 shard accumulators: host when the optimizer is
//          offloaded (its step reads them there, as DeepSpeed's CPU gradient partitions), else device;
//          under a partial offload, host for the units with offloaded sub-groups, device for the rest;
//          nvme (each rounded up to 4 KiB in "grads.swp") when Note [Gradient swap] applies;
//          with transient gradients (Note [Transient gradients]) no accumulator per unit but
//          kTransientGradBuffers buffers of the largest shard, on the host with the optimizer
//          offloaded, else on the device
//   delayed update (--delayed-update, Note [Delayed parameter update] in zero/step_scheduler.cc): one more f32
//          gradient copy (grad) and one parameter copy in the compute dtype (param) of each
//          optimizer shard, at least one element each, where the optimizer of that shard runs:
//          host when any of its sub-groups is offloaded, else device
//   master, optim: --offload-optimizer (none: device, cpu: host, nvme: nvme swap files); with a
//          ratio below 1 only a leading part of the sub-groups (Note [Partial optimizer offload]);
//          with nvme and an nvme ratio below 1 only a leading part of the offloaded sub-groups on
//          nvme, the rest on the host (Note [Optimizer state on NVMe and in host memory])
//   swap   with --offload-optimizer nvme: offload_buffer_count host staging buffers, each holding one
//          sub-group's master (bf16/fp16 only) and K state tensors, every tensor rounded up to the 4 KiB
//          O_DIRECT block; the swap file holds every sub-group in the same aligned layout, so the
//          nvme bytes are the aligned sizes (Note [Swap layout] in optim/swapped.h); with swapped
//          gradients also offload_buffer_count host buffers of the largest aligned gradient shard.
//   scratch when speculates(), for every unit but the first: an undo copy of the
//          optimizer's parameter slice (compute dtype, on the parameters' place; for swapped
//          shards a spare 4 KiB-aligned slot in params.swp instead) and of the optimizer state
//          in memory (master unless f32, K state tensors, on its place), or with --offload-optimizer
//          nvme a spare slot for each of its sub-groups (nvme) (Note [Speculative early step]).
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/memory.h"
#include "zerone/io/aio.h"
#include "zerone/optim/swapped.h"

namespace zerone::zero {

inline constexpr size_t kShardAlign = 64;

enum class OffloadDevice : uint8_t { none, cpu, nvme };
const char* offload_device_name(OffloadDevice device);
// "none", "cpu" or "nvme"; throws Error naming `what` (the flag or key) otherwise.
OffloadDevice parse_offload_device(const std::string& text, const std::string& what);
// The place of offloaded bytes: none -> device, cpu -> host, nvme -> nvme.
MemPlace offload_place(OffloadDevice device);

struct ZeroConfig {
  int stage = 0;
  size_t reduce_bucket_numel = 500'000'000;          // reduce_bucket_size (elements)
  size_t allgather_bucket_numel = 500'000'000;       // allgather_bucket_size (elements)
  size_t prefetch_numel = 50'000'000;                // stage3_prefetch_bucket_size (elements)
  size_t persistence_threshold = 100'000;            // stage3_param_persistence_threshold (elements)
  OffloadDevice offload_optimizer = OffloadDevice::none;  // stages 1-3 (Note [Offload places])
  OffloadDevice offload_param = OffloadDevice::none;      // stage 3
  size_t sub_group_numel = 1'000'000'000;            // sub_group_size: optimizer elements per swap unit
  int offload_buffer_count = 4;                      // offload_optimizer.buffer_count (staging buffers)
  double offload_optimizer_ratio = 1.0;              // offload_optimizer.ratio (Note [Partial optimizer offload])
  // With offload_optimizer nvme: the share of the offloaded sub-groups swapped, the first ones; the
  // rest stay in host memory (Note [Optimizer state on NVMe and in host memory]).
  double offload_optimizer_nvme_ratio = 1.0;
  bool delayed_update = false;                       // --delayed-update (Note [Delayed parameter update])
  bool early_step = true;                            // --early-step (Note [Early optimizer step])
  // The trainer's promise that every step is one micro-step whose early updates need no
  // validation (no accumulation, clipping or loss scaling): stages 2-3 then hold each gradient
  // shard only from its reduction to its update (Note [Transient gradients], gradients_transient).
  bool transient_gradients = false;
  // Stages 2-3 with the whole optimizer offloaded: keep the f32 gradient shard sums on the device
  // and stage each to the host for its update (Note [Gradient sums on the device],
  // gradients_on_device); false: the sums are host memory.
  bool grad_sums_on_device = false;
  // The device's memory is the host's (the cpu device): an offloaded update stages nothing
  // between the two (Note [Installing staged operands] in optim/adamw.cc; host_scratch below).
  bool device_is_host_memory = true;
  // The early step may speculate (with clipping or fp16 loss scaling): every unit but the first
  // keeps an undo copy of its in-memory state and a spare swap slot (Note [Speculative early step]).
  bool speculative_step = false;
  // Tests and benchmarks only (ZERONE_SPECULATE=memory / always): speculate without NVMe offload
  // too, where it only costs (docs/BENCHMARKS.md); `always` also after a clipped step.
  bool speculate_in_memory = false;
  bool speculate_always = false;
  // ZeRO++ (zero/zeropp.h), stage 3 only. hpZ: a secondary copy of the parameters partitioned
  // within groups of this many consecutive ranks (1: off). qwZ: the parameter gathers move
  // blockwise int8. qgZ: the gradient reduce-scatter moves blockwise int8 or int4 (0: off).
  int hpz_partition_size = 1;
  bool quantized_weights = false;
  int quantized_gradients_bits = 0;
};

// Whether the engine speculates (Note [Speculative early step]): speculative_step with the early
// step, without --delayed-update, without a partial optimizer offload (ratio below 1, Note
// [Partial optimizer offload]), and with optimizer or parameter state swapped to NVMe (the I/O
// that the early step hides; in memory speculating only costs) or speculate_in_memory.
bool speculates(const ZeroConfig& config);

// Note [Gradient swap]: stages 2-3 with the whole optimizer on NVMe (ratio 1) and no
// --delayed-update keep their f32 gradient shard accumulators in the swap file "grads.swp" (one
// 4 KiB-aligned slot per unit, nvme.grad) instead of memory, staged through offload_buffer_count host
// buffers of the largest slot (host.swap). zero/grad_reducer.cc has the protocol.
bool gradients_swapped(const std::vector<size_t>& unit_numels, int world, int rank, const ZeroConfig& config);

// Note [Transient gradients]: DeepSpeed and FSDP keep every f32 gradient shard of the step until
// the optimizer has run, 4 bytes per parameter of the rank's shard (ZeRO-Offload's 16 host bytes
// per parameter are these 4, the f32 master and the two moments). When each step is a single micro-step and
// the early step's updates are final (no clipping, no loss scaling: Note [Early optimizer step] in
// zero/step_scheduler.cc), unit u's gradient shard is read by exactly one update, made right after
// the backward of the unit below it. So at stages 2-3, with transient_gradients (the trainer's
// promise: one micro-step, no --grad-clip, not fp16), --early-step, no --delayed-update and no
// partial optimizer offload (gradients_transient checks these), the reducer keeps no accumulator
// per unit: unit u's reduce-scatter lands in
// one of kTransientGradBuffers buffers of the largest shard, which its update hands back. Units
// are reduced top down and u+1 is updated after u's backward, so two are held at most: u's while
// it is reduced, u+1's until its update (a tied head's gradient for the embedding, unit 0, waits
// in the embedding's full gradients, which the reduction takes only after the embedding's own
// backward). Where the optimizer is offloaded the buffers are host memory and the shard lands
// there as before; else they are device memory. The same values reach the same update, so the
// trajectory is bit for bit that of held gradients (tests/zero/transient_gradients.sh), and the
// whole grad column of the table above becomes 2 x the largest shard: for Llama-2-13B's shape at
// world 1, 48.5 GiB down to 2.4 GiB. It takes precedence over Note [Gradient swap], whose file
// I/O it also saves.
// Only where the buffers are fewer bytes than the shards they replace: a model of a few uneven
// units (a small classifier whose first layer holds most parameters) keeps its accumulators.
inline constexpr int kTransientGradBuffers = 2;
bool gradients_transient(const std::vector<size_t>& unit_numels, int world, const ZeroConfig& config);

// Note [Gradient sums on the device]: with the optimizer offloaded, stages 2-3 keep each unit's f32
// gradient shard sum in host memory, where the optimizer reads it. With one micro-step a step the
// reduced shard lands there directly. With several, every later micro-step's shard has to be added
// to the sum, which goes to the device and back to be added there (Note [Host sums added on the
// device] in grad_reducer.cc): 8 bytes a parameter of the shard over the host link per micro-step.
// At Llama-2-7B's shape that is 54 GB a micro-step, a second of PCIe against some 0.4 s of GPU
// compute at 2 x 2048 tokens, so gradient accumulation, which is how ZeRO-Offload amortizes its
// CPU optimizer, would be bound by the link. With grad_sums_on_device the sums are device memory
// instead (the accumulators of a run without offload, 4 bytes a parameter of the shard on the
// device), every micro-step adds there, and only the final sum crosses, once a step: before unit
// u's update it is copied into one of kDeviceSumStagingBuffers pinned host buffers of the largest
// shard, started as soon as the last micro-step's reduction of u is added where a buffer is free
// (so that it overlaps the rest of the backward), else at the update, which then also starts the
// copy of the next unit it updates (the update at the end goes bottom up, the backward top down,
// so a copy started early may give its buffer up and be made again). The optimizer reads the
// same f32 sum, added in the same order, so the trajectory is that of host sums bit for bit
// (tests/zero/grad_sums_on_device.sh); the norm is measured on the device, as without offload.
// With --delayed-update there are no staging buffers: the step copies every sum into the
// optimizer's own host gradients anyway (Note [Delayed parameter update]), now from the device.
// Where: stages 2-3, --offload-optimizer cpu or nvme with the whole optimizer offloaded (ratio 1),
// not transient (one micro-step: nothing to add). It takes precedence over Note [Gradient swap].
// (Stage 1 keeps the whole model's f32 gradients on every rank's device, and so has always
// summed there; at world 1 that is the same bytes.)
// The trainer asks for it with --grad-accumulators device, or auto where a device the host cannot
// address accumulates micro-steps and the run still fits every budget with 5% of the device to
// spare (train::fit_grad_sums); its ranks then agree, all on the device or all on the host.
inline constexpr int kDeviceSumStagingBuffers = 2;
// Whether the sums' place is a choice under `config` (its stage and optimizer offload; what
// grad_sums_on_device does not decide), given that the step has micro-steps to add: with one, the
// shards may be transient instead, which gradients_on_device also checks.
bool gradient_sums_placeable(const ZeroConfig& config);
bool gradients_on_device(const std::vector<size_t>& unit_numels, int world, const ZeroConfig& config);

// Note [Partial optimizer offload]: DeepSpeed's offload_optimizer.ratio (stage3.py,
// _create_fp32_partitions) offloads the first int(ratio * n) of the rank's n optimizer sub-groups
// and keeps the rest on the accelerator, gradients included. zerone does the same at stages 1-3,
// with cpu and nvme: the rank's sub-groups are those of its optimizer shards (one per unit, in unit
// order, each cut by sub_group_numel), so the offloaded part of each shard is a leading run of
// whole sub-groups: all of the shards before the boundary, a prefix of the boundary shard, none
// after. The offloaded part runs on the offloaded optimizer (host AdamW/SGD, or the NVMe swap),
// the rest on an in-memory one with its state on the device (optim::SplitOptimizer,
// optim/split_optimizer.h); a unit's f32 gradient shard (stages 2-3) is on the host when any of its
// sub-groups is offloaded, else on the device. The update of every element is the same function
// whichever optimizer runs it, so the trajectory is the one of ratio 1 and of no offload, bit for bit.
// ratio * n is computed in double and truncated, as Python's int() does.
// Not combined with the speculative early step (Note [Speculative early step] in zero/step_scheduler.cc):
// with a ratio below 1 speculates() is false, so with --grad-clip or fp16 the early updates are
// not made and the optimizer steps at the end (the config gives a notice when --early-step is
// given). SplitOptimizer keeps no undo copies and no spare slots; taking back a step
// across its two optimizers is left undone until it is measured to be worth it.
// Per optimizer shard (elements `shard_numels[i]`), how many leading elements are offloaded.
std::vector<size_t> offloaded_prefix(const std::vector<size_t>& shard_numels, size_t sub_group_numel, double ratio);
// Note [Optimizer state on NVMe and in host memory]: ZeRO-Infinity puts the whole optimizer state
// on NVMe or none of it; a model whose state fits neither the host memory nor the disk alone (the
// Llama-2-13B shape's 145 GiB of master and moments on a machine of 128 GiB and a 64 GiB disk) needs
// both. With --offload-optimizer nvme and offload_optimizer_nvme_ratio r below 1, the first
// int(r * m) of the rank's m offloaded sub-groups (in unit order, as offloaded_prefix counts) are
// swapped through optimizer.swp and the staging buffers, and the rest stay in host memory, stepped
// by the host optimizer there, as --offload-optimizer cpu steps them: one optimizer over two parts
// (optim::SplitOptimizer), the same update per element, so the trajectory is that of r = 1 and of
// cpu offload bit for bit (tests/zero/offload_invariance.sh). The swapped sub-groups are the first
// units' (the embedding and the lower blocks): the early step reaches them last, after the host
// ones. The f32 gradient shards stay in host memory (grads.swp needs the whole optimizer on NVMe),
// or are transient (Note [Transient gradients]). Like a partial offload it does not speculate;
// with one (offload_optimizer_ratio below 1 too) the two splits nest: the swapped sub-groups, then
// those in host memory, then those on the device. Per optimizer shard, how many leading elements
// are swapped: all of offloaded_optimizer_numels with ratio 1, else a prefix of them.
std::vector<size_t> nvme_optimizer_numels(const std::vector<size_t>& unit_numels, int world, int rank,
                                          const ZeroConfig& config);

// The optimizer shard of each unit: the rank's shard (stages 1-3) or the whole unit (stage 0).
std::vector<size_t> optimizer_shard_numels(const std::vector<size_t>& unit_numels, int world, int rank,
                                           const ZeroConfig& config);
// offloaded_prefix() of the run's shards, or all zero without optimizer offload.
std::vector<size_t> offloaded_optimizer_numels(const std::vector<size_t>& unit_numels, int world, int rank,
                                               const ZeroConfig& config);

struct UnitShard {
  size_t numel = 0;         // real elements of the unit
  size_t padded_numel = 0;  // P_u
  size_t shard_numel = 0;   // S_u
  size_t shard_begin = 0;   // r * S_u
  bool persistent = false;  // stage 3: full parameters stay resident
};

size_t padded_numel(size_t numel, int world);
UnitShard unit_shard(size_t numel, int world, int rank, const ZeroConfig& config);

// Bytes per (place, category), as the ledger keeps them.
struct PlacedBytes {
  std::array<int64_t, MemoryLedger::kPlaces * MemoryLedger::kCategories> bytes{};
  int64_t& at(MemPlace p, MemCategory c) { return bytes[static_cast<size_t>(p) * MemoryLedger::kCategories + static_cast<size_t>(c)]; }
  int64_t get(MemPlace p, MemCategory c) const { return bytes[static_cast<size_t>(p) * MemoryLedger::kCategories + static_cast<size_t>(c)]; }
  int64_t place_total(MemPlace p) const;
};

// Category totals over all places (param..optim, the table above) and where they live.
// `swap` is the host staging of NVMe offload (not in the category totals).
struct ModelStateBytes {
  int64_t param = 0, grad = 0, master = 0, optim = 0, swap = 0;
  // config.speculative_step (Note [Speculative early step] in zero/step_scheduler.cc): undo copies in
  // memory and spare swap slots on NVMe, as scratch on their places; not in the category totals.
  int64_t speculation = 0;
  PlacedBytes placed;
  int64_t total() const { return param + grad + master + optim; }
  // Bytes held in memory (device + host, including swap staging), i.e. not on NVMe.
  int64_t in_memory() const { return placed.place_total(MemPlace::device) + placed.place_total(MemPlace::host); }
};

// Per-rank model-state bytes at the end of a step (the table above), for an optimizer with
// `optim_tensors` (K) f32 state tensors per element, with the delayed update's copies in param
// and grad and speculation's undo copies and spare slots in scratch.
ModelStateBytes model_state_bytes(const std::vector<size_t>& unit_numels, int world, int rank, DType dtype,
                                  const ZeroConfig& config, int optim_tensors);

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
//   ZeRO++ (stage 3, qwZ and qgZ): their quantized communication buffers, in comm (device) and,
//          for qwZ with --offload-param, host: Note [ZeRO++ working set] in zeropp.h.
// Stages 0-1 have none (their full buffers are model state). Sums run over non-persistent units
// for `param`. A bound, not a prediction: the ledger's `comm` (idle pooled buffers) at the end of
// a step stays at or below `total()`.
//   host (stage 3 with --offload-param nvme): staging of parameter shards read from or written to
//          NVMe (each rounded up to 4 KiB): those of the units in use and prefetched,
//          min(sum A, (P_1 + P_2 + F) / world * dtype + 4096 * units), or during the optimizer step
//          the shard being updated and two being written back, 3 A_1 (A_u: the aligned shard bytes).
//          Pooled like the rest; idle staging is in the ledger as host.comm.
//   host_scratch (stages 1-3 with the optimizer offloaded, on a device whose memory is not the
//          host's): the staging an offloaded update keeps for the operands that live on the device
//          (Note [Installing staged operands] in optim/adamw.cc), kKeptStagingBuffers of the
//          largest offloaded shard, in f32 for f32 parameters or at stage 1 (whose gradients are
//          staged too), else in the compute dtype. In the ledger as host.scratch.
struct WorkingSetBytes {
  int64_t param = 0, grad = 0, comm = 0;  // device
  int64_t host = 0;                       // host staging (see above)
  int64_t host_scratch = 0;               // an offloaded update's kept staging (see above)
  int64_t total() const { return param + grad + comm + host + host_scratch; }
  int64_t device() const { return param + grad + comm; }
  int64_t on_host() const { return host + host_scratch; }
};
WorkingSetBytes working_set_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype,
                                  const ZeroConfig& config);

// How a run's collectives over device buffers move (Note [Staged collective bytes]).
//   direct   no staging: the device's memory is host memory (cpu), or the rank is alone;
//   staged   every collective through host buffers and the host communicator (MPI; sim, or cuda
//            with --comm mpi or ranks sharing a GPU);
//   native   a device communicator (NCCL) takes those whose operands are all device memory; those
//            with a host operand (an offloaded shard or accumulator, a host scalar) are staged.
enum class CollectiveRoute : uint8_t { direct, staged, native };

// Note [Staged collective bytes]: on a device whose memory the host cannot address (sim, cuda),
// DeviceCommunicator stages collectives through host buffers (host.comm in the ledger) that live
// from their submission until they are waited for (Note [Collective endpoints] in
// comm/communicator.h). Per rank, with P the padded units, ds the compute dtype's size and W the
// working set above, a bound on those in flight at once. Route staged:
//   stage 0   the last micro-step's gradient all-reduces, every bucket in flight: 4 sum P;
//   stage 1   its reduce-scatters, 4 P each, all in flight; after the step every unit's
//             parameter all-gather (ds P each), which starts once the reductions ended: 4 sum P;
//   stage 2   reduce-scatters only while their full gradients are held: W.grad; the
//             all-gathers after the step as stage 1: max(W.grad, ds sum P);
//   stage 3   gathers in flight only into gathered buffers, reductions only from held full
//             gradients: W.param + W.grad.
// Route native: only the collectives with a host operand. Stages 0-1 reduce device gradients in
// place and gather the updated parameters from the device: nothing. The reduce-scatters of stages
// 2-3 land in host accumulators (or gradient swap buffers) when the optimizer is offloaded and
// the sums are not on the device (Note [Gradient sums on the device]): W.grad then. Stage 3's gathers read host shards when the parameters are offloaded: W.param then.
// Either route adds kStagedScalarBytes for the scalar all-reduces over host memory (loss, gradient
// norm, overflow flag) that may overlap them; route direct and world 1 stage nothing. ZeRO++'s
// collectives (zeropp.h) are not counted here.
constexpr int64_t kStagedScalarBytes = 64;
int64_t staged_collective_bytes(const std::vector<size_t>& unit_numels, int world, DType dtype,
                                const ZeroConfig& config, CollectiveRoute route = CollectiveRoute::staged);

}  // namespace zerone::zero
