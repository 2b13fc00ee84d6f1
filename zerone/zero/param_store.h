// The ZeRO engine's parameter store: where each unit's parameters live at the run's stage and
// offload (Note [Offload places] in partition.h), and how they come and go.
//
//   stages 0-2 (and stage 3's persistent units): the unit's full parameters stay in the model; after
//            an update stages 1-2 all-gather each rank's updated shard into them (gather_updated).
//   stage 3  the unit keeps only this rank's shard (on the device, the host with --offload-param
//            cpu, or in params.swp with --offload-param nvme, Note [Parameter swap]); the full
//            parameters are all-gathered into a pooled buffer before use, prefetched ahead of it
//            (stage3_prefetch_bucket_size, in the order the units are used) and released after.
//
// The store hands the optimizer the slice of each unit it steps (adopt) and, for swapped shards,
// stages them around each update (load_for_update, write_back). Construction is streaming (Note
// [Streaming construction] in zero/engine.cc): the engine materializes one unit at a time and the
// store keeps only what the stage needs.
//
// Thread-safety: the training thread only; collectives run on the communicator's thread and swap
// I/O in the kernel. Errors (a dead peer, a failed read) are rethrown as Error where they are waited for.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
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

class ParamStore {
 public:
  // Lays out the unit shards `shards` (one per model unit) and, with --offload-param nvme, the
  // rank's params.swp in `swap_dir` (which must outlive the store); `spare_slots`: every swapped
  // unit but the first gets a spare slot (Note [Speculative early step]). `pool` (the engine's
  // working-set pool) serves gathered parameters. `zeropp` (null: off; must outlive the store)
  // gathers stage 3's sharded units (hpZ's secondary copy, qwZ). Throws Error for a full disk or
  // an I/O failure.
  ParamStore(nn::Model& model, const ZeroConfig& config, std::vector<UnitShard> shards, kernels::Backend& device,
             comm::DeviceCommunicator& comm, BufferPool& pool, io::SwapDirectory* swap_dir, const optim::NvmeConfig& nvme,
             bool spare_slots, ZeroPlusPlus* zeropp);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  bool sharded(int u) const { return config_.stage == 3 && !units_[u].shard.persistent; }
  bool swapped(int u) const { return sharded(u) && config_.offload_param == OffloadDevice::nvme; }
  const UnitShard& shard(int u) const { return units_[u].shard; }

  // --- construction (Note [Streaming construction] in zero/engine.cc) ---
  // Takes over unit u right after its full parameters were materialized on the device: keeps the
  // rank's shard where the stage puts it and says where the optimizer's slice of the unit is
  // (null for a swapped shard when `stream`: set before each update). The engine releases the
  // unit's full parameters after this when sharded(u).
  struct OptimizerSlice {
    void* param = nullptr;
    MemPlace place = MemPlace::device;
  };
  OptimizerSlice adopt(int u, bool stream);
  // After the last adopt(): the streamed shards' writes are complete.
  void finish_adopting();
  // Shard u's parameters for the optimizer's initial master when streaming: read back from
  // params.swp into a staging buffer valid until the next call (or `in_memory` when not swapped).
  const void* read_back(int u, const void* in_memory);
  // Once the optimizer is built (it read every staged shard): writes what is still staged to
  // params.swp and from then on points the optimizer at swapped shards only around their updates.
  void attach(optim::ShardStepping& optimizer, bool streamed);

  // --- the forward and backward (the engine's hooks) ---
  // Unit u's full parameters are present after ensure(u) and until release(u) (a no-op for units
  // that are never sharded). start_gather begins bringing them in.
  void start_gather(int u);
  void wait_gather(int u);
  void ensure(int u);
  void release(int u);
  // Launches the all-gathers of the shard reads started so far, in the order they were started.
  void advance_reads();
  // Position of (phase, unit) in one micro-step's access order: forward 0..U-1, then backward U-1..0.
  int access_index(bool backward, int u) const { return backward ? 2 * num_units() - 1 - u : u; }
  // Starts gathering the units used after `access`, within the prefetch window.
  void prefetch_after(int access);
  // Releases the units used at `access` and not at the next access.
  void release_after(int access);

