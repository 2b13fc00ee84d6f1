// The ZeRO engine's gradient reducer: sums every unit's gradients over the ranks as backward
// produces them, in the layout the stage keeps (engine.h has the stages):
//
//   stage 0  the unit's full gradients are all-reduced in place, in buckets of reduce_bucket_size,
//            once the last micro-step's backward of the unit is done.
//   stage 1  the full gradients are reduce-scattered in place at the accumulation boundary; the
//            rank's shard of the sum is where the optimizer reads it.
//   stages 2-3 after every micro-step's backward of a unit its full gradients (a pooled buffer)
//            are reduce-scattered into the rank's f32 shard accumulator and go back to the pool once
//            reduced, at the latest when more than reduce_bucket_size elements are in flight. With
//            the whole optimizer on NVMe the accumulators live in grads.swp (Note [Gradient swap]);
//            with one micro-step a step and final early updates there are none, only two buffers
//            a shard passes through on its way to its update (Note [Transient gradients]); with
//            the optimizer offloaded they are device memory only where the run asks for it (Note
//            [Gradient sums on the device]), each staged to the host for its update.
//
// The reducer also measures each unit's gradient sum of squares the way every step path measures
// it (Note [Deterministic gradient norm]).
//
// Thread-safety: the training thread only; collectives run on the communicator's thread. Errors
// of a collective or of swap I/O are rethrown as Error where they are waited for.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "zerone/comm/device_communicator.h"
#include "zerone/core/memory.h"
#include "zerone/io/aio.h"
#include "zerone/kernels/backend.h"
#include "zerone/nn/model.h"
#include "zerone/optim/optimizer.h"
#include "zerone/optim/swapped.h"
#include "zerone/zero/partition.h"
#include "zerone/zero/zeropp.h"

namespace zerone::zero {

// Where stages 2-3 keep the rank's f32 gradient shards (partition.h: gradients_swapped,
// gradients_transient).
enum class GradStore : uint8_t {
  accumulators,  // one accumulator per unit, on the host or the device
  swapped,       // grads.swp, staged through host buffers (Note [Gradient swap])
  transient,     // none: kTransientGradBuffers buffers held from reduction to update (Note [Transient gradients])
  device_sums,   // on the device, each staged to a host buffer for its offloaded update (Note [Gradient sums on the device])
};

class GradReducer {
 public:
  // Lays out the accumulators of the units `shards` (stages 2-3: on the host for the units in
  // `host_accumulators`, the units whose optimizer shard is offloaded; else on the device) and,
  // with GradStore::swapped, grads.swp in `swap_dir` (which must outlive the reducer) with
  // offload_buffer_count staging buffers; with GradStore::transient only kTransientGradBuffers
  // buffers of the largest shard, in the accumulators' place; with GradStore::device_sums every
  // accumulator on the device and kDeviceSumStagingBuffers host buffers of the largest shard.
  // `pool`: the engine's working-set pool.
  // `zeropp` (null: off; must outlive the reducer) reduce-scatters as ZeRO++'s qgZ when it quantizes.
  // Throws Error for a full disk, an I/O failure or staging that cannot be locked in memory.
  GradReducer(nn::Model& model, const ZeroConfig& config, std::vector<UnitShard> shards,
              const std::vector<char>& host_accumulators, kernels::Backend& device, comm::DeviceCommunicator& comm,
              BufferPool& pool, GradStore store, io::SwapDirectory* swap_dir, const optim::NvmeConfig& nvme,
              ZeroPlusPlus* zeropp);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  bool swapped() const { return store_ == GradStore::swapped; }
  bool transient() const { return store_ == GradStore::transient; }
  bool device_sums() const { return store_ == GradStore::device_sums; }
  // Where the optimizer reads unit u's reduced gradients (its shard, or at stage 0 the whole
  // unit); null when swapped, transient or device_sums (handed to the optimizer before each update,
  // stage_for_update). Allocates stage 2-3
  // accumulators and stage 0-1 full gradients. Call once per unit, in order, at construction.
  const float* adopt(int u);
  // Where the optimizer of `optimizer` reads gradients; stage_for_update and unstage point it.
  void attach(optim::ShardStepping& optimizer) { optimizer_ = &optimizer; }

  // Whether the coming backward is the last micro-step of the optimizer step (stages 0-1 reduce
  // only then; the swap measures the sum's squares then).
  void set_last_micro_step(bool last) { last_micro_step_ = last; }
  bool last_micro_step() const { return last_micro_step_; }

