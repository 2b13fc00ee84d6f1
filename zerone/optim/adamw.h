// AdamW over flat f32 shards (DESIGN §2: "fp32 master shard + optimizer state owned by the
// optimizer").
//
// The optimizer is given the shards it owns: for each, the parameter slice in the compute dtype,
// the matching f32 gradient slice, and which sub-ranges are weight-decayed. It allocates the f32
// master copy (category `master`; none for f32 training, where the parameters are the master) and
// the first/second moments (category `optim`). step() updates master, m and v and writes the
// parameters back rounded to the compute dtype (RNE). At world size 1 the shard is the whole unit;
// the ZeRO engine hands in each rank's slice, so the same code serves every stage.
//
// The state lives on `state_place` (device, or host for --offload-optimizer cpu) and the updates
// run on that place's backend (kernels::backend_for), the parameters and gradients handed in being
// memory of the same place; the NVMe-swapped
// variant (zero/offload.h) shares the update through AdamW::update_slice, so every placement
// computes bit for bit the same numbers.
//
// Thread-safety: one thread at a time. Pointers handed in must outlive the optimizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/memory.h"
#include "zerone/kernels/backend.h"

namespace zerone::optim {

struct ShardRef {
  void* param = nullptr;         // numel elements of param_dtype, read at construction, written by step()
  const float* grad = nullptr;   // numel f32 gradients (already reduced / averaged); read by step()
  size_t numel = 0;
  // [begin, end) element ranges of this shard that get weight decay; the rest get none.
  std::vector<std::pair<size_t, size_t>> decay_ranges;
};

struct AdamWOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};

// What the ZeRO engine needs of an optimizer over flat shards (AdamW in memory, or swapped).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One whole step over every shard (AdamW's semantics: see AdamW). `shard_begin(i)`, when given,
  // runs before shard i is read or written: the ZeRO engine loads an NVMe-offloaded parameter
  // shard there and points set_param at it; `shard_done(i)` after shard i is updated. Returns the
  // gradients' sum of squares. The default, for optimizers with per-shard steps, is begin_step,
  // update_shard(0..n-1) in order (each told the next), end_step.
  virtual double step(float lr, float grad_scale, const std::function<void(size_t shard)>& shard_done = nullptr,
                      const std::function<void(size_t shard)>& shard_begin = nullptr);
  // Where shard i's parameters are from now on (numel elements of the parameter dtype).
  virtual void set_param(size_t i, void* param) = 0;
  virtual size_t num_shards() const = 0;
  virtual size_t numel(size_t i) const = 0;
  virtual const float* grad(size_t i) const = 0;

  // Note [Optimizer state in checkpoints]: an optimizer's state is a list of named f32 tensors of
  // numel(i) elements per shard (AdamW: "master" when it keeps a copy, i.e. not for f32 training,
  // where the parameters are the master; then "exp_avg", "exp_avg_sq", PyTorch's names) and a step
  // count. export_state visits every (shard, tensor) [0, numel) once, in pieces, with the data
  // valid during the call only (a swapped optimizer reads it through its staging buffers);
  // import_state asks for the same pieces to be filled and stores them where the state lives. The
  // parameters are not part of it: the engine saves and restores them.
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

  // Per-shard stepping, for the ZeRO engine's early step (Note [Early optimizer step] in
  // zero/engine.cc): begin_step() counts the step and fixes its hyper-parameters, update_shard(i)
  // updates shard i (in any order, each once) and returns its gradients' sum of squares, end_step()
  // waits for whatever the step left in flight. step() is exactly begin_step, update_shard(0..n-1)
  // in order, end_step, so both give the same bits. `next_shard` (or kNoShard) is the shard
  // expected next, for optimizers that read their state ahead. Optimizers that cannot say
  // supports_shard_steps() false, and the engine then steps them whole.
  static constexpr size_t kNoShard = static_cast<size_t>(-1);
  virtual bool supports_shard_steps() const { return false; }
  virtual void begin_step(float lr, float grad_scale) {}
  virtual double update_shard(size_t i, size_t next_shard = kNoShard) { return 0.0; }
  virtual void end_step() {}

  // Taking a step back, for the engine's speculative early step (Note [Speculative early step] in
  // zero/engine.cc). update_shard(i) may write two kinds of state: the parameters (the engine
  // keeps their undo copy) and the optimizer's own. What of the latter lives in memory is
  // undo_tensors(i), numel(i) f32 each (AdamW: master unless the parameters are the master, m, v;
  // none for state kept elsewhere), undo_bytes(i) in all; save_undo copies them to `dst` before
  // the update, restore_undo puts them back. abort_step(), after the
  // shards updated in this step were restored, takes back begin_step(): the step count, and what
  // the step wrote anywhere else (a swapped optimizer's sub-groups went to their spare slots and
  // are forgotten). The next begin_step() then begins the same step again. Call it only before
  // end_step().
  virtual std::vector<float*> undo_tensors(size_t /*i*/) { return {}; }
  // Where undo_tensors live (the place of save_undo's `dst` too).
  virtual MemPlace state_place() const { return MemPlace::device; }
  size_t undo_bytes(size_t i) { return undo_tensors(i).size() * numel(i) * sizeof(float); }
  void save_undo(size_t i, void* dst);
  void restore_undo(size_t i, const void* src);
  virtual void abort_step() {}
};

