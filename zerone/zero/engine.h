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
// Thread-safety: driven by the training thread; communication runs on the communicator's thread.
// Errors from a collective (a dead peer) are rethrown as Error from the hook or step() that waits.
#pragma once

#include <deque>
#include <functional>
#include <exception>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "zerone/comm/communicator.h"
#include "zerone/comm/device_communicator.h"
#include "zerone/kernels/backend.h"
#include "zerone/core/memory.h"
#include "zerone/nn/model.h"
#include "zerone/optim/optimizers.h"
#include "zerone/zero/offload.h"
#include "zerone/zero/partition.h"
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
  // `nvme` (SwappedOptimizer); with config.offload_optimizer_ratio below 1 only the first sub-groups
  // go there and the rest stays on the device (Note [Partial optimizer offload] in partition.h,
  // PartialOffloadOptimizer). config.offload_param cpu keeps stage 3's parameter shards on the host.
  // `optimizer` names the optimizer whose state the engine shards (AdamW or SGD, optimizers.h).
  // Throws Error for offload a stage cannot do (optimizer offload at stage 0, parameter offload
  // below stage 3). config.offload_param nvme keeps them in the swap file "params.swp" (Note
  // [Parameter swap]).
  ZeroEngine(nn::Model& model, comm::Communicator& comm, const ZeroConfig& config, const optim::OptimizerOptions& optimizer,
             const Materialize& materialize = nullptr, const NvmeConfig& nvme = NvmeConfig());
  ~ZeroEngine() override;
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // Declares whether the coming backward is the last micro-step of the optimizer step (stages 0
  // and 1 reduce only then).
  void set_last_micro_step(bool last) { last_micro_step_ = last; }

  // Finishes the step: waits for every reduction, clips to `grad_clip` (0: off), updates with
  // `lr`, and brings every rank's parameters up to date. The gradients were computed on the loss
  // times `loss_scale`, which is divided out. With `skip_on_overflow` (fp16 loss scaling) a
  // non-finite gradient norm skips the update, zeroes the gradients and reports overflow;
  // otherwise it throws Error (training diverged). `norm` is the global norm of the averaged,
  // unscaled gradients before clipping.
  struct StepResult {
    double norm = 0.0;
    bool overflow = false;
  };
  StepResult step(float lr, float grad_clip, double loss_scale = 1.0, bool skip_on_overflow = false);

  // Note [Early optimizer step]: announces step()'s arguments before the step's last backward, so
  // that each unit's update can start as soon as its gradients are final, while the backward of
  // the units below it runs. step() must then be called with the same arguments. Without it (or
  // with --delayed-update or config.early_step off) step() updates every unit at the end, as
  // before; the numbers are the same either way. With clipping or loss scaling the early updates
  // are a speculation (Note [Speculative early step]) where speculates(config) (partition.h:
  // config.speculative_step with state on NVMe), and step() validates them, or takes them back
  // and steps at the end; otherwise step() updates every unit at the end.
  void plan_step(float lr, float grad_clip, double loss_scale = 1.0, bool skip_on_overflow = false);

  // What the early step did so far (Note [Speculative early step]), the same on every rank.
  struct EarlyStats {
    int64_t exact = 0;        // early steps without clipping or loss scaling (nothing to validate)
    int64_t validated = 0;    // speculative early steps that the norm confirmed
    int64_t redone = 0;       // taken back because the clip factor was not 1, and stepped at the end
    int64_t skipped = 0;      // taken back because of an fp16 overflow (the step is skipped)
    int64_t held_back = 0;    // stepped at the end because the step before clipped (no speculation)
  };
  const EarlyStats& early_stats() const { return early_stats_; }

  // --delayed-update (Note [Delayed parameter update]): step() measures, clips and hands the
  // gradients to the optimizer thread and returns at once; the model keeps the parameters of the
  // step before until the next step() installs this one's. After the last step the trainer calls
  // finish_delayed_update() so the final model holds every update. No-op without the flag.
  void finish_delayed_update();

  // Runs `fn` with every unit's full parameters present in host-readable memory (stage 3 gathers
  // them first and releases them after; on a device whose memory the host cannot read, the units
  // hold host copies during the call), e.g. to write a checkpoint. Collective: every rank must call it.
  void with_full_params(const std::function<void()>& fn);

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
  const UnitShard& shard(int unit) const { return units_[unit].shard; }
  // With --delayed-update, waits for the update in flight first (the optimizer is not shared).
  optim::Optimizer& optimizer() {
    join_delayed();
    return *optimizer_;
  }

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

 private:
  struct UnitState {
    UnitShard shard;
    Buffer shard_params;  // stage 3, non-persistent: this rank's parameter shard (compute dtype)
    Buffer shard_grads;   // stages 2-3: this rank's f32 gradient accumulator
    Buffer reduce_src;    // stages 2-3: the unit's full gradients while they are reduce-scattered
    Buffer reduce_out;    // stages 2-3: the landing shard when the accumulator already holds a sum
    bool accumulator_zero = true;  // stages 2-3: shard_grads holds nothing yet this step
    std::vector<comm::Work> reduce_work;
    // A gather into the unit's full parameters is in flight: stage 3 from the shard into a pooled
    // buffer; stages 1-2 (and persistent stage-3 units) in place after the update, waited for
    // just before the unit's next use (Note [Gathers overlap the next forward]).
    std::vector<comm::Work> gather_work;  // one per allgather_bucket_size slice; empty: none pending
    // --offload-param nvme (Note [Parameter swap]): the shard's place in params.swp, and while it
    // is in memory its host staging buffer; a read in flight into it (0: none).
    uint64_t swap_offset = 0;
    size_t swap_bytes = 0;
    // Note [Speculative early step]: the spare slot in params.swp the update writes to (==
    // swap_offset: none), made current when the step is validated; swap_dirty: written this step.
    uint64_t swap_spare = 0;
    bool swap_dirty = false;
    // Note [Speculative early step]: where the optimizer reads and writes this unit's parameters
    // (not for swapped shards), and copies of what a speculative update overwrites in memory.
    void* opt_param = nullptr;
    size_t opt_numel = 0;
    Buffer undo_param, undo_optim;
    double sumsq = 0.0;  // of this rank's gradient shard, grad_sumsq (Note [Deterministic gradient norm])
    Buffer staged;
    io::SwapIo::Ticket read_ticket = 0;
    // Note [Gradient swap]: the accumulator's slot in grads.swp, the staging buffer holding it
    // (-1: none), its write in flight (0: none), and the sum of squares of the step's final sum.
    uint64_t grad_offset = 0;
    size_t grad_bytes = 0;
    int grad_buffer = -1;
    io::SwapIo::Ticket grad_write = 0;
    double grad_sumsq = 0.0;
  };

  bool params_sharded(int u) const { return config_.stage == 3 && !units_[u].shard.persistent; }
  bool params_swapped(int u) const { return params_sharded(u) && config_.offload_param == OffloadDevice::nvme; }
  void finish_read(int u);
  void advance_reads();
  void load_shard_for_update(int u);
  void retire_param_writes(size_t keep);
  void launch_reduction(int u);
  void finish_reduction(int u);
  void retire_reductions();
  void ensure_params(int u);
  void start_gather(int u);
  void launch_gather(int u, const char* shard, char* full);
  void wait_gather(int u);
  void release(int u);
  // Position of (phase, unit) in one micro-step's access order: forward 0..U-1, then backward U-1..0.
  int access_index(bool backward, int u) const { return backward ? 2 * num_units_ - 1 - u : u; }
  std::vector<int> touched_at(int access) const;
  void prefetch_after(int access);
  void release_after(int access);
  double reduce_grad_norm_sq(double local_sumsq) const;
  void on_shard_updated(int u);
  StepResult step_delayed(float lr, float grad_clip, double loss_scale, bool skip_on_overflow);
  void join_delayed();
  void install_delayed();
  void early_update(int u, int next);
  void early_after_backward(int u);
  StepResult step_early();
  std::vector<int> take_back_early();  // the units it restored
  double update_at_end(float lr, float grad_scale);
  // After an update: parameter writes done, spare slots current, accumulators fresh.
  void finish_update();
  void skip_step();
  void commit_param_slots();
  // This rank's per-unit gradient sum of squares (Note [Deterministic gradient norm]; swapped
  // gradients: as measured at the last micro-step), and their sum in shard order.
  double unit_grad_sumsq(int u);
  double local_grad_sumsq();

  // The backend that runs on the memory at p (the device's, or the host's for offloaded buffers;
  // Note [Places of pointers] in kernels/backend.h).
  kernels::Backend& backend_of(const void* p) const;
  // acc (n) += in (n), wherever each lives.
  void accumulate_into(float* acc, const float* in, size_t n);
  // The sum of squares of grad (n) (Note [Deterministic gradient norm]), copying it to copy_to.
  double sum_squares_and_copy(const float* grad, size_t n, float* copy_to);
  // Hands fn `bytes` at `data` (memory of `place`) as host memory: itself where the host can read
  // it, else a host copy (checkpoints read device memory this way).
  void with_host_view(const void* data, MemPlace place, size_t bytes, const std::function<void(const void* host)>& fn);

  nn::Model& model_;
  comm::Communicator& comm_;  // host values (the gradient norm)
  ZeroConfig config_;
  // NVMe offload: the run's swap directory, declared before everything that has files in it.
  std::unique_ptr<io::SwapDirectory> swap_dir_;
  int world_, rank_, num_units_;
  kernels::Backend& device_;            // the model's device: every operation on its memory
  comm::DeviceCommunicator device_comm_;  // collectives over device buffers (Note [Collective endpoints])
  std::unique_ptr<ZeroPlusPlus> zeropp_;   // hpZ, qwZ, qgZ (zeropp.h); null when off
  size_t dsize_;
  std::vector<UnitState> units_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  bool last_micro_step_ = true;
  BufferPool pool_;            // stages 2-3: full gradients, gathered parameters, landing shards
  std::deque<int> reducing_;   // stages 2-3: units whose reduce-scatter is in flight, oldest first
  size_t reducing_numel_ = 0;  // their padded elements
  // --offload-param nvme (Note [Parameter swap]).
  BufferPool stage_pool_;      // host staging of parameter shards (idle: host.comm)
  std::string param_path_;
  io::FileDescriptor param_fd_;
  std::unique_ptr<io::SwapIo> param_io_;
  std::deque<std::pair<int, io::SwapIo::Ticket>> param_writes_;  // shards written back after the update
  std::deque<int> pending_reads_;  // units whose shard is being read, in the order the reads started
  int64_t nvme_param_bytes_ = 0;
  int64_t nvme_param_spare_bytes_ = 0;  // Note [Speculative early step]: spare slots in params.swp
  bool pin_staging_ = false;  // offload_*.pin_memory: mlock parameter staging buffers
  Buffer acquire_staging(size_t bytes);
  // Note [Gradient swap].
  bool grads_swapped_ = false;
  SwappedOptimizer* swapped_ = nullptr;  // optimizer_, when the gradients are swapped
  std::string grad_path_;
  io::FileDescriptor grad_fd_;
  std::vector<Buffer> grad_buffers_;     // host.swap
  std::vector<int> grad_buffer_user_;    // the unit holding each (-1: free)
  std::deque<int> grad_writes_;          // units whose slot is being written, oldest first
  int64_t nvme_grad_bytes_ = 0;
  std::unique_ptr<io::SwapIo> grad_io_;  // after the buffers: drained before they go
  float* acquire_grad_buffer(int u);
  void finish_grad_write(int u);
  void load_grad(int u);
  void unload_grad(int u);
  // --delayed-update (Note [Delayed parameter update]). Per optimizer shard: where the reduced
  // gradients land (what the optimizer reads without the flag), the copy the optimizer thread
  // reads, and the parameters it writes (installed into the model at the next step()).
  std::vector<const float*> grad_src_;
  std::vector<Buffer> dpu_grads_, dpu_params_;
  std::thread dpu_worker_;
  std::exception_ptr dpu_error_;
  bool dpu_install_pending_ = false;
  int dpu_threads_ = 1;
  // Note [Early optimizer step].
  struct EarlyPlan {
    bool active = false;   // this step updates units as their gradients become final
    bool begun = false;    // optimizer_->begin_step() was called
    float lr = 0.0f, grad_clip = 0.0f;
    double loss_scale = 1.0;
    bool skip_on_overflow = false;
    bool speculative = false;  // clipping or loss scaling: the updates are validated in step()
    double sumsq = 0.0;    // of the units updated so far
    std::vector<int> waiting;    // backward done, not yet updated (newest last)
    std::vector<char> updated;   // per unit
  } early_;
  bool speculation_ready_ = false;  // undo copies and spare slots exist (config.speculative_step)
  bool speculate_next_ = true;  // the last step did not clip (Note [Speculative early step])
  EarlyStats early_stats_;
  std::vector<int> last_toucher_;  // per unit: the lowest unit whose backward touches it
};

}  // namespace zerone::zero
