// SGD with momentum, dampening, Nesterov momentum and weight decay, with PyTorch's semantics
// (torch.optim.SGD), over flat f32 shards: the same ShardRef contract as AdamW (adamw.h), so the
// ZeRO engine shards its state exactly like Adam's. Per element, with g the gradient times
// grad_scale and p the f32 master:
//   g += weight_decay * p                  (inside the shard's decay ranges)
//   momentum != 0:  b = g at the first step, else b = momentum * b + (1 - dampening) * g
//                   g = g + momentum * b (nesterov) or g = b
//   p -= lr * g
// State: the f32 master (category `master`; none for f32 training, where the parameters are the
// master) and, when momentum != 0, the momentum buffer b (category `optim`), on `state_place`.
// Updates run on the state place's backend (kernels/cpu/sgd.h is the arithmetic's spec).
// Nesterov needs momentum > 0 and dampening 0 (as PyTorch requires); the constructor throws Error
// otherwise.
//
// Thread-safety: one thread at a time. Pointers handed in must outlive the optimizer.
#pragma once

#include <string>
#include <vector>

#include "zerone/optim/adamw.h"

namespace zerone::optim {

struct SGDOptions {
  float momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
};

class SGD final : public Optimizer {
 public:
  SGD(std::vector<ShardRef> shards, DType param_dtype, const SGDOptions& options,
      MemPlace state_place = MemPlace::device);

  // As AdamW::step: updates every shard in order with learning rate `lr`, gradients times
  // grad_scale; returns the sum of squares of the (unscaled) gradients; leaves them as they were.
  void set_param(size_t i, void* param) override { shards_[i].param = param; }
  void set_grad(size_t i, const float* grad) override { shards_[i].grad = grad; }
  // Per-shard stepping (Optimizer): step() is begin_step, update_shard(0..n-1), end_step.
  bool supports_shard_steps() const override { return true; }
  void begin_step(float lr, float grad_scale) override;
  PendingSum update_shard(size_t i, size_t next_shard = kNoShard) override;
  // Taking a step back (Optimizer; Note [Speculative early step] in zero/step_scheduler.cc): the state
  // update_shard(i) writes besides the parameters is the master (unless the parameters are the
  // master) and the momentum buffer (unless momentum is 0).
  std::vector<float*> undo_tensors(size_t i) override { return state_tensors(i); }
  MemPlace state_place() const override { return state_place_; }
  void abort_step() override {
    --step_;
    wait_installs();  // Note [Installing staged operands]
  }
  size_t num_shards() const override { return shards_.size(); }
  size_t numel(size_t i) const override { return shards_[i].numel; }
  const float* grad(size_t i) const override { return shards_[i].grad; }
  // f32 master of shard i; its momentum buffer (null when momentum is 0).
  float* master(size_t i);
  float* momentum_buffer(size_t i) { return state_[i].momentum.empty() ? nullptr : state_[i].momentum.as<float>(); }
  // Note [Optimizer state in checkpoints] (adamw.h): "master" (not for f32 parameters) and
  // "momentum_buffer" (PyTorch's name; none without momentum).
  std::string type_name() const override { return "sgd"; }
  std::vector<std::string> state_names() const override;
  void export_state(const std::function<void(const StatePiece&, const float* data)>& fn) override;
  void import_state(const std::function<void(const StatePiece&, float* data)>& fn) override;
  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t steps) override { step_ = steps; }

  // Updates elements [begin, end) of `shard` (master and momentum point at element `begin`'s
  // state; momentum null when options.momentum is 0). `first` marks the first step (the buffer
  // is initialized to the gradient). Returns the gradients' sum of squares. The run happens in
  // run_place (Note [Operands in another place] in optimizer.h).
  static PendingSum update_slice(MemPlace run_place, const ShardRef& shard, DType param_dtype,
                                 const SGDOptions& options, float lr, float grad_scale, bool first, size_t begin,
                                 size_t end, float* master, float* momentum);

 private:
  struct State {
    Buffer master, momentum;
  };
  std::vector<ShardRef> shards_;
  std::vector<State> state_;
  DType param_dtype_;
  SGDOptions options_;
  MemPlace state_place_;
  int64_t step_ = 0;
  float lr_ = 0.0f, grad_scale_ = 1.0f;  // of the step begun last
  bool first_ = false;                  // it is the first step (the momentum buffer = gradient)
  std::vector<float*> state_tensors(size_t i);  // of shard i, in state_names() order
};

}  // namespace zerone::optim