// Calls fn(b, e, weight_decay) for the runs [b, e) of [begin, end) of `shard`, in order: the runs
// inside its decay ranges with `weight_decay`, the others with 0 (decay_ranges are sorted). Shared
// by every optimizer's update_slice.
void for_each_decay_run(const ShardRef& shard, size_t begin, size_t end, float weight_decay,
                        const std::function<void(size_t b, size_t e, float weight_decay)>& fn);

// AdamW's state names for parameters of `param_dtype` (Note [Optimizer state in checkpoints]).
std::vector<std::string> adamw_state_names(DType param_dtype);

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ShardRef> shards, DType param_dtype, const AdamWOptions& options,
        MemPlace state_place = MemPlace::device);

  // The hyper-parameters of step number `step` (1-based).
  static kernels::AdamWHyper hyper(const AdamWOptions& options, float lr, float grad_scale, int step);
  // Updates elements [begin, end) of `shard`: `master`, `m`, `v` point at element `begin`'s state
  // (master may be the parameters themselves for f32). Applies weight decay where the shard's
  // decay ranges say. Returns the gradients' sum of squares. The only update code of every placement.
  // `backend` runs on the memory of every pointer involved.
  static double update_slice(kernels::Backend& backend, const ShardRef& shard, DType param_dtype,
                             const AdamWOptions& options, kernels::AdamWHyper h, size_t begin, size_t end, float* master,
                             float* m, float* v);

  // One update with learning rate `lr`; every gradient is multiplied by grad_scale first
  // (clipping factor / inverse loss scale). Reads the gradients and leaves them as they were: the
  // caller overwrites them next (Note [Fresh gradients] in nn/flat_param.h), so zeroing them would
  // be a wasted write stream. Increments the step count. Returns the
  // sum of squares of the gradients it consumed (unscaled), so that callers that do not clip get
  // the gradient norm without another pass. Shards are updated in order; `shard_done(i)`, when
  // given, runs as soon as shard i's parameters are written (the ZeRO engine starts gathering
  // them while the later shards update).
  void set_param(size_t i, void* param) override { shards_[i].param = param; }
  bool supports_shard_steps() const override { return true; }
  void begin_step(float lr, float grad_scale) override;
  double update_shard(size_t i, size_t next_shard = kNoShard) override;
  std::vector<float*> undo_tensors(size_t i) override;
  MemPlace state_place() const override { return state_place_; }
  void abort_step() override { --step_; }

  size_t num_shards() const override { return shards_.size(); }
  size_t numel(size_t i) const override { return shards_[i].numel; }
  const float* grad(size_t i) const override { return shards_[i].grad; }
  // f32 master, m and v of shard i (numel elements each).
  float* master(size_t i);
  float* m(size_t i) { return state_[i].m.as<float>(); }
  float* v(size_t i) { return state_[i].v.as<float>(); }

  std::string type_name() const override { return "adamw"; }
  std::vector<std::string> state_names() const override { return adamw_state_names(param_dtype_); }
  void export_state(const std::function<void(const StatePiece&, const float* data)>& fn) override;
  void import_state(const std::function<void(const StatePiece&, float* data)>& fn) override;
  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t steps) override { step_ = static_cast<int>(steps); }

 private:
  struct State {
    Buffer master, m, v;
  };
  std::vector<ShardRef> shards_;
  std::vector<State> state_;
  DType param_dtype_;
  AdamWOptions options_;
  MemPlace state_place_;
  kernels::Backend& backend_;  // of state_place_
  int step_ = 0;
  kernels::AdamWHyper h_{};  // of the step begun last
};

}  // namespace zerone::optim
