// ZeRO-Infinity's optimizer offload to NVMe: an optimizer (AdamW or SGD, optim/optimizers.h) whose
// fp32 master (bf16/fp16 runs) and state (AdamW's first and second moments, SGD's momentum buffer)
// live in a swap file and pass through a few host staging buffers, sub-group by sub-group,
// pipelined (Note [Pipelined swap]). The update is the in-memory optimizer's update_slice, the same
// code, so every placement gives the same numbers bit for bit.
//
// Thread-safety: one thread at a time (the training thread); I/O runs in the kernel.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zerone/io/aio.h"
#include "zerone/optim/optimizers.h"

namespace zerone::optim {

// NVMe settings (flags --nvme-path, or offload_optimizer.* and aio.* in the DeepSpeed config).
struct NvmeConfig {
  std::string nvme_path;          // swap directory parent
  int rank = 0;                   // names the run's swap directory
  bool pipeline_read = true;      // offload_optimizer.pipeline_read: read sub-group g+1 while g steps
  bool pipeline_write = true;     // offload_optimizer.pipeline_write: write g back while g+1 steps
  bool pin_memory = false;        // offload_optimizer.pin_memory: mlock the staging buffers
  io::AioConfig aio;
  std::string fault_plan;         // tests only: io::parse_fault_plan spec ("" none), applied to the
                                  // optimizer's and the parameters' swap I/O, each counting its own
  std::string grad_fault_plan;    // tests only: the same for the gradient swap (Note [Gradient swap])
};

// Host staging buffers of the optimizer swap (offload_optimizer.buffer_count): 1 up to this many.
inline constexpr int kMaxOffloadBufferCount = 64;

// The sub-groups of one optimizer shard of `shard_numel` elements: [begin, end) ranges of at most
// sub_group_numel elements, in order (a shard is split, never merged with another).
std::vector<std::pair<size_t, size_t>> sub_groups(size_t shard_numel, size_t sub_group_numel);
// Bytes of one swapped tensor of `numel` f32 elements, rounded up to io::kSwapAlignBytes.
inline size_t swap_tensor_bytes(size_t numel) { return io::swap_aligned(numel * sizeof(float)); }

// Note [Swap layout]: each shard is cut into sub-groups of at most sub_group_size elements
// (sub_groups above). Sub-group g occupies one contiguous, 4 KiB-aligned region of the rank's
// swap file "optimizer.swp": the optimizer's state tensors (AdamW: m, v; SGD: the momentum buffer,
// none without momentum), then (bf16/fp16) the master copy, each swap_tensor_bytes(numel)
// long, so a sub-group is one transfer each way. A staging buffer holds one sub-group in the same
// layout. The swap file's bytes are in the ledger as nvme.master / nvme.optim, the staging buffers
// as host.swap; zerone estimate computes both with the same functions.
//
// Note [Pipelined swap]: with offload_buffer_count = B >= 2 staging buffers, sub-group g uses buffer g % B.
// Before stepping g the engine starts reading g+1 (pipeline_read) into buffer (g+1) % B, first
// waiting for that buffer's previous write (sub-group g+1-B, started B-1 steps earlier); after
// stepping g it starts writing g back and moves on without waiting (pipeline_write). So the
// next read and up to B-1 writes overlap each sub-group's update, as in DeepSpeed's
// PipelinedOptimizerSwapper. Without pipeline_read a sub-group is read when it is reached; without
// pipeline_write its write is waited for at once; B = 1 cannot overlap anything. All writes are
// complete when step() returns, so the swap file always holds the state after the last step.
//
// Note [Spare slots]: for the engine's speculative early step (Note [Speculative early step] in
// zero/step_scheduler.cc) the sub-groups of the shards marked in `spare_slots` get a second region of the
// same size in the swap file. A step reads each such sub-group from its current slot and writes
// it to the other one; end_step() makes the written slots current, abort_step() forgets them, so
// until the step is validated the old state is never overwritten and taking the step back costs
// no I/O at all. The spare regions are in the ledger as nvme.scratch.
class SwappedOptimizer final : public Optimizer {
 public:
  // Creates the swap file "optimizer.swp" in `dir` (the run's swap directory, which must outlive
  // the optimizer) and writes the initial state (master from the parameters, zero moments). Throws
  // Error naming the file for a full disk or any I/O failure, and for an optimizer with no state
  // to swap (SGD without momentum on f32 parameters).
  //
  // `param_source`, when given, supplies shard i's parameters for the initial master instead of
  // shards[i].param (which may then be null): it is called once per shard, in order, and its
  // pointer need only stay valid until the next call. The ZeRO engine reads NVMe-resident
  // parameter shards back through it, so no rank holds every shard at once while it is built
  // (Note [Streaming construction] in zero/engine.cc).
  using ParamSource = std::function<const void*(size_t shard)>;
  SwappedOptimizer(std::vector<ShardRef> shards, DType param_dtype, const OptimizerOptions& options,
                   size_t sub_group_numel, int offload_buffer_count, const NvmeConfig& config, io::SwapDirectory& dir,
                   const std::vector<char>& spare_slots = {}, const ParamSource& param_source = nullptr);
  ~SwappedOptimizer() override;
  SwappedOptimizer(const SwappedOptimizer&) = delete;
  SwappedOptimizer& operator=(const SwappedOptimizer&) = delete;

