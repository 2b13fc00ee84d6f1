#include "zerone/optim/swapped.h"

#include <sys/mman.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <utility>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"
#include "zerone/io/sharded_checkpoint.h"

namespace zerone::optim {

std::vector<std::pair<size_t, size_t>> sub_groups(size_t shard_numel, size_t sub_group_numel) {
  ZERONE_ASSERT(sub_group_numel >= 1);
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t b = 0; b < shard_numel; b += sub_group_numel) out.emplace_back(b, std::min(shard_numel, b + sub_group_numel));
  return out;
}

namespace {
int optim_tensor_count(const OptimizerOptions& o) {
  if (const auto* sgd = std::get_if<SGDOptions>(&o)) return sgd->momentum != 0.0f ? 1 : 0;
  return 2;
}
}  // namespace

SwappedOptimizer::SwappedOptimizer(std::vector<ShardRef> shards, DType param_dtype,
                                   const OptimizerOptions& options, size_t sub_group_numel, int offload_buffer_count,
                                   const NvmeConfig& config, io::SwapDirectory& dir,
                                   const std::vector<char>& spare_slots, const ParamSource& param_source)
    : shards_(std::move(shards)),
      param_dtype_(param_dtype),
      options_(options),
      config_(config),
      optim_tensors_(optim_tensor_count(options)),
      tensors_(optim_tensors_ + (param_dtype == DType::f32 ? 0 : 1)) {
  ZERONE_CHECK(tensors_ > 0, "--offload-optimizer nvme: ", optimizer_name(options),
               " without momentum on fp32 parameters keeps no optimizer state to swap (use --offload-optimizer none)");
  ZERONE_CHECK(offload_buffer_count >= 1 && offload_buffer_count <= kMaxOffloadBufferCount,
               "offload_optimizer.buffer_count ", offload_buffer_count, " is out of range: expected 1..",
               kMaxOffloadBufferCount);
  ZERONE_CHECK(sub_group_numel >= 1, "sub_group_size must be at least 1 element");
  uint64_t offset = 0;
  size_t largest = 0;
  for (size_t i = 0; i < shards_.size(); ++i) {
    first_group_.push_back(groups_.size());
    for (auto [b, e] : sub_groups(shards_[i].numel, sub_group_numel)) {
      SubGroup g{i, b, e, offset, swap_tensor_bytes(e - b), offset};
      offset += group_bytes(g);
      if (i < spare_slots.size() && spare_slots[i]) {
        g.spare = offset;
        offset += group_bytes(g);
        nvme_spare_bytes_ += static_cast<int64_t>(group_bytes(g));
      }
      largest = std::max(largest, g.tensor_bytes);
      nvme_optim_bytes_ += optim_tensors_ * static_cast<int64_t>(g.tensor_bytes);
      if (tensors_ > optim_tensors_) nvme_master_bytes_ += static_cast<int64_t>(g.tensor_bytes);
      groups_.push_back(g);
    }
  }
  first_group_.push_back(groups_.size());
  file_path_ = dir.path() + "/optimizer.swp";
  fd_ = dir.create_file("optimizer.swp", offset);
  MemoryLedger::global().add(MemPlace::nvme, MemCategory::optim, nvme_optim_bytes_);
  MemoryLedger::global().add(MemPlace::nvme, MemCategory::master, nvme_master_bytes_);
  MemoryLedger::global().add(MemPlace::nvme, MemCategory::scratch, nvme_spare_bytes_);
  if (!groups_.empty()) {
    for (int b = 0; b < offload_buffer_count; ++b) {
      buffers_.emplace_back(largest * static_cast<size_t>(tensors_), MemCategory::swap, MemPlace::host, io::kSwapAlignBytes);
      if (config.pin_memory)
        ZERONE_CHECK(::mlock(buffers_.back().data(), buffers_.back().bytes()) == 0, "offload_optimizer.pin_memory: ",
                     "cannot lock ", buffers_.back().bytes(), " bytes of staging buffer in memory: ", std::strerror(errno),
                     " (raise the locked-memory limit, ulimit -l, or set pin_memory false)");
    }
  }
  std::unique_ptr<io::SwapIo> io = io::make_uring_io(config.aio);
  if (!config.fault_plan.empty()) io = io::make_fault_injecting_io(std::move(io), io::parse_fault_plan(config.fault_plan));
  io_ = std::move(io);

  // The initial state: master = parameters widened to f32, m = v = 0.
  std::vector<io::SwapIo::Ticket> writes(buffers_.size(), 0);
  const void* shard_param = nullptr;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const SubGroup& g = groups_[gi];
    const size_t b = gi % buffers_.size();
    if (writes[b] != 0) io_->wait(std::exchange(writes[b], 0));
    std::memset(buffers_[b].data(), 0, group_bytes(g));
    if (tensors_ > optim_tensors_) {
      if (gi == first_group_[g.shard]) shard_param = param_source ? param_source(g.shard) : shards_[g.shard].param;
      const char* param = static_cast<const char*>(shard_param) + g.begin * dtype_size(param_dtype_);
      load_master(tensor(b, g, optim_tensors_), MemPlace::host, param, param_dtype_, g.end - g.begin);
    }
    writes[b] = io_->start(io::IoOp::write, fd_.get(), file_path_, buffers_[b].data(), group_bytes(g), g.offset);
  }
  for (io::SwapIo::Ticket t : writes)
    if (t != 0) io_->wait(t);
}

