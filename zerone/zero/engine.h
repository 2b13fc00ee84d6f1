// The ZeRO engine: data parallelism over a Communicator with stages 0-3 (DESIGN §3), used for every
// run (world size 1 is stage 0 over the single-process communicator).
//
//   stage 0  full params, full grads; each unit's grads are all-reduced (in buckets) as soon as its
//            backward of the last micro-step finishes; every rank updates the whole model.
//   stage 1  as 0, but the unit's grads are reduce-scattered in place at the accumulation boundary;
//            each rank updates its shard and the shards are all-gathered back, overlapping the
//            later shards' updates and the next forward.
//   stage 2  full grads exist only while a unit's backward runs and while they are reduced: after
//            every micro-step's backward of a unit its grads are reduce-scattered into the rank's
//            f32 shard accumulator and the full buffer goes back to the pool once reduced (at the
//            latest when more than reduce_bucket_size elements are in flight).
//   stage 3  as 2, and parameters are sharded too: a unit is all-gathered before its forward and
//            again before its backward, released after use, and the next units are prefetched
//            (stage3_prefetch_bucket_size); units below stage3_param_persistence_threshold stay whole.
//
// Reductions are sums; the division by world size is folded into the optimizer's gradient scale,
// so one fused pass updates, zeroes and measures the gradients (kernels/cpu/adamw.h).
//
// The engine is four parts, wired here (docs/ARCHITECTURE.md §3):
//   ParamStore     (param_store.h)    where each unit's parameters live; gather, release, prefetch,
//                                     the parameter swap
//   GradReducer    (grad_reducer.h)   the reductions of stages 0-3, the accumulators, the gradient swap
//   StepScheduler  (step_scheduler.h) when the optimizer steps: at the end, early, speculative, delayed
//   the optimizer  (optim/)           AdamW or SGD, in memory, swapped to NVMe or partly offloaded
//
// Thread-safety: driven by the training thread; communication runs on the communicator's thread.
// Errors from a collective (a dead peer) are rethrown as Error from the hook or step() that waits.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zerone/comm/communicator.h"
#include "zerone/comm/device_communicator.h"
#include "zerone/core/memory.h"
#include "zerone/kernels/backend.h"
#include "zerone/nn/model.h"
#include "zerone/optim/optimizers.h"
#include "zerone/optim/swapped.h"  // NvmeConfig
#include "zerone/zero/grad_reducer.h"
#include "zerone/zero/param_store.h"
#include "zerone/zero/partition.h"
#include "zerone/zero/step_scheduler.h"
#include "zerone/zero/zeropp.h"

namespace zerone::zero {

class ZeroEngine : public nn::UnitHooks {
 public:
  // Note [Materializing units]: takes over the model's storage one unit at a time. A unit without
  // parameter storage is allocated and filled by `materialize(u)` (initialization or a checkpoint;
  // identical on every rank); then the engine keeps what the stage needs (stage 3: only this rank's
  // shard of non-persistent units) and frees the rest before the next unit, so no rank ever holds
  // the whole model when the stage does not require it (DeepSpeed's zero.Init). Full gradients
  // are allocated for stages 0-1 only.
  using Materialize = std::function<void(int unit)>;
  //
  // Offload (Note [Offload places] in partition.h): config.offload_optimizer cpu puts master,
  // moments and the stage 2-3 gradient shards on the host; nvme swaps master and moments through
  // `nvme` (optim::SwappedOptimizer); with config.offload_optimizer_ratio below 1 only the first sub-groups
  // go there and the rest stays on the device (Note [Partial optimizer offload] in partition.h,
  // optim::SplitOptimizer). config.offload_param cpu keeps stage 3's parameter shards on the host.
  // `optimizer` names the optimizer whose state the engine shards (AdamW or SGD, optim/optimizers.h).
  // Throws Error for offload a stage cannot do (optimizer offload at stage 0, parameter offload
  // below stage 3). config.offload_param nvme keeps them in the swap file "params.swp" (Note
  // [Parameter swap]).
  // `native_comm` (null: none), a communicator that takes device buffers directly over the same
  // ranks as `comm` (NCCL, comm/comm_choice.h), runs the collectives over device memory; it must
  // outlive the engine. Without it they are staged through `comm` where the device needs it.
  ZeroEngine(nn::Model& model, comm::Communicator& comm, const ZeroConfig& config, const optim::OptimizerOptions& optimizer,
             const Materialize& materialize = nullptr, const optim::NvmeConfig& nvme = optim::NvmeConfig(),
             comm::Communicator* native_comm = nullptr);
  ~ZeroEngine() override;
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // Declares whether the coming backward is the last micro-step of the optimizer step (stages 0
  // and 1 reduce only then).
  void set_last_micro_step(bool last) { grads_->set_last_micro_step(last); }

