// The ZeRO engine's step scheduler: when and how the optimizer steps the shards whose gradients
// the reducer summed, with the parameters the store keeps.
//
//   at the end    step(): every unit, after the whole backward (clipping and fp16 overflow need
//                 the global norm first).
//   early         plan_step() then step(): each unit as soon as its gradients are final, while the
//                 backward of the units below it runs (Note [Early optimizer step]).
//   speculative   early, with clipping or loss scaling, validated once the norm is known and taken
//                 back bit for bit when it does not hold (Note [Speculative early step]).
//   delayed       --delayed-update: on a thread of its own beside the next step's forward and
//                 backward, one step stale (Note [Delayed parameter update], DelayedUpdate).
//
// Every path updates each shard with the same call on the same gradients, so parameters and
// optimizer state are those of the plain step bit for bit; the reported norm is the plain step's
// (Note [Deterministic gradient norm]).
//
// Thread-safety: the training thread, except the delayed update's optimizer thread, which only
// touches the optimizer and the DelayedUpdate's own buffers. Errors from the optimizer thread are
// rethrown by the next call that joins it.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "zerone/comm/communicator.h"
#include "zerone/core/memory.h"
#include "zerone/kernels/backend.h"
#include "zerone/nn/model.h"
#include "zerone/optim/optimizer.h"
#include "zerone/zero/grad_reducer.h"
#include "zerone/zero/param_store.h"
#include "zerone/zero/partition.h"

namespace zerone::zero {

// What a step did. `norm` is the global norm of the averaged, unscaled gradients before clipping;
// `overflow`: fp16 loss scaling found a non-finite gradient and the step was skipped.
struct StepResult {
  double norm = 0.0;
  bool overflow = false;
};

// What the early step did so far (Note [Speculative early step]), the same on every rank.
struct EarlyStats {
  int64_t exact = 0;        // early steps without clipping or loss scaling (nothing to validate)
  int64_t validated = 0;    // speculative early steps that the norm confirmed
  int64_t redone = 0;       // taken back because the clip factor was not 1, and stepped at the end
  int64_t skipped = 0;      // taken back because of an fp16 overflow (the step is skipped)
  int64_t held_back = 0;    // stepped at the end because the step before clipped (no speculation)
};

// Note [Delayed parameter update] (step_scheduler.cc): the optimizer's own copies of the rank's
// gradients and parameters, and the thread that steps them.
class DelayedUpdate {
 public:
  DelayedUpdate() = default;
  ~DelayedUpdate();  // joins the thread (its error, if any, is dropped: the owner is unwinding)
  DelayedUpdate(const DelayedUpdate&) = delete;
  DelayedUpdate& operator=(const DelayedUpdate&) = delete;

  // Construction, per optimizer shard in order: the optimizer is to read a copy of `ref`'s
  // gradients and write parameters of its own, both in `place` (where the shard's optimizer runs);
  // the copy of the parameters starts from `ref.param` (memory of `param_place`). Rewrites `ref`.
  void redirect(optim::ShardRef& ref, MemPlace place, MemPlace param_place, DType param_dtype, kernels::Backend& device);

  size_t num_shards() const { return grad_src_.size(); }
  // Where the reducer left shard i's gradients / the optimizer's copy of them.
  const float* reduced_grads(size_t i) const { return grad_src_[i]; }
  float* optimizer_grads(size_t i) { return grads_[i].as<float>(); }
  // The parameters the optimizer wrote for shard i, and their place.
  const void* fresh_params(size_t i) const { return params_[i].data(); }
  MemPlace fresh_place(size_t i) const { return params_[i].place(); }

  // Starts `optimizer`.step(lr, grad_scale) on the optimizer thread, which first waits for
  // `installs` (the copies still reading the parameters it is to overwrite); installing its
  // result is pending from then on.
  void start(optim::ShardStepping& optimizer, float lr, float grad_scale, std::vector<Event> installs);
  // Waits for the update in flight, if any; rethrows its error.
  void join();
  // Whether a finished update waits to be installed; take_pending() clears it.
  bool take_pending() { return std::exchange(install_pending_, false); }