SwappedOptimizer::~SwappedOptimizer() {
  if (io_) io_->drain();
  MemoryLedger::global().sub(MemPlace::nvme, MemCategory::optim, nvme_optim_bytes_);
  MemoryLedger::global().sub(MemPlace::nvme, MemCategory::master, nvme_master_bytes_);
  MemoryLedger::global().sub(MemPlace::nvme, MemCategory::scratch, nvme_spare_bytes_);
}

void SwappedOptimizer::wait_io(io::SwapIo::Ticket& t) {
  if (t == 0) return;
  ProfileScope profile(ProfileCategory::swap);
  io_->wait(std::exchange(t, 0));
}

void SwappedOptimizer::start_read(size_t gi, size_t b) {
  wait_io(writes_[b]);  // the buffer's previous sub-group must be on disk first
  reads_[b] = io_->start(io::IoOp::read, fd_.get(), file_path_, buffers_[b].data(), group_bytes(groups_[gi]),
                         groups_[gi].offset);
}

void SwappedOptimizer::begin_step(float lr, float grad_scale) {
  first_ = step_ == 0;  // SGD: the momentum buffer starts as the gradient
  ++step_;
  // Note [Checkpoints of swapped state]: this step records what a checkpoint needs, or nothing.
  record_ = std::move(record_valid_);
  record_valid_.clear();
  extents_.clear();
  lr_ = lr;
  grad_scale_ = grad_scale;
  const auto* adam = std::get_if<AdamWOptions>(&options_);
  h_ = adam ? AdamW::hyper(*adam, lr, grad_scale, static_cast<int>(step_)) : kernels::AdamWHyper{};
  reads_.assign(buffers_.size(), 0);
  if (writes_.size() != buffers_.size()) writes_.assign(buffers_.size(), 0);
  ahead_group_ = kNoShard;
  wrote_in_place_ = false;
}

PendingSum SwappedOptimizer::update_shard(size_t shard, size_t next_shard) {
  const auto* adam = std::get_if<AdamWOptions>(&options_);
  const auto* sgd = std::get_if<SGDOptions>(&options_);
  const size_t B = buffers_.size();
  const bool pipelined_read = config_.pipeline_read && B >= 2;
  const size_t end = first_group_[shard + 1];
  PendingSum sumsq;
  for (size_t gi = first_group_[shard]; gi < end; ++gi) {
    const SubGroup& g = groups_[gi];
    size_t b;
    if (ahead_group_ == gi) {
      b = ahead_buffer_;
      ahead_group_ = kNoShard;
    } else {
      if (ahead_group_ != kNoShard) {  // read ahead for a shard that did not come next: drop it
        wait_io(reads_[ahead_buffer_]);
        ahead_group_ = kNoShard;
      }
      b = std::exchange(next_buffer_, (next_buffer_ + 1) % B);
      start_read(gi, b);
    }
    // Read the sub-group after this one while this one steps.
    size_t next = gi + 1 < end ? gi + 1 : next_shard == kNoShard ? kNoShard : first_group_[next_shard];
    if (pipelined_read && next != kNoShard && next < first_group_[next == gi + 1 ? shard + 1 : next_shard + 1]) {
      ahead_buffer_ = std::exchange(next_buffer_, (next_buffer_ + 1) % B);
      ahead_group_ = next;
      start_read(next, ahead_buffer_);
    }
    wait_io(reads_[b]);
    {
      ProfileScope profile(ProfileCategory::optimizer);
      const ShardRef& s = shards_[g.shard];
      float* master = tensors_ > optim_tensors_ ? tensor(b, g, optim_tensors_) : static_cast<float*>(s.param) + g.begin;
      if (adam)
        sumsq += AdamW::update_slice(MemPlace::host, s, param_dtype_, *adam, h_, g.begin, g.end, master, tensor(b, g, 0),
                                     tensor(b, g, 1));
      else
        sumsq += SGD::update_slice(MemPlace::host, s, param_dtype_, *sgd, lr_, grad_scale_, first_, g.begin, g.end, master,
                                   optim_tensors_ > 0 ? tensor(b, g, 0) : nullptr);
    }
    if (!record_.empty()) {
      const size_t valid = std::min(g.end, std::max(g.begin, record_[g.shard])) - g.begin;
      for (int k = 0; valid > 0 && k < tensors_; ++k) {
        StateExtent e;
        e.piece = StatePiece{g.shard, k, g.begin, valid};
        e.path = file_path_;
        e.offset = g.spare + static_cast<uint64_t>(swap_slot(k)) * g.tensor_bytes;  // current once the step ends
        const char* data = reinterpret_cast<const char*>(tensor(b, g, swap_slot(k)));
        for (uint64_t off = 0; off < valid * sizeof(float); off += io::kChecksumBlockBytes)
          e.checksums.push_back(io::checksum_of(data + off, std::min<uint64_t>(io::kChecksumBlockBytes, valid * sizeof(float) - off)));
        extents_.push_back(std::move(e));
      }
    }
    writes_[b] = io_->start(io::IoOp::write, fd_.get(), file_path_, buffers_[b].data(), group_bytes(g), g.spare);
    if (g.spare != g.offset) written_.push_back(gi);
    else wrote_in_place_ = true;
    if (!config_.pipeline_write) wait_io(writes_[b]);
  }
  return sumsq;
}

