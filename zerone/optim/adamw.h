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
// variant (optim/swapped.h) shares the update through AdamW::update_slice, so every placement
// computes bit for bit the same numbers.
//
// Thread-safety: one thread at a time. Pointers handed in must outlive the optimizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/memory.h"
#include "zerone/kernels/backend.h"
#include "zerone/optim/optimizer.h"

namespace zerone::optim {


struct AdamWOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};


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
  // The run happens in run_place (master, m and v live there; Note [Operands in another place]).
  static PendingSum update_slice(MemPlace run_place, const ShardRef& shard, DType param_dtype,
                                 const AdamWOptions& options, kernels::AdamWHyper h, size_t begin, size_t end,
                                 float* master, float* m, float* v);

  // One update with learning rate `lr`; every gradient is multiplied by grad_scale first
  // (clipping factor / inverse loss scale). Reads the gradients and leaves them as they were: the
  // caller overwrites them next (Note [Fresh gradients] in nn/flat_param.h), so zeroing them would
  // be a wasted write stream. Increments the step count. Returns the
  // sum of squares of the gradients it consumed (unscaled), so that callers that do not clip get
  // the gradient norm without another pass. Shards are updated in order; `shard_done(i)`, when
  // given, runs as soon as shard i's parameters are written (the ZeRO engine starts gathering
  // them while the later shards update).
  void set_param(size_t i, void* param) override { shards_[i].param = param; }
  void set_grad(size_t i, const float* grad) override { shards_[i].grad = grad; }
  bool supports_shard_steps() const override { return true; }
  void begin_step(float lr, float grad_scale) override;
  PendingSum update_shard(size_t i, size_t next_shard = kNoShard) override;
  std::vector<float*> undo_tensors(size_t i) override;
  MemPlace state_place() const override { return state_place_; }
  void abort_step() override {
    --step_;
    wait_installs();  // Note [Installing staged operands]
  }

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
  int step_ = 0;
  kernels::AdamWHyper h_{};  // of the step begun last
};

}  // namespace zerone::optim