  // The in-memory optimizer's step (AdamW::step, SGD::step). On an I/O failure throws Error naming the file and operation; the state on disk
  // is then undefined and the run must end (it does: the error ends the job).
  void set_param(size_t i, void* param) override { shards_[i].param = param; }
  void set_grad(size_t i, const float* grad) override { shards_[i].grad = grad; }
  // Per-shard stepping (Optimizer). The pipeline of Note [Pipelined swap] runs across
  // update_shard() calls: the sub-group after the current one (the next of the shard, else the
  // first of `next_shard`) is read while the current one steps, and writes complete in the
  // background until a staging buffer is needed again or end_step().
  bool supports_shard_steps() const override { return true; }
  void begin_step(float lr, float grad_scale) override;
  PendingSum update_shard(size_t i, size_t next_shard = kNoShard) override;
  void end_step() override;
  // Waits for the step's I/O and forgets what it wrote (only shards with spare slots may have
  // been updated since begin_step(); the engine restores the parameters itself).
  void abort_step() override;
  size_t num_shards() const override { return shards_.size(); }
  size_t numel(size_t i) const override { return shards_[i].numel; }
  const float* grad(size_t i) const override { return shards_[i].grad; }

  std::string type_name() const override { return optimizer_name(options_); }
  // export_state hands out and import_state fills host staging buffers.
  MemPlace state_place() const override { return MemPlace::host; }
  std::vector<std::string> state_names() const override;
  // Both go through staging buffer 0, one sub-group at a time (synchronous reads/writes).
  void export_state(const std::function<void(const StatePiece&, const float* data)>& fn) override;
  void import_state(const std::function<void(const StatePiece&, float* data)>& fn) override;
  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t steps) override { step_ = static_cast<int>(steps); }
  void record_checksums(const std::vector<size_t>& valid_numel) override { record_valid_ = valid_numel; }
  std::vector<StateExtent> state_extents() const override { return extents_; }

  const std::string& swap_file() const { return file_path_; }
  size_t num_sub_groups() const { return groups_.size(); }

 private:
  struct SubGroup {
    size_t shard, begin, end;  // elements [begin, end) of shard
    uint64_t offset;           // in the swap file: the current slot
    size_t tensor_bytes;       // swap_tensor_bytes(end - begin)
    uint64_t spare;            // Note [Spare slots]: where this step writes it (== offset: no spare)
  };
  std::vector<size_t> written_;  // sub-groups written to their spare slot this step
  bool wrote_in_place_ = false;  // a sub-group without a spare slot was written this step
  int swap_slot(int state_index) const;  // where state_names()[state_index] sits in a sub-group
  size_t group_bytes(const SubGroup& g) const { return g.tensor_bytes * static_cast<size_t>(tensors_); }
  float* tensor(size_t buffer, const SubGroup& g, int k) {
    return reinterpret_cast<float*>(buffers_[buffer].as<char>() + static_cast<size_t>(k) * g.tensor_bytes);
  }

  std::vector<ShardRef> shards_;
  DType param_dtype_;
  OptimizerOptions options_;
  NvmeConfig config_;
  int optim_tensors_;  // AdamW: m, v; SGD: momentum (or none)
  int tensors_;        // optim_tensors_ (+ master)
  int step_ = 0;
  std::vector<SubGroup> groups_;
  std::vector<size_t> first_group_;  // shard i's sub-groups are [first_group_[i], first_group_[i + 1])
  // The step in progress: its hyper-parameters, each staging buffer's read and write in flight,
  // the buffer the next read goes to, and the sub-group already being read ahead (if any).
  kernels::AdamWHyper h_{};  // AdamW
  float lr_ = 0.0f, grad_scale_ = 1.0f;  // SGD
  bool first_ = false;                  // SGD: the first step (momentum buffer = gradient)
  std::vector<io::SwapIo::Ticket> reads_, writes_;
  size_t next_buffer_ = 0;
  size_t ahead_group_ = kNoShard, ahead_buffer_ = 0;
  void start_read(size_t group, size_t buffer);
  void wait_io(io::SwapIo::Ticket& t);
  std::vector<size_t> record_valid_;    // record_checksums() for the next step (empty: off)
  std::vector<StateExtent> extents_;    // recorded by the last step (Note [Checkpoints of swapped state])
  std::vector<size_t> record_;          // record_valid_ of the step in progress
  int64_t nvme_master_bytes_ = 0, nvme_optim_bytes_ = 0, nvme_spare_bytes_ = 0;
  // Destroyed in reverse: the I/O is drained before the buffers and the file go.
  std::string file_path_;
  io::FileDescriptor fd_;
  std::vector<Buffer> buffers_;
  std::unique_ptr<io::SwapIo> io_;
};

}  // namespace zerone::optim