void SwappedOptimizer::end_step() {
  for (io::SwapIo::Ticket& t : reads_) wait_io(t);  // a read ahead that no update_shard() consumed
  ahead_group_ = kNoShard;
  for (io::SwapIo::Ticket& t : writes_) wait_io(t);
  for (size_t gi : written_) std::swap(groups_[gi].offset, groups_[gi].spare);  // Note [Spare slots]
  written_.clear();
  wait_installs();  // Note [Installing staged operands]
}

void SwappedOptimizer::abort_step() {
  for (io::SwapIo::Ticket& t : reads_) wait_io(t);
  ahead_group_ = kNoShard;
  for (io::SwapIo::Ticket& t : writes_) wait_io(t);
  // Every sub-group this step wrote went to its spare slot: the current slots hold the state of
  // the step before, untouched.
  ZERONE_ASSERT(!wrote_in_place_, "a sub-group without a spare slot was updated: the step cannot be taken back");
  written_.clear();
  --step_;
  record_valid_ = std::move(record_);  // the step taken again records the checkpoint's checksums
  record_.clear();
  extents_.clear();
  wait_installs();  // Note [Installing staged operands]
}

// Swap layout of a sub-group: the optimizer's tensors, then master; state_names() order is
// (master,) then the optimizer's tensors.
int SwappedOptimizer::swap_slot(int state_index) const {
  if (tensors_ == optim_tensors_) return state_index;
  return state_index == 0 ? optim_tensors_ : state_index - 1;
}

std::vector<std::string> SwappedOptimizer::state_names() const {
  if (std::holds_alternative<AdamWOptions>(options_)) return adamw_state_names(param_dtype_);
  std::vector<std::string> names;
  if (tensors_ > optim_tensors_) names.push_back("master");
  if (optim_tensors_ > 0) names.push_back("momentum_buffer");
  return names;
}

void SwappedOptimizer::export_state(const std::function<void(const StatePiece&, const float* data)>& fn) {
  for (const SubGroup& g : groups_) {
    io_->wait(io_->start(io::IoOp::read, fd_.get(), file_path_, buffers_[0].data(), group_bytes(g), g.offset));
    for (int k = 0; k < tensors_; ++k)
      fn(StatePiece{g.shard, k, g.begin, g.end - g.begin}, tensor(0, g, swap_slot(k)));
  }
}

void SwappedOptimizer::import_state(const std::function<void(const StatePiece&, float* data)>& fn) {
  extents_.clear();  // the file is about to change
  for (const SubGroup& g : groups_) {
    std::memset(buffers_[0].data(), 0, group_bytes(g));
    for (int k = 0; k < tensors_; ++k)
      fn(StatePiece{g.shard, k, g.begin, g.end - g.begin}, tensor(0, g, swap_slot(k)));
    io_->wait(io_->start(io::IoOp::write, fd_.get(), file_path_, buffers_[0].data(), group_bytes(g), g.offset));
  }
}

}  // namespace zerone::optim
