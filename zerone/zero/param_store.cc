#include "zerone/zero/param_store.h"

#include <sys/mman.h>

#include <cerrno>

#include <algorithm>
#include <cstring>
#include <utility>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"
#include "zerone/zero/places.h"

namespace zerone::zero {

ParamStore::ParamStore(nn::Model& model, const ZeroConfig& config, std::vector<UnitShard> shards,
                       kernels::Backend& device, comm::DeviceCommunicator& comm, BufferPool& pool,
                       io::SwapDirectory* swap_dir, const optim::NvmeConfig& nvme, bool spare_slots,
                       ZeroPlusPlus* zeropp)
    : model_(model),
      config_(config),
      device_(device),
      comm_(comm),
      pool_(pool),
      zeropp_(zeropp),
      dsize_(dtype_size(model.compute_dtype())),
      // The NVMe staging part of the host working set (ZeRO++'s part is its own pool's).
      stage_pool_(static_cast<size_t>(
                      working_set_bytes(model.unit_numels(), comm.world_size(), model.compute_dtype(), config).host -
                      zeropp_working_set_bytes(model.unit_numels(), comm.world_size(), model.compute_dtype(), config).host),
                  MemCategory::comm, MemPlace::host, io::kSwapAlignBytes) {
  units_.resize(shards.size());
  for (size_t u = 0; u < shards.size(); ++u) units_[u].shard = shards[u];
  if (config_.offload_param != OffloadDevice::nvme) return;
  // Note [Parameter swap]: every sharded unit's shard gets a 4 KiB-aligned slot in params.swp,
  // and with speculation a spare slot after it (not the first unit).
  ZERONE_ASSERT(swap_dir != nullptr, "--offload-param nvme without a swap directory");
  uint64_t offset = 0, spare_bytes = 0;
  for (int u = 0; u < num_units(); ++u) {
    UnitParams& st = units_[u];
    if (!swapped(u)) continue;
    st.swap_bytes = io::swap_aligned(st.shard.shard_numel * dsize_);
    st.swap_offset = st.swap_spare = offset;
    offset += st.swap_bytes;
    if (spare_slots && u > 0) {
      st.swap_spare = offset;
      offset += st.swap_bytes;
      spare_bytes += st.swap_bytes;
    }
  }
  param_path_ = swap_dir->path() + "/params.swp";
  param_fd_ = swap_dir->create_file("params.swp", offset);
  pin_staging_ = nvme.pin_memory;
  param_io_ = io::make_uring_io(nvme.aio);
  if (!nvme.fault_plan.empty())  // tests: the plan counts this file's transfers on its own
    param_io_ = io::make_fault_injecting_io(std::move(param_io_), io::parse_fault_plan(nvme.fault_plan));
  nvme_param_bytes_ = static_cast<int64_t>(offset - spare_bytes);
  nvme_param_spare_bytes_ = static_cast<int64_t>(spare_bytes);
  MemoryLedger::global().add(MemPlace::nvme, MemCategory::param, nvme_param_bytes_);
  MemoryLedger::global().add(MemPlace::nvme, MemCategory::scratch, nvme_param_spare_bytes_);
}

ParamStore::~ParamStore() {
  // Never leave the kernel or the communication thread writing into freed buffers.
  if (param_io_) param_io_->drain();
  if (nvme_param_bytes_ > 0) MemoryLedger::global().sub(MemPlace::nvme, MemCategory::param, nvme_param_bytes_);
  if (nvme_param_spare_bytes_ > 0)
    MemoryLedger::global().sub(MemPlace::nvme, MemCategory::scratch, nvme_param_spare_bytes_);
  for (UnitParams& st : units_) {
    try {
      for (comm::Work& w : st.gather_work) w.wait();
    } catch (...) {
    }
  }
}

// ---------------------------------------------------------------- construction

ParamStore::OptimizerSlice ParamStore::adopt(int u, bool stream) {
  nn::FlatParam& unit = model_.units()[u];
  UnitParams& st = units_[u];
  const size_t begin = config_.stage == 0 ? 0 : st.shard.shard_begin;
  const size_t numel = config_.stage == 0 ? unit.numel() : st.shard.shard_numel;
  const char* mine = static_cast<const char*>(unit.data()) + begin * dsize_;
  if (swapped(u) && stream) {
    // Written to params.swp at once, through at most two pooled staging buffers.
    while (init_writes_.size() > 1) {
      auto [w, ticket] = init_writes_.front();
      init_writes_.pop_front();
      param_io_->wait(ticket);
      stage_pool_.release(std::move(units_[w].shard_params));
    }
    st.shard_params = acquire_staging(st.swap_bytes);
    device_.copy_to_host(st.shard_params.data(), mine, numel * dsize_);
    init_writes_.emplace_back(u, param_io_->start(io::IoOp::write, param_fd_.get(), param_path_, st.shard_params.data(),
                                                  st.swap_bytes, st.swap_offset));
    return {nullptr, MemPlace::host};  // set before each update (load_for_update)
  }
  if (swapped(u)) {
    // Staged on the host until the optimizer has read it, then written to params.swp (attach).
    st.shard_params = Buffer(st.swap_bytes, MemCategory::param, MemPlace::host, io::kSwapAlignBytes);
    device_.copy_to_host(st.shard_params.data(), mine, numel * dsize_);
    return {st.shard_params.data(), MemPlace::host};
  }
  if (sharded(u)) {
    st.shard_params = Buffer(st.shard.shard_numel * dsize_, MemCategory::param, offload_place(config_.offload_param));
    device_.copy(st.shard_params.data(), st.shard_params.place(), mine, MemPlace::device, numel * dsize_);
    return {st.shard_params.data(), st.shard_params.place()};
  }
  return {static_cast<char*>(unit.data()) + begin * dsize_, MemPlace::device};
}

void ParamStore::finish_adopting() {
  while (!init_writes_.empty()) {
    auto [u, ticket] = init_writes_.front();
    init_writes_.pop_front();
    param_io_->wait(ticket);
    stage_pool_.release(std::move(units_[u].shard_params));
  }
}

const void* ParamStore::read_back(int u, const void* in_memory) {
  if (!swapped(u)) return in_memory;
  if (source_unit_ >= 0) stage_pool_.release(std::move(source_staging_));
  source_unit_ = u;
  source_staging_ = acquire_staging(units_[u].swap_bytes);
  param_io_->wait(param_io_->start(io::IoOp::read, param_fd_.get(), param_path_, source_staging_.data(),
                                   units_[u].swap_bytes, units_[u].swap_offset));
  return source_staging_.data();
}

void ParamStore::attach(optim::ShardStepping& optimizer, bool streamed) {
  optimizer_ = &optimizer;
  if (source_unit_ >= 0) stage_pool_.release(std::move(source_staging_));
  source_unit_ = -1;
  if (config_.offload_param != OffloadDevice::nvme) return;
  if (!streamed) {
    // The optimizer has read the staged shards: write them to params.swp.
    std::vector<io::SwapIo::Ticket> writes;
    for (int u = 0; u < num_units(); ++u)
      if (swapped(u))
        writes.push_back(param_io_->start(io::IoOp::write, param_fd_.get(), param_path_, units_[u].shard_params.data(),
                                          units_[u].swap_bytes, units_[u].swap_offset));
    for (io::SwapIo::Ticket t : writes) param_io_->wait(t);
  }
  for (int u = 0; u < num_units(); ++u) {
    if (!swapped(u)) continue;
    units_[u].shard_params.reset();
    optimizer.set_param(static_cast<size_t>(u), nullptr);  // set again before each update
  }
}

// ---------------------------------------------------------------- gathers

// Note [Gathers overlap the next forward]: after the update, stages 1-2 (and stage 3's persistent
// units) must all-gather every unit's updated shards. Each unit's gather starts as soon as the
// optimizer has written its shard (so it overlaps the later shards' updates) and is waited for
// only when the unit is next used: its forward, or with_full_params(). Nothing else reads
// parameters between steps, so the all-gather hides behind compute instead of ending the step.

void ParamStore::start_gather(int u) {
  UnitParams& st = units_[u];
  nn::FlatParam& unit = model_.units()[u];
  if (!sharded(u) || unit.has_params()) return;  // present, or its gather is in flight
  unit.set_params(pool_.acquire(unit.param_bytes(), MemCategory::param, /*zeroed=*/false));
  if (swapped(u)) {
    // Read the shard first; its gather starts once the read is done (advance_reads, wait_gather).
    st.staged = acquire_staging(st.swap_bytes);
    st.read_ticket = param_io_->start(io::IoOp::read, param_fd_.get(), param_path_, st.staged.data(), st.swap_bytes,
                                      st.swap_offset);
    pending_reads_.push_back(u);
    return;
  }
  launch_gather(u, st.shard_params.as<char>(), static_cast<char*>(unit.data()));
}

// Note [Parameter swap]: with --offload-param nvme, stage 3's parameter shards live in the rank's
// "params.swp" (one 4 KiB-aligned slot per unit) and pass through pooled host staging buffers:
//   - prefetch: start_gather() of a unit inside the prefetch window (stage3_prefetch_bucket_size,
//     in the order the units are used) starts reading its shard; the next hook waits for the
//     reads started before it, in order, and launches their all-gathers (advance_reads), or the
//     unit's first use does (wait_gather), whichever comes first. So a read overlaps at least one
//     unit's compute, and the all-gathers are issued at the same points of the program on every
//     rank (collectives must match in order; launching whichever read the disk finished first
//     would not). The staging buffer goes back to the pool once the all-gather is done with it.
//   - update: the optimizer asks for each shard before updating it (load_for_update): f32 runs
//     read it (the parameters are the master), bf16/fp16 runs only need a buffer (every element is
//     overwritten); after the update it is written back asynchronously, at most two writes in
//     flight, all complete when the step ends.
// Reads, writes and their failures go through the same SwapIo as the optimizer's swap.

Buffer ParamStore::acquire_staging(size_t bytes) {
  Buffer b = stage_pool_.acquire(bytes, MemCategory::param, /*zeroed=*/false);
  // Locking pages already locked is a no-op; freeing a buffer unlocks them.
  ZERONE_CHECK(!pin_staging_ || ::mlock(b.data(), b.bytes()) == 0, "offload_param.pin_memory: cannot lock ", b.bytes(),
               " bytes of parameter staging in memory: ", std::strerror(errno),
               " (raise the locked-memory limit, ulimit -l, or set pin_memory false)");
  return b;
}

void ParamStore::finish_read(int u) {
  UnitParams& st = units_[u];
  if (st.read_ticket == 0) return;
  if (auto it = std::find(pending_reads_.begin(), pending_reads_.end(), u); it != pending_reads_.end())
    pending_reads_.erase(it);
  {
    ProfileScope profile(ProfileCategory::swap);
    param_io_->wait(std::exchange(st.read_ticket, 0));
  }
  launch_gather(u, st.staged.as<char>(), static_cast<char*>(model_.units()[u].data()));
}

void ParamStore::advance_reads() {
  // Blocking, in the order the reads were started: the all-gathers must be issued in the same
  // order, between the same other collectives, on every rank, whatever the disk's timing.
  while (!pending_reads_.empty()) {
    const int u = pending_reads_.front();
    pending_reads_.pop_front();
    finish_read(u);
  }
}

void ParamStore::launch_gather(int u, const char* shard, char* full) {
  // In slices of at most allgather_bucket_size elements of each rank's shard: slice k of every
  // rank lands at its offset in that rank's slot of the full buffer.
  UnitParams& st = units_[u];
  ZERONE_ASSERT(st.gather_work.empty(), "unit ", u, " gathered twice at once");
  ProfileScope profile(ProfileCategory::comm);
  if (zeropp_ && sharded(u)) {  // ZeRO++: the whole unit, from the secondary copy or quantized
    st.gather_work.push_back(zeropp_->gather_params(u, shard, full, st.shard.shard_numel));
    return;
  }
  const size_t S = st.shard.shard_numel;
  for (size_t off = 0; off < S; off += config_.allgather_bucket_numel) {
    const size_t n = std::min(config_.allgather_bucket_numel, S - off);
    st.gather_work.push_back(
        comm_.all_gather_strided_async(shard + off * dsize_, full + off * dsize_, n * dsize_, S * dsize_));
  }
}

void ParamStore::wait_gather(int u) {
  UnitParams& st = units_[u];
  finish_read(u);
  if (st.gather_work.empty()) return;
  {
    ProfileScope profile(ProfileCategory::comm);
    for (comm::Work& w : st.gather_work) w.wait();
  }
  st.gather_work.clear();
  if (zeropp_ && sharded(u)) zeropp_->gathered(u, model_.units()[u].data(), st.shard.shard_numel);  // hpZ
  if (swapped(u)) stage_pool_.release(std::move(st.staged));
}

void ParamStore::ensure(int u) {
  start_gather(u);
  wait_gather(u);
}

void ParamStore::release(int u) {
  if (!sharded(u)) return;
  wait_gather(u);
  release_to_pool(pool_, model_.units()[u].take_params(), device_);
}

std::vector<int> ParamStore::touched_at(int access) const {
  if (access < 0 || access >= 2 * num_units()) return {};
  int u = access < num_units() ? access : 2 * num_units() - 1 - access;
  return model_.units_touched(u);
}

void ParamStore::prefetch_after(int access) {
  // The window of upcoming units, gathered or in flight, holds at most prefetch_numel elements
  // (Note [Working-set bound]); units already present count against it.
  size_t budget = config_.prefetch_numel;
  std::vector<int> seen = touched_at(access);
  for (int next = access + 1; next < 2 * num_units(); ++next) {
    for (int x : touched_at(next)) {
      if (!sharded(x) || std::find(seen.begin(), seen.end(), x) != seen.end()) continue;
      seen.push_back(x);
      size_t need = units_[x].shard.padded_numel;
      if (need > budget) return;
      budget -= need;
      start_gather(x);
    }
  }
}

void ParamStore::release_after(int access) {
  std::vector<int> next = touched_at(access + 1);
  for (int x : touched_at(access))
    if (std::find(next.begin(), next.end(), x) == next.end()) release(x);
}

// ---------------------------------------------------------------- the update

void ParamStore::load_for_update(int u) {
  if (!swapped(u)) return;
  UnitParams& st = units_[u];
  retire_writes(2);
  st.staged = acquire_staging(st.swap_bytes);
  if (model_.compute_dtype() == DType::f32) {
    ProfileScope profile(ProfileCategory::swap);
    param_io_->wait(param_io_->start(io::IoOp::read, param_fd_.get(), param_path_, st.staged.data(), st.swap_bytes,
                                     st.swap_offset));
  }
  optimizer_->set_param(static_cast<size_t>(u), st.staged.data());
}

void ParamStore::retire_writes(size_t keep) {
  while (param_writes_.size() > keep) {
    auto [u, ticket] = param_writes_.front();
    param_writes_.pop_front();
    {
      ProfileScope profile(ProfileCategory::swap);
      param_io_->wait(ticket);
    }
    optimizer_->set_param(static_cast<size_t>(u), nullptr);
    stage_pool_.release(std::move(units_[u].staged));
  }
}

void ParamStore::after_update(int u) {
  UnitParams& st = units_[u];
  if (zeropp_) zeropp_->drop_secondary(u);  // hpZ: stale once updated
  if (swapped(u)) {
    param_writes_.emplace_back(u, param_io_->start(io::IoOp::write, param_fd_.get(), param_path_, st.staged.data(),
                                                   st.swap_bytes, st.swap_spare));
    st.swap_dirty = true;  // current from commit_slots() on
    return;
  }
  if (config_.stage == 0 || sharded(u)) return;
  gather_updated(u);
}

void ParamStore::gather_updated(int u) {
  char* full = static_cast<char*>(model_.units()[u].data());
  launch_gather(u, full + units_[u].shard.shard_begin * dsize_, full);
}

void ParamStore::commit_slots() {
  for (UnitParams& st : units_)
    if (std::exchange(st.swap_dirty, false)) std::swap(st.swap_offset, st.swap_spare);
}

Event ParamStore::install(int u, const void* fresh, MemPlace place) {
  release(u);  // stage 3: a gathered copy is stale now
  wait_gather(u);
  nn::FlatParam& unit = model_.units()[u];
  UnitParams& st = units_[u];
  if (config_.stage == 0) return device_.copy_async(unit.data(), MemPlace::device, fresh, place, unit.numel() * dsize_);
  if (sharded(u))
    return device_.copy_async(st.shard_params.data(), st.shard_params.place(), fresh, place,
                              st.shard.shard_numel * dsize_);
  char* full = static_cast<char*>(unit.data());
  Event copy = device_.copy_async(full + st.shard.shard_begin * dsize_, MemPlace::device, fresh, place,
                                  st.shard.shard_numel * dsize_);
  device_.wait(kernels::Stream::compute, copy);  // the gather reads the shard after the compute work before it
  gather_updated(u);
  return copy;
}

// ---------------------------------------------------------------- checkpoints

void ParamStore::read_partition(int u, size_t begin, size_t end, const std::function<void(const void* host)>& fn) {
  UnitParams& st = units_[u];
  // The partition [begin, end) starts at the shard's first element whenever the shard is all the rank holds.
  if (swapped(u)) {
    Buffer staged = acquire_staging(st.swap_bytes);
    param_io_->wait(param_io_->start(io::IoOp::read, param_fd_.get(), param_path_, staged.data(), st.swap_bytes,
                                     st.swap_offset));
    fn(staged.data());
    stage_pool_.release(std::move(staged));
  } else if (sharded(u)) {
    with_host_view(device_, st.shard_params.data(), st.shard_params.place(), (end - begin) * dsize_, fn);
  } else {
    wait_gather(u);
    with_host_view(device_, static_cast<const char*>(model_.units()[u].data()) + begin * dsize_, MemPlace::device,
                   (end - begin) * dsize_, fn);
  }
}

}  // namespace zerone::zero