 private:
  std::vector<const float*> grad_src_;
  std::vector<Buffer> grads_, params_;
  std::thread worker_;
  std::exception_ptr error_;
  // When the last update ran on the worker (the profiler's work: join()); written by the worker,
  // read after it is joined.
  std::chrono::steady_clock::time_point worker_began_{}, worker_ended_{};
  bool install_pending_ = false;
  int threads_ = 1;
};

class StepScheduler {
 public:
  // `optimizer` steps one shard per unit; `optimizer_params[u]` is where it writes unit u's
  // parameters in memory (null for a swapped shard) and `optimizer_numels[u]` how many elements
  // (Note [Speculative early step]: the undo copies). `delayed` is null without --delayed-update.
  // With speculates(config) every unit but the first gets undo buffers (scratch, in the ledger).
  StepScheduler(nn::Model& model, comm::Communicator& comm, const ZeroConfig& config, kernels::Backend& device,
                ParamStore& params, GradReducer& grads, optim::Optimizer& optimizer,
                std::unique_ptr<DelayedUpdate> delayed, const std::vector<void*>& optimizer_params,
                const std::vector<size_t>& optimizer_numels);
  StepScheduler(const StepScheduler&) = delete;
  StepScheduler& operator=(const StepScheduler&) = delete;

  // ZeroEngine::plan_step and step (engine.h has the contract).
  void plan_step(float lr, float grad_clip, double loss_scale, bool skip_on_overflow);
  StepResult step(float lr, float grad_clip, double loss_scale, bool skip_on_overflow);
  // After unit u's backward (and its reduction was launched): the early step's updates.
  void after_backward(int u);

  // --delayed-update: waits for the update in flight / and installs it into the model (the
  // install complete when this returns).
  void join_delayed() {
    if (delayed_) delayed_->join();
  }
  void install_delayed();

  const EarlyStats& early_stats() const { return early_stats_; }

 private:
  // Note [Speculative early step]: where the optimizer writes unit u's parameters in memory, and
  // copies of what a speculative update overwrites; the unit's measured sum of squares.
  struct UnitUndo {
    void* optimizer_param = nullptr;
    size_t optimizer_numel = 0;
    Buffer param, optim;
    PendingSum sumsq;
  };
  int num_units() const { return static_cast<int>(undo_.size()); }
  double global_norm_sq(double local_sumsq) const;
  PendingSum local_sumsq() const;
  void on_shard_updated(int u);
  StepResult step_delayed(float lr, float grad_clip, double loss_scale, bool skip_on_overflow);
  // --delayed-update: starts installing the finished update (if one is pending) into the model;
  // the Events of its copies (Note [Installing the update behind the gradients' copy]).
  std::vector<Event> launch_installs();
  void early_update(int u, int next);
  StepResult step_early();
  std::vector<int> take_back_early();  // the units it restored
  PendingSum update_at_end(float lr, float grad_scale);
  // After an update: parameter writes done, spare slots current, accumulators fresh.
  void finish_update();
  void drop_gradients();

  nn::Model& model_;
  comm::Communicator& comm_;  // host values (the gradient norm)
  const ZeroConfig config_;
  kernels::Backend& device_;
  ParamStore& params_;
  GradReducer& grads_;
  optim::Optimizer& optimizer_;
  std::unique_ptr<DelayedUpdate> delayed_;
  int world_;
  size_t dsize_;
  std::vector<UnitUndo> undo_;
  // Note [Early optimizer step].
  struct EarlyPlan {
    bool active = false;   // this step updates units as their gradients become final
    bool begun = false;    // optimizer_.begin_step() was called
    float lr = 0.0f, grad_clip = 0.0f;
    double loss_scale = 1.0;
    bool skip_on_overflow = false;
    bool speculative = false;  // clipping or loss scaling: the updates are validated in step()
    PendingSum sumsq;      // of the units updated so far (Note [Norms read once a step])
    std::vector<int> waiting;    // backward done, not yet updated (newest last)
    std::vector<char> updated;   // per unit
  } early_;
  bool speculation_ready_ = false;  // undo copies and spare slots exist (config.speculative_step)
  bool speculate_next_ = true;  // the last step did not clip (Note [Speculative early step])
  EarlyStats early_stats_;
  std::vector<int> last_toucher_;  // per unit: the lowest unit whose backward touches it
};

}  // namespace zerone::zero
