#include "zerone/zero/offload.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"

namespace zerone::zero {

SwappedAdamW::SwappedAdamW(std::vector<optim::ShardRef> shards, DType param_dtype, const optim::AdamWOptions& options,
                           size_t sub_group_numel, int buffer_count, const NvmeConfig& config,
                           io::SwapDirectory& dir)
    : shards_(std::move(shards)),
      param_dtype_(param_dtype),
      options_(options),
      config_(config),
      tensors_(param_dtype == DType::f32 ? 2 : 3) {
  ZERONE_CHECK(buffer_count >= 1 && buffer_count <= 64, "offload_optimizer.buffer_count ", buffer_count,
               " is out of range: expected 1..64");
  ZERONE_CHECK(sub_group_numel >= 1, "sub_group_size must be at least 1 element");
  uint64_t offset = 0;
  size_t largest = 0;
  for (size_t i = 0; i < shards_.size(); ++i) {
    for (auto [b, e] : sub_groups(shards_[i].numel, sub_group_numel)) {
      SubGroup g{i, b, e, offset, swap_tensor_bytes(e - b)};
      offset += group_bytes(g);
      largest = std::max(largest, g.tensor_bytes);
      nvme_optim_bytes_ += 2 * static_cast<int64_t>(g.tensor_bytes);
      if (tensors_ == 3) nvme_master_bytes_ += static_cast<int64_t>(g.tensor_bytes);
      groups_.push_back(g);
    }
  }
  file_path_ = dir.path() + "/optimizer.swp";
  fd_ = dir.create_file("optimizer.swp", offset);
  MemoryLedger::global().add(MemPlace::nvme, MemCategory::optim, nvme_optim_bytes_);
  MemoryLedger::global().add(MemPlace::nvme, MemCategory::master, nvme_master_bytes_);
  if (!groups_.empty()) {
    for (int b = 0; b < buffer_count; ++b) {
      buffers_.emplace_back(largest * static_cast<size_t>(tensors_), MemCategory::swap, MemPlace::host, 4096);
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
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const SubGroup& g = groups_[gi];
    const size_t b = gi % buffers_.size();
    if (writes[b] != 0) io_->wait(std::exchange(writes[b], 0));
    std::memset(buffers_[b].data(), 0, group_bytes(g));
    if (tensors_ == 3) {
      const char* param = static_cast<const char*>(shards_[g.shard].param) + g.begin * dtype_size(param_dtype_);
      convert_to_f32(param, param_dtype_, tensor(b, g, 2), g.end - g.begin);
    }
    writes[b] = io_->start(io::IoOp::write, fd_.get(), file_path_, buffers_[b].data(), group_bytes(g), g.offset);
  }
  for (io::SwapIo::Ticket t : writes)
    if (t != 0) io_->wait(t);
}

SwappedAdamW::~SwappedAdamW() {
  if (io_) io_->drain();
  MemoryLedger::global().sub(MemPlace::nvme, MemCategory::optim, nvme_optim_bytes_);
  MemoryLedger::global().sub(MemPlace::nvme, MemCategory::master, nvme_master_bytes_);
}

double SwappedAdamW::step(float lr, float grad_scale, const std::function<void(size_t shard)>& shard_done,
                          const std::function<void(size_t shard)>& shard_begin) {
  ++step_;
  const kernels::cpu::AdamWHyper h = optim::AdamW::hyper(options_, lr, grad_scale, step_);
  const size_t G = groups_.size(), B = buffers_.size();
  const bool pipelined_read = config_.pipeline_read && B >= 2;
  std::vector<io::SwapIo::Ticket> reads(B, 0), writes(B, 0);
  std::vector<bool> read_started(G, false);
  auto wait = [&](io::SwapIo::Ticket& t) {
    if (t == 0) return;
    ProfileScope profile(ProfileCategory::swap);
    io_->wait(std::exchange(t, 0));
  };
  auto start_read = [&](size_t gi) {
    const size_t b = gi % B;
    wait(writes[b]);  // the buffer's previous sub-group must be on disk first
    reads[b] = io_->start(io::IoOp::read, fd_.get(), file_path_, buffers_[b].data(), group_bytes(groups_[gi]),
                          groups_[gi].offset);
    read_started[gi] = true;
  };
  double sumsq = 0.0;
  for (size_t gi = 0; gi < G; ++gi) {
    const SubGroup& g = groups_[gi];
    const size_t b = gi % B;
    if (shard_begin && (gi == 0 || groups_[gi - 1].shard != g.shard)) shard_begin(g.shard);
    if (!read_started[gi]) start_read(gi);
    if (pipelined_read && gi + 1 < G) start_read(gi + 1);
    wait(reads[b]);
    {
      ProfileScope profile(ProfileCategory::optimizer);
      const optim::ShardRef& s = shards_[g.shard];
      float* master = tensors_ == 3 ? tensor(b, g, 2) : static_cast<float*>(s.param) + g.begin;
      sumsq += optim::AdamW::update_slice(s, param_dtype_, options_, h, g.begin, g.end, master, tensor(b, g, 0),
                                          tensor(b, g, 1));
    }
    writes[b] = io_->start(io::IoOp::write, fd_.get(), file_path_, buffers_[b].data(), group_bytes(g), g.offset);
    if (!config_.pipeline_write) wait(writes[b]);
    if (shard_done && (gi + 1 == G || groups_[gi + 1].shard != g.shard)) shard_done(g.shard);
  }
  for (io::SwapIo::Ticket& t : writes) wait(t);
  return sumsq;
}

// Swap layout tensor k of a sub-group is m, v, master; state_names() order is (master,) m, v.
namespace {
int swap_slot(int state_index, int tensors) { return tensors == 3 ? (state_index + 2) % 3 : state_index; }
}  // namespace

void SwappedAdamW::export_state(const std::function<void(const StatePiece&, const float* data)>& fn) {
  for (const SubGroup& g : groups_) {
    io_->wait(io_->start(io::IoOp::read, fd_.get(), file_path_, buffers_[0].data(), group_bytes(g), g.offset));
    for (int k = 0; k < tensors_; ++k)
      fn(StatePiece{g.shard, k, g.begin, g.end - g.begin}, tensor(0, g, swap_slot(k, tensors_)));
  }
}

void SwappedAdamW::import_state(const std::function<void(const StatePiece&, float* data)>& fn) {
  for (const SubGroup& g : groups_) {
    std::memset(buffers_[0].data(), 0, group_bytes(g));
    for (int k = 0; k < tensors_; ++k)
      fn(StatePiece{g.shard, k, g.begin, g.end - g.begin}, tensor(0, g, swap_slot(k, tensors_)));
    io_->wait(io_->start(io::IoOp::write, fd_.get(), file_path_, buffers_[0].data(), group_bytes(g), g.offset));
  }
}

}  // namespace zerone::zero
