// The optimizer interface of zerone (DESIGN §1, optim/): what the ZeRO engine and the trainer need
// of an optimizer over flat f32 shards, whatever the optimizer (AdamW, SGD) and wherever its state
// lives (the device, the host, NVMe: optim/swapped.h, optim/split_optimizer.h).
//
// The interface is three capabilities, each a small class, that every optimizer has:
//   ShardStepping    update shard by shard (the engine's early and speculative steps) or whole
//   StateCheckpoint  the state as named f32 tensors and a step count (checkpoints, resharding)
//   StepUndo         take an update back (the speculative early step)
// Optimizer is all three; a caller that needs one capability takes that class.
//
// Thread-safety: one thread at a time. Pointers handed in (ShardRef) must outlive the optimizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/memory.h"
#include "zerone/core/pending_sum.h"

namespace zerone::optim {

struct ShardRef {
  void* param = nullptr;         // numel elements of param_dtype, read at construction, written by step()
  const float* grad = nullptr;   // numel f32 gradients (already reduced / averaged); read by step()
  size_t numel = 0;
  // [begin, end) element ranges of this shard that get weight decay; the rest get none.
  std::vector<std::pair<size_t, size_t>> decay_ranges;
};

// Waits for every update's parameters staged on the host to be back on the device, and keeps
// their staging for the next updates (Note [Installing staged operands], optim/adamw.cc; until
// release_kept_staging()). Any thread.
void wait_installs();
// Note [Installing staged operands]: installs in flight at most, and the staging buffers kept (those
// in flight, plus the slice being updated: master or parameters, and a staged gradient at stage 1).
inline constexpr size_t kInstallsInFlight = 2;
inline constexpr size_t kKeptStagingBuffers = kInstallsInFlight + 2;
// Frees the staging wait_installs() keeps (an engine's destruction: its memory leaves the ledger).
void release_kept_staging();
// Installs launched since the process started (a test's evidence that the path is taken).
uint64_t installs_launched();
// Staging buffers made for updates of operands in another place since the process started (the
// rest reuse kept ones: a test's evidence that a step allocates none once warm).
uint64_t staging_allocations();

// Stepping over the shards the engine hands out.
class ShardStepping {
 public:
  virtual ~ShardStepping() = default;
  // One whole step over every shard (AdamW's semantics: see AdamW). `shard_begin(i)`, when given,
  // runs before shard i is read or written: the ZeRO engine loads an NVMe-offloaded parameter
  // shard there and points set_param at it; `shard_done(i)` after shard i is updated. Returns the
  // gradients' sum of squares, pending where the updates ran on a device (Note [Norms read once a
  // step], core/pending_sum.h: reading it waits for the device). The default, for optimizers with per-shard steps, is begin_step,
  // update_shard(0..n-1) in order (each told the next), end_step.
  virtual PendingSum step(float lr, float grad_scale, const std::function<void(size_t shard)>& shard_done = nullptr,
                          const std::function<void(size_t shard)>& shard_begin = nullptr);
  // Where shard i's parameters are from now on (numel elements of the parameter dtype).
  virtual void set_param(size_t i, void* param) = 0;
  // Where shard i's gradients are from now on (numel f32): the ZeRO engine stages swapped
  // gradient shards before each update (Note [Gradient swap] in zero/grad_reducer.h).
  virtual void set_grad(size_t i, const float* grad) = 0;
  virtual size_t num_shards() const = 0;
  virtual size_t numel(size_t i) const = 0;
  virtual const float* grad(size_t i) const = 0;

  // Per-shard stepping, for the ZeRO engine's early step (Note [Early optimizer step] in
  // zero/step_scheduler.cc): begin_step() counts the step and fixes its hyper-parameters, update_shard(i)
  // updates shard i (in any order, each once) and returns its gradients' sum of squares, end_step()
  // waits for whatever the step left in flight. step() is exactly begin_step, update_shard(0..n-1)
  // in order, end_step, so both give the same bits. `next_shard` (or kNoShard) is the shard
  // expected next, for optimizers that read their state ahead. Optimizers that cannot say
  // supports_shard_steps() false, and the engine then steps them whole.
  static constexpr size_t kNoShard = static_cast<size_t>(-1);
  virtual bool supports_shard_steps() const { return false; }
  virtual void begin_step(float lr, float grad_scale) {}
  virtual PendingSum update_shard(size_t i, size_t next_shard = kNoShard) { return 0.0; }
  // The default waits for the step's parameter installs (Note [Installing staged operands]).
  virtual void end_step() { wait_installs(); }
};

// The state as checkpoints see it.
class StateCheckpoint {
 public:
  virtual ~StateCheckpoint() = default;
  // Note [Optimizer state in checkpoints]: an optimizer's state is a list of named f32 tensors of
  // numel(i) elements per shard (AdamW: "master" when it keeps a copy, i.e. not for f32 training,
  // where the parameters are the master; then "exp_avg", "exp_avg_sq", PyTorch's names) and a step
  // count. export_state visits every (shard, tensor) [0, numel) once, in pieces, with the data
  // valid during the call only (a swapped optimizer reads it through its staging buffers);
  // import_state asks for the same pieces to be filled and stores them where the state lives
  // (state_place()). The parameters are not part of it: the engine saves and restores them.
  struct StatePiece {
    size_t shard = 0;
    int tensor = 0;  // index into state_names()
    size_t begin = 0, count = 0;
  };
  virtual std::string type_name() const = 0;  // "adamw", as the DeepSpeed config names it (lower case)
  virtual std::vector<std::string> state_names() const = 0;
  virtual void export_state(const std::function<void(const StatePiece&, const float* data)>& fn) = 0;
  virtual void import_state(const std::function<void(const StatePiece&, float* data)>& fn) = 0;
  virtual int64_t steps_taken() const = 0;
  virtual void set_steps_taken(int64_t steps) = 0;
  // Where the in-memory state lives: the memory export_state hands out and import_state fills,
  // and the undo tensors (StepUndo).
  virtual MemPlace state_place() const { return MemPlace::device; }