  // Stages 2-3: fresh full gradients for the units the backward of u touches (the previous
  // micro-step's reductions of them completed first, the host not waiting for their additions).
  void before_backward(int u);
  // Starts reducing unit u's gradients (stages 2-3 every micro-step, 0-1 at the last) and
  // retires finished reductions.
  void after_backward(int u);
  // Waits for unit u's reduction (if any) and accumulates it: when it returns, the accumulator
  // holds the sum (Note [Host sums added on the device]: the addition it waits for).
  void finish(int u);
  void finish_all();

  // Note [Gradient swap]: stages unit u's accumulated gradients for its update and points the
  // optimizer at them; unstage() frees the staging once the update is done. Note [Transient
  // gradients]: points the optimizer at the buffer u's reduction landed in; unstage() frees it.
  // Note [Gradient sums on the device]: copies u's sum to a host buffer (unless its copy started
  // when the sum was complete), starts the copy of `next`'s (the unit updated after u, -1: none
  // known) where its sum is complete, waits for u's and points the optimizer there; unstage()
  // frees it. No-ops otherwise.
  void stage_for_update(int u, int next = -1);
  void unstage(int u);
  // This rank's sum of squares of unit u's reduced gradients (Note [Deterministic gradient norm];
  // swapped: as measured when the last micro-step finished; transient: before u's update only).
  PendingSum sumsq(int u) const;
  // After an update or a skipped step: the next micro-step starts a new sum. Stages 0-1's full
  // buffers are overwritten by the next backward, stages 2-3's accumulators by the next step's
  // first reduce-scatter (Note [Fresh gradients]).
  void start_new_sum();

 private:
  struct UnitGrads {
    UnitShard shard;
    Buffer accumulator;   // stages 2-3: this rank's f32 gradient shard sum (empty when swapped)
    Buffer reduce_src;    // stages 2-3: the unit's full gradients while they are reduce-scattered
    Buffer reduce_out;    // stages 2-3: the landing shard when the accumulator already holds a sum
    bool accumulator_zero = true;  // stages 2-3: the accumulator holds nothing yet this step
    bool final_reduction = false;  // stages 2-3: the reduction launched last was the step's last micro-step's
    bool host_accumulator = false;
    std::vector<comm::Work> reduce_work;
    // Note [Host sums added on the device]: the copy that writes the sum back into the host
    // accumulator (complete when none is in flight).
    kernels::Event accumulated;
    // Note [Gradient swap]: the accumulator's slot in grads.swp, the staging buffer holding it
    // (-1: none), its write in flight (0: none), and the sum of squares of the step's final sum.
    uint64_t swap_offset = 0;
    size_t swap_bytes = 0;
    int staging = -1;
    io::SwapIo::Ticket write = 0;
    // Note [Gradient sums on the device]: the copy of the sum into staging_[staging].
    kernels::Event staged;
    PendingSum swapped_sumsq;
  };
  void launch(int u);
  void retire();
  // finish() but for the wait on `accumulated`: what retire() does during the backward.
  void complete(int u);
  // Note [Host sums added on the device].
  bool adds_on_device(const UnitGrads& st) const;
  void add_on_device(UnitGrads& st);
  float* acquire_staging(int u);
  void finish_write(int u);
  // Note [Gradient sums on the device]: starts copying u's sum into a free staging buffer, or with
  // `evict` into one taken from a unit whose copy started early (never u's or `keep`'s: the unit
  // being updated); false when none could be had.
  bool start_staging_copy(int u, bool evict, int keep = -1);
  void release_staging(int u);

  nn::Model& model_;
  const ZeroConfig config_;
  kernels::Backend& device_;
  comm::DeviceCommunicator& comm_;
  BufferPool& pool_;
  ZeroPlusPlus* zeropp_;
  std::vector<UnitGrads> units_;
  optim::ShardStepping* optimizer_ = nullptr;  // attach()
  bool last_micro_step_ = true;
  std::deque<int> reducing_;   // stages 2-3: units whose reduce-scatter is in flight, oldest first
  size_t reducing_numel_ = 0;  // their padded elements
  // Note [Gradient swap]; Note [Transient gradients] and Note [Gradient sums on the device] use
  // staging_ and staging_user_ too (no file).
  const GradStore store_;
  std::string swap_path_;
  io::FileDescriptor swap_fd_;
  std::vector<Buffer> staging_;           // host.swap (transient: grad, where the accumulators would be)
  std::vector<int> staging_user_;         // the unit holding each (-1: free)
  std::deque<int> writes_;                // units whose slot is being written, oldest first
  int64_t nvme_grad_bytes_ = 0;
  std::unique_ptr<io::SwapIo> io_;        // after the buffers: drained before they go
};

}  // namespace zerone::zero