  // --- the update ---
  // A swapped shard: staged in host memory for the optimizer (read first for f32 runs, where the
  // parameters are the master) and handed to it (set_param).
  void load_for_update(int u);
  // After unit u's update: a swapped shard is written back (to its spare slot, current from
  // commit_slots() on); stages 1-2 (and persistent stage-3 units) all-gather the updated shard
  // into every rank's full parameters (Note [Gathers overlap the next forward]).
  void after_update(int u);
  // All-gathers unit u's own shard into its full parameters again (stages 1-2 and persistent
  // units): a step that was taken back restores the shard and the other ranks need it.
  void gather_updated(int u);
  // Waits for the shard writes beyond `keep`, oldest first, and frees their staging.
  void retire_writes(size_t keep);
  // Makes the slots written this step current / forgets unit u's (Note [Speculative early step]).
  void commit_slots();
  void forget_spare(int u) { units_[u].swap_dirty = false; }
  // hpZ: every backward of the step is done and the update makes the secondary copies stale.
  void drop_secondaries() {
    if (zeropp_) zeropp_->drop_secondaries();
  }
  // Replaces the rank's slice of unit u's parameters with `fresh` (its optimizer slice's elements,
  // memory of `place`): the whole unit at stage 0, the shard otherwise, all-gathered into the
  // full parameters where they are kept (Note [Delayed parameter update]). Returns the Event of
  // the copy (Note [Asynchronous copies]): until it completed, `fresh` must not be written and the
  // unit's parameters (or shard) not read, but on the compute stream after a wait for it (where
  // the install gathers, it made the compute stream wait before the gather).
  Event install(int u, const void* fresh, MemPlace place);

  // --- checkpoints ---
  // Hands fn elements [begin, end) of unit u's parameters (the rank's partition) in host memory.
  void read_partition(int u, size_t begin, size_t end, const std::function<void(const void* host)>& fn);

 private:
  struct UnitParams {
    UnitShard shard;
    Buffer shard_params;  // stage 3, non-persistent: this rank's parameter shard (compute dtype)
    // A gather into the unit's full parameters is in flight: stage 3 from the shard into a pooled
    // buffer; stages 1-2 (and persistent stage-3 units) in place after the update, waited for
    // just before the unit's next use (Note [Gathers overlap the next forward]).
    std::vector<comm::Work> gather_work;  // one per allgather_bucket_size slice; empty: none pending
    // --offload-param nvme (Note [Parameter swap]): the shard's place in params.swp, and while it
    // is in memory its host staging buffer; a read in flight into it (0: none).
    uint64_t swap_offset = 0;
    size_t swap_bytes = 0;
    // Note [Speculative early step]: the spare slot in params.swp the update writes to (==
    // swap_offset: none), made current by commit_slots(); swap_dirty: written this step.
    uint64_t swap_spare = 0;
    bool swap_dirty = false;
    Buffer staged;
    io::SwapIo::Ticket read_ticket = 0;
  };
  int num_units() const { return static_cast<int>(units_.size()); }
  std::vector<int> touched_at(int access) const;
  void finish_read(int u);
  void launch_gather(int u, const char* shard, char* full);
  Buffer acquire_staging(size_t bytes);

  nn::Model& model_;
  const ZeroConfig config_;
  kernels::Backend& device_;
  comm::DeviceCommunicator& comm_;
  BufferPool& pool_;
  ZeroPlusPlus* zeropp_;
  size_t dsize_;
  std::vector<UnitParams> units_;
  optim::ShardStepping* optimizer_ = nullptr;  // attach()
  // --offload-param nvme (Note [Parameter swap]).
  BufferPool stage_pool_;  // host staging of parameter shards (idle: host.comm)
  std::string param_path_;
  io::FileDescriptor param_fd_;
  std::unique_ptr<io::SwapIo> param_io_;
  std::deque<std::pair<int, io::SwapIo::Ticket>> param_writes_;  // shards written back after the update
  std::deque<int> pending_reads_;  // units whose shard is being read, in the order the reads started
  int64_t nvme_param_bytes_ = 0;
  int64_t nvme_param_spare_bytes_ = 0;  // Note [Speculative early step]: spare slots in params.swp
  bool pin_staging_ = false;            // offload_param.pin_memory: mlock parameter staging buffers
  // Construction: streamed shards being written, and the shard read back for the optimizer.
  std::deque<std::pair<int, io::SwapIo::Ticket>> init_writes_;
  Buffer source_staging_;
  int source_unit_ = -1;
};

}  // namespace zerone::zero