  // Finishes the step: waits for every reduction, clips to `grad_clip` (0: off), updates with
  // `lr`, and brings every rank's parameters up to date. The gradients were computed on the loss
  // times `loss_scale`, which is divided out. With `skip_on_overflow` (fp16 loss scaling) a
  // non-finite gradient norm skips the update, zeroes the gradients and reports overflow;
  // otherwise it throws Error (training diverged). `norm` is the global norm of the averaged,
  // unscaled gradients before clipping.
  StepResult step(float lr, float grad_clip, double loss_scale = 1.0, bool skip_on_overflow = false);

  // Note [Early optimizer step]: announces step()'s arguments before the step's last backward, so
  // that each unit's update can start as soon as its gradients are final, while the backward of
  // the units below it runs. step() must then be called with the same arguments. Without it (or
  // with --delayed-update or config.early_step off) step() updates every unit at the end, as
  // before; the numbers are the same either way. With config.transient_gradients (Note [Transient
  // gradients] in partition.h) it is required before every step's backward, with no clipping and
  // no loss scaling: an internal invariant, the process aborts otherwise. With clipping or loss scaling the early updates
  // are a speculation (Note [Speculative early step]) where speculates(config) (partition.h:
  // config.speculative_step with state on NVMe), and step() validates them, or takes them back
  // and steps at the end; otherwise step() updates every unit at the end.
  void plan_step(float lr, float grad_clip, double loss_scale = 1.0, bool skip_on_overflow = false);

  // What the early step did so far (Note [Speculative early step]), the same on every rank.
  const EarlyStats& early_stats() const { return scheduler_->early_stats(); }

  // --delayed-update (Note [Delayed parameter update]): step() measures, clips and hands the
  // gradients to the optimizer thread and returns at once; the model keeps the parameters of the
  // step before until the next step() installs this one's. After the last step the trainer calls
  // finish_delayed_update() so the final model holds every update. No-op without the flag.
  void finish_delayed_update();

  // Runs `fn` with every unit's full parameters present in host-readable memory (stage 3 gathers
  // them first and releases them after; on a device whose memory the host cannot read, the units
  // hold host copies during the call), e.g. to write a checkpoint. Collective: every rank must call it.
  void with_full_params(const std::function<void()>& fn);

  // Unit u's full parameters, present in host-readable memory while a HeldUnit lives: stage 3
  // gathers a sharded unit and releases it at the end; on a device whose memory the host cannot
  // read, the unit holds a host copy meanwhile. Collective where the unit is sharded: every rank
  // holds the same units in the same order. Note [Streaming save]: a save that holds one unit at a
  // time (train/export.h) needs one unit beside the shards, never the whole model.
  class HeldUnit {
   public:
    HeldUnit(ZeroEngine& engine, int u);
    ~HeldUnit();
    HeldUnit(const HeldUnit&) = delete;
    HeldUnit& operator=(const HeldUnit&) = delete;

   private:
    ZeroEngine& engine_;
    int unit_;
    bool gathered_ = false;
    Buffer on_device_;  // the unit's device buffer while it holds a host copy
  };