  // Note [Checkpoints of swapped state]: an optimizer whose state lives in a file (NVMe offload)
  // can give a checkpoint file extents instead of memory, so that saving copies disk to disk and
  // never reads the state back through memory. record_checksums(valid) makes the next step()
  // compute, as it writes each sub-group, the checksums of its first valid[i] elements of shard i
  // (the rest is padding, not saved) per io::kChecksumBlockBytes block; state_extents() then
  // returns every (shard, tensor) piece with its file, offset and checksums, valid until the next
  // step(), or nothing when the last step did not record them (export_state is the fallback).
  struct StateExtent {
    StatePiece piece;
    std::string path;      // the file holding it (opened by the caller)
    uint64_t offset = 0;   // bytes
    std::vector<uint64_t> checksums;
  };
  virtual void record_checksums(const std::vector<size_t>& valid_numel) {}
  virtual std::vector<StateExtent> state_extents() const { return {}; }
};

// Taking a step back, for the engine's speculative early step (Note [Speculative early step] in
// zero/step_scheduler.cc). update_shard(i) may write two kinds of state: the parameters (the engine keeps
// their undo copy) and the optimizer's own. What of the latter lives in memory is undo_tensors(i),
// undo_numel(i) f32 each (AdamW: master unless the parameters are the master, m, v; none for state
// kept elsewhere), undo_bytes(i) in all, in undo_place(); save_undo copies them to `dst` (memory of
// that place) before the update, restore_undo puts them back. abort_step(), after the shards
// updated in this step were restored, takes back begin_step(): the step count, and what the step
// wrote anywhere else (a swapped optimizer's sub-groups went to their spare slots and are
// forgotten). The next begin_step() then begins the same step again. Call it only before end_step().
class StepUndo {
 public:
  virtual ~StepUndo() = default;
  virtual std::vector<float*> undo_tensors(size_t /*i*/) { return {}; }
  virtual size_t undo_numel(size_t i) const = 0;
  virtual MemPlace undo_place() const = 0;
  size_t undo_bytes(size_t i) { return undo_tensors(i).size() * undo_numel(i) * sizeof(float); }
  void save_undo(size_t i, void* dst);
  void restore_undo(size_t i, const void* src);
  virtual void abort_step() {}
};

// An optimizer: every capability (AdamW and SGD in memory, adamw.h and sgd.h; swapped to NVMe,
// swapped.h; split between two places, split_optimizer.h).
class Optimizer : public ShardStepping, public StateCheckpoint, public StepUndo {
 public:
  size_t undo_numel(size_t i) const final { return numel(i); }
  MemPlace undo_place() const final { return state_place(); }
};

// Calls fn(b, e, weight_decay) for the runs [b, e) of [begin, end) of `shard`, in order: the runs
// inside its decay ranges with `weight_decay`, the others with 0 (decay_ranges are sorted). Shared
// by every optimizer's update_slice.
void for_each_decay_run(const ShardRef& shard, size_t begin, size_t end, float weight_decay,
                        const std::function<void(size_t b, size_t e, float weight_decay)>& fn);

// Note [Operands in another place]: an update runs where its optimizer state lives (run_place:
// the device, or the host with --offload-optimizer). Its gradients and parameters may live
// elsewhere: a shard offloaded to the host updates parameters that stay on the device and reads
// gradients the device produced. Where the device's memory is host memory (the cpu device) that
// changes nothing. Elsewhere each operand in another place is staged: copied into a scratch buffer
// of run_place before the run (gradients, a master that is the parameters themselves) and copied
// back after it (parameters, master; to the device without the host waiting, Note [Installing
// staged operands] in adamw.cc). An update_slice stages its whole slice once for all its decay
// runs. The arithmetic is the same, so the bits are too.
struct RunOperands {
  float* master = nullptr;       // n f32, read and written (may be the f32 parameters themselves)
  const float* grad = nullptr;   // n f32, read
  void* param = nullptr;         // n of the parameter dtype, written; null: none
};
PendingSum run_with_operands_in(MemPlace run_place, DType param_dtype, size_t n, const RunOperands& operands,
                                const std::function<PendingSum(const RunOperands& local)>& run);
// Whether every operand is where an update running in run_place reads it (or the device is host
// memory): run_with_operands_in then runs `run` on them as they are.
bool operands_in(MemPlace run_place, const RunOperands& operands);
// master (n f32, in master_place) = param (n of param_dtype, wherever it lives) widened to f32.
void load_master(float* master, MemPlace master_place, const void* param, DType param_dtype, size_t n);

}  // namespace zerone::optim