  // Note [Checkpoint state]: a checkpoint holds the engine's state in unit coordinates (element e
  // of unit u's flat, unpadded buffer), the same at every world size, stage and offload: "param" in
  // the compute dtype and each optimizer state tensor in f32 (optim::Optimizer::state_names; the
  // f32 "master" of f32 training is "param" itself). Every rank saves the elements of its ZeRO
  // partition, [r*S_u, (r+1)*S_u) clipped to numel_u, at every stage: stage 0 holds all of them
  // but saves 1/world, so the ranks write in parallel and the pieces tile each tensor once.
  // Gradients are not state: a checkpoint is taken between steps, when none are pending.
  using StateSink = std::function<void(int unit, const std::string& tensor, DType dtype, size_t begin, size_t count,
                                       const void* data)>;
  // Hands this rank's pieces to `sink` (data valid during the call only). Not collective; call
  // between steps. Reads NVMe-resident parameters and optimizer state through staging buffers.
  void save_state(const StateSink& sink) { save_state(sink, nullptr); }
  // The same, with an optimizer whose state lives in a file handing `extent_sink` file extents
  // for it (Note [Checkpoints of swapped state]) when the last step was prepared with
  // prepare_checkpoint(); otherwise everything goes to `sink`.
  using ExtentSink = std::function<void(int unit, const std::string& tensor, size_t begin, size_t count,
                                        const std::string& path, uint64_t offset, const std::vector<uint64_t>& checksums)>;
  void save_state(const StateSink& sink, const ExtentSink& extent_sink);
  // Call before the step() that a checkpoint will follow: a swapped optimizer then records the
  // checksums that let the checkpoint copy its state disk to disk.
  void prepare_checkpoint();
  // Fills every optimizer state tensor of this rank's shards from `source` (elements
  // [begin, begin+count) of `tensor` of `unit`, f32) and sets the optimizer's step count. The
  // parameters come in through Materialize. Not collective; call right after construction.
  using StateSource = std::function<void(int unit, const std::string& tensor, size_t begin, size_t count, float* out)>;
  void load_optimizer_state(const StateSource& source, int64_t optimizer_steps);
  // "param" followed by the optimizer's state names.
  std::vector<std::string> state_tensors() const;

  const ZeroConfig& config() const { return config_; }
  const UnitShard& shard(int unit) const { return params_->shard(unit); }
  // With --delayed-update, waits for the update in flight first (the optimizer is not shared).
  optim::Optimizer& optimizer() {
    scheduler_->join_delayed();
    return *optimizer_;
  }

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

 private:
  // Throws Error for settings no engine can run (the stage, bucket sizes, offload combinations).
  static void check(const ZeroConfig& config, int world);
  // `config` once check() passed (the constructor's first step, before anything is sized from it).
  static const ZeroConfig& checked(const ZeroConfig& config, int world);
  // Note [Streaming construction]: materializes each unit, hands it to the parameter store and the
  // gradient reducer, and returns the optimizer's shards; `optimizer_params` and
  // `optimizer_numels` get where the optimizer writes each unit's parameters in memory (null for a
  // swapped shard) and how many elements, and `delayed` (when not null) redirects each shard to
  // its own copies.
  std::vector<optim::ShardRef> take_over_units(const Materialize& materialize, bool stream_params,
                                               const std::vector<size_t>& offloaded, DelayedUpdate* delayed,
                                               std::vector<void*>& optimizer_params,
                                               std::vector<size_t>& optimizer_numels);
  // Fills unit u's parameters through `materialize` on the device (Note [Materializing on a device]).
  void materialize_unit(int u, const Materialize& materialize);

  nn::Model& model_;
  comm::Communicator& comm_;
  ZeroConfig config_;
  int world_, rank_, num_units_;
  kernels::Backend& device_;              // the model's device: every operation on its memory
  comm::DeviceCommunicator device_comm_;  // collectives over device buffers (Note [Collective endpoints])
  size_t dsize_;
  // NVMe offload: the run's swap directory, declared before everything that has files in it.
  std::unique_ptr<io::SwapDirectory> swap_dir_;
  BufferPool pool_;  // stages 2-3: full gradients, gathered parameters, landing shards
  std::unique_ptr<ZeroPlusPlus> zeropp_;  // hpZ, qwZ, qgZ (zeropp.h); null when off
  // The parts, destroyed in reverse: the delayed update's thread is joined first, then each part
  // drains its own I/O and collectives before its buffers go.
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<GradReducer> grads_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<StepScheduler> scheduler_;
};

}  // namespace zerone::zero
