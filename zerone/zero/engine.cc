#include "zerone/zero/engine.h"

#include <omp.h>
#include <sys/mman.h>

#include <cerrno>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"
#include "zerone/zero/partial_offload.h"

namespace zerone::zero {

// Note [Deterministic gradient norm] (kernels/cpu/reduce.h): every path that measures the norm
// before an update (step(), the speculative early step, --delayed-update) uses the backend's
// sum_squares, whose order depends only on the length, so they agree to the bit. With swapped
// gradients (Note [Gradient swap]) each unit's sum is measured as the last micro-step finishes and
// kept (UnitState::grad_sumsq); the other paths then take that value (unit_grad_sumsq), so again
// every path adds the same per-unit sums.

ZeroEngine::ZeroEngine(nn::Model& model, comm::Communicator& comm, const ZeroConfig& config,
                       const optim::OptimizerOptions& optimizer, const Materialize& materialize, const NvmeConfig& nvme)
    : model_(model),
      comm_(comm),
      config_(config),
      world_(comm.world_size()),
      rank_(comm.rank()),
      num_units_(model.num_units()),
      device_(model.backend()),
      device_comm_(comm, model.backend()),
      dsize_(dtype_size(model.compute_dtype())),
      pool_(static_cast<size_t>(
                working_set_bytes(model.unit_numels(), world_, model.compute_dtype(), config).device()),
            MemCategory::comm),
      stage_pool_(static_cast<size_t>(
                      working_set_bytes(model.unit_numels(), world_, model.compute_dtype(), config).host),
                  MemCategory::comm, MemPlace::host, kSwapAlignBytes) {
  ZERONE_CHECK(config.stage >= 0 && config.stage <= 3, "--zero-stage ", config.stage, " is out of range: expected 0..3");
  ZERONE_CHECK(config.reduce_bucket_numel >= 1 && config.allgather_bucket_numel >= 1,
               "reduce_bucket_size and allgather_bucket_size must be at least 1 element");
  ZERONE_CHECK(config.offload_optimizer == OffloadDevice::none || config.stage >= 1, "--offload-optimizer ",
               offload_device_name(config.offload_optimizer), " needs --zero-stage 1, 2 or 3 (stage 0 keeps no optimizer shard)");
  ZERONE_CHECK(config.offload_param == OffloadDevice::none || config.stage == 3, "--offload-param ",
               offload_device_name(config.offload_param), " needs --zero-stage 3 (only stage 3 shards the parameters)");
  ZERONE_CHECK(!config.delayed_update || config.offload_param != OffloadDevice::nvme,
               "--delayed-update cannot be combined with --offload-param nvme (the optimizer thread and the "
               "forward would share the parameter swap); use --offload-param cpu or none");
  check_zeropp(config, world_);  // ZeRO++
  ZERONE_CHECK(config.offload_optimizer_ratio >= 0.0 && config.offload_optimizer_ratio <= 1.0,
               "offload_optimizer.ratio ", config.offload_optimizer_ratio, " is out of range: expected [0, 1]");
  // Note [Partial optimizer offload]: how much of each optimizer shard is offloaded; a unit's
  // gradient shard (and the delayed update's copies) live where its offloaded part steps.
  const std::vector<size_t> offloaded = offloaded_optimizer_numels(model.unit_numels(), world_, rank_, config);
  size_t offloaded_total = 0, optimizer_total = 0;
  for (size_t n : offloaded) offloaded_total += n;
  for (size_t n : optimizer_shard_numels(model.unit_numels(), world_, rank_, config)) optimizer_total += n;
  if (config.offload_optimizer == OffloadDevice::nvme || config.offload_param == OffloadDevice::nvme)
    swap_dir_ = std::make_unique<io::SwapDirectory>(nvme.nvme_path, nvme.rank, "--nvme-path");
  units_.resize(num_units_);
  for (int u = 0; u < num_units_; ++u) units_[u].shard = unit_shard(model.units()[u].numel(), world_, rank_, config_);
  // Note [Streaming construction]: with --offload-param nvme each unit's parameter shard is written
  // to params.swp as soon as the unit is materialized, through at most two pooled staging buffers,
  // so building the engine never holds more than a unit or two of parameters. The optimizer's
  // initial master (bf16/fp16) is then made from the shards read back one at a time
  // (SwappedOptimizer's ParamSource); f32 runs need none (the parameters are the master). An
  // in-memory optimizer with a master copy (optimizer offload none/cpu, or partial) reads every
  // shard at its construction, so there the shards stay staged until it is built, as before.
  const bool fully_swapped = config_.offload_optimizer == OffloadDevice::nvme && offloaded_total > 0 &&
                             offloaded_total == optimizer_total;
  const bool stream_params = config_.offload_param == OffloadDevice::nvme &&
                             (model.compute_dtype() == DType::f32 || fully_swapped);
  // Note [Speculative early step]: every unit but the first (whose gradients are final only at
  // the end of the backward, so it is never updated before the step is validated) gets an undo
  // copy of what its update overwrites in memory and spare swap slots. Every optimizer the engine
  // builds steps shard by shard; speculates() is false under a partial offload.
  const bool speculation = speculates(config_);
  if (config_.offload_param == OffloadDevice::nvme) {
    // Note [Parameter swap]: every sharded unit's shard gets a 4 KiB-aligned slot in params.swp,
    // and with speculation a spare slot after it (not the first unit).
    uint64_t offset = 0, spare_bytes = 0;
    for (int u = 0; u < num_units_; ++u) {
      UnitState& st = units_[u];
      if (!params_swapped(u)) continue;
      st.swap_bytes = swap_aligned(st.shard.shard_numel * dsize_);
      st.swap_offset = st.swap_spare = offset;
      offset += st.swap_bytes;
      if (speculation && u > 0) {
        st.swap_spare = offset;
        offset += st.swap_bytes;
        spare_bytes += st.swap_bytes;
      }
    }
    param_path_ = swap_dir_->path() + "/params.swp";
    param_fd_ = swap_dir_->create_file("params.swp", offset);
    pin_staging_ = nvme.pin_memory;
    param_io_ = io::make_uring_io(nvme.aio);
    if (!nvme.fault_plan.empty())  // tests: the plan counts this file's transfers on its own
      param_io_ = io::make_fault_injecting_io(std::move(param_io_), io::parse_fault_plan(nvme.fault_plan));
    nvme_param_bytes_ = static_cast<int64_t>(offset - spare_bytes);
    nvme_param_spare_bytes_ = static_cast<int64_t>(spare_bytes);
    MemoryLedger::global().add(MemPlace::nvme, MemCategory::param, nvme_param_bytes_);
    MemoryLedger::global().add(MemPlace::nvme, MemCategory::scratch, nvme_param_spare_bytes_);
  }
  grads_swapped_ = gradients_swapped(model.unit_numels(), world_, rank_, config);
  if (grads_swapped_) {
    // Note [Gradient swap]: one 4 KiB-aligned slot per unit in grads.swp, buffer_count staging buffers.
    uint64_t offset = 0;
    size_t largest = 0;
    for (UnitState& st : units_) {
      st.grad_bytes = swap_tensor_bytes(st.shard.shard_numel);
      st.grad_offset = offset;
      offset += st.grad_bytes;
      largest = std::max(largest, st.grad_bytes);
    }
    grad_path_ = swap_dir_->path() + "/grads.swp";
    grad_fd_ = swap_dir_->create_file("grads.swp", offset);
    for (int b = 0; b < config_.optimizer_buffer_count; ++b) {
      grad_buffers_.emplace_back(largest, MemCategory::swap, MemPlace::host, kSwapAlignBytes);
      ZERONE_CHECK(!nvme.pin_memory || ::mlock(grad_buffers_.back().data(), largest) == 0,
                   "offload_optimizer.pin_memory: cannot lock ", largest, " bytes of gradient staging in memory: ",
                   std::strerror(errno), " (raise the locked-memory limit, ulimit -l, or set pin_memory false)");
    }
    grad_buffer_user_.assign(grad_buffers_.size(), -1);
    grad_io_ = io::make_uring_io(nvme.aio);
    if (!nvme.grad_fault_plan.empty())  // tests: a plan of its own, counting this file's transfers
      grad_io_ = io::make_fault_injecting_io(std::move(grad_io_), io::parse_fault_plan(nvme.grad_fault_plan));
    nvme_grad_bytes_ = static_cast<int64_t>(offset);
    MemoryLedger::global().add(MemPlace::nvme, MemCategory::grad, nvme_grad_bytes_);
  }
  std::deque<std::pair<int, io::SwapIo::Ticket>> init_writes;  // stream_params: shards being written
  auto retire_init_writes = [&](size_t keep) {
    while (init_writes.size() > keep) {
      auto [u, ticket] = init_writes.front();
      init_writes.pop_front();
      param_io_->wait(ticket);
      stage_pool_.release(std::move(units_[u].shard_params));
    }
  };
  std::vector<optim::ShardRef> shards;
  for (int u = 0; u < num_units_; ++u) {
    nn::FlatParam& unit = model.units()[u];
    UnitState& st = units_[u];
    ZERONE_ASSERT(st.shard.padded_numel == unit.padded_numel(), "model built with the wrong alignment for world ", world_);
    const size_t begin = config_.stage == 0 ? 0 : st.shard.shard_begin;
    const size_t numel = config_.stage == 0 ? unit.numel() : st.shard.shard_numel;
    const MemPlace grad_shard_place = offloaded[u] > 0 ? MemPlace::host : MemPlace::device;
    if (!unit.has_params()) {
      ZERONE_ASSERT(materialize, "unit ", u, " has no parameters and no way to materialize them");
      if (device_.host_addressable()) {
        unit.allocate_params();
        materialize(u);
      } else {
        // Note [Materializing on a device]: initialization and the checkpoint readers write the
        // parameters from the host, so the unit is filled in host memory and copied over whole.
        unit.set_params(Buffer(unit.param_bytes(), MemCategory::param, MemPlace::host));
        materialize(u);
        Buffer on_device(unit.param_bytes(), MemCategory::param, MemPlace::device);
        Buffer on_host = unit.take_params();
        device_.copy_to_device(on_device.data(), on_host.data(), on_host.bytes());
        unit.set_params(std::move(on_device));
      }
    }
    if (config_.stage <= 1) unit.allocate_grads();
    else unit.release_grads();

    optim::ShardRef ref;
    ref.numel = numel;
    MemPlace param_place = MemPlace::device;  // of ref.param
    st.opt_numel = numel;
    if (params_swapped(u) && stream_params) {
      retire_init_writes(1);
      st.shard_params = acquire_staging(st.swap_bytes);
      device_.copy_to_host(st.shard_params.data(), static_cast<char*>(unit.data()) + begin * dsize_, numel * dsize_);
      init_writes.emplace_back(u, param_io_->start(io::IoOp::write, param_fd_.get(), param_path_, st.shard_params.data(),
                                                   st.swap_bytes, st.swap_offset));
      ref.param = nullptr;  // set before each update (load_shard_for_update)
      param_place = MemPlace::host;
    } else if (params_swapped(u)) {
      // Staged on the host until the optimizer has read it, then written to params.swp.
      st.shard_params = Buffer(st.swap_bytes, MemCategory::param, MemPlace::host, kSwapAlignBytes);
      device_.copy_to_host(st.shard_params.data(), static_cast<char*>(unit.data()) + begin * dsize_, numel * dsize_);
      ref.param = st.shard_params.data();
      param_place = MemPlace::host;
    } else if (params_sharded(u)) {
      st.shard_params = Buffer(st.shard.shard_numel * dsize_, MemCategory::param, offload_place(config_.offload_param));
      device_.copy(st.shard_params.data(), st.shard_params.place(), static_cast<char*>(unit.data()) + begin * dsize_,
                   MemPlace::device, numel * dsize_);
      ref.param = st.shard_params.data();
      param_place = st.shard_params.place();
    } else {
      ref.param = static_cast<char*>(unit.data()) + begin * dsize_;
    }
    if (!params_swapped(u)) st.opt_param = ref.param;
    if (grads_swapped_) {
      ref.grad = nullptr;  // staged before each update (load_grad)
    } else if (config_.stage >= 2) {
      st.shard_grads = Buffer(st.shard.shard_numel * sizeof(float), MemCategory::grad, grad_shard_place);
      ref.grad = st.shard_grads.as<float>();
    } else {
      ref.grad = unit.grad() + device_comm_.in_place_shard_offset(st.shard.shard_numel);  // stage 1: reduced in place
    }
    for (const nn::TensorSpec& t : unit.tensors()) {
      if (!t.weight_decay) continue;
      size_t b = std::max(t.offset, begin), e = std::min(t.offset + t.numel(), begin + numel);
      if (b < e) ref.decay_ranges.emplace_back(b - begin, e - begin);
    }
    if (config_.delayed_update) {
      // Note [Delayed parameter update]: the optimizer reads a copy of the gradients and writes
      // parameters of its own, so the next step's forward and backward can run beside it.
      const MemPlace place = grad_shard_place;
      grad_src_.push_back(ref.grad);
      dpu_grads_.emplace_back(std::max<size_t>(numel, 1) * sizeof(float), MemCategory::grad, place);
      dpu_params_.emplace_back(std::max<size_t>(numel, 1) * dsize_, MemCategory::param, place);
      device_.copy(dpu_params_.back().data(), place, ref.param, param_place, numel * dsize_);
      ref.grad = dpu_grads_.back().as<float>();
      ref.param = dpu_params_.back().data();
    }
    shards.push_back(std::move(ref));
    if (params_sharded(u)) unit.release_params();
  }
  retire_init_writes(0);
  // stream_params: the optimizer's initial master reads the shards back one at a time.
  Buffer source_staging;
  int source_unit = -1;
  auto param_source = [&](size_t shard) -> const void* {
    const int u = static_cast<int>(shard);
    if (!params_swapped(u)) return shards[shard].param;
    if (source_unit >= 0) stage_pool_.release(std::move(source_staging));
    source_unit = u;
    source_staging = acquire_staging(units_[u].swap_bytes);
    param_io_->wait(param_io_->start(io::IoOp::read, param_fd_.get(), param_path_, source_staging.data(),
                                     units_[u].swap_bytes, units_[u].swap_offset));
    return source_staging.data();
  };
  if (offloaded_total > 0 && offloaded_total < optimizer_total) {
    // speculates() is false here (Note [Partial optimizer offload]): no undo copies, no spare slots.
    ZERONE_ASSERT(!speculation, "a speculative early step with a partial optimizer offload");
    optimizer_ = std::make_unique<PartialOffloadOptimizer>(std::move(shards), offloaded, model.compute_dtype(), optimizer,
                                                           config_.offload_optimizer, config_.sub_group_numel,
                                                           config_.optimizer_buffer_count, nvme, swap_dir_.get());
  } else if (fully_swapped) {
    // Note [Speculative early step]: every unit but the first (whose gradients are final only at
    // the end of the backward, so it is never updated before the step is validated) gets spare
    // swap slots. `shards` stays readable for param_source (the optimizer keeps its own copy).
    std::vector<char> spare(num_units_, speculation ? 1 : 0);
    if (!spare.empty()) spare[0] = 0;
    auto swapped = std::make_unique<SwappedOptimizer>(shards, model.compute_dtype(), optimizer, config_.sub_group_numel,
                                                      config_.optimizer_buffer_count, nvme, *swap_dir_, spare,
                                                      stream_params ? SwappedOptimizer::ParamSource(param_source) : nullptr);
    if (grads_swapped_) swapped_ = swapped.get();  // Note [Gradient swap]: the gradients stage through it
    optimizer_ = std::move(swapped);
  } else {
    optimizer_ = optim::make_optimizer(std::move(shards), model.compute_dtype(), optimizer,
                                       offloaded_total > 0 ? offload_place(config_.offload_optimizer) : MemPlace::device);
  }
  if (source_unit >= 0) stage_pool_.release(std::move(source_staging));
  ZERONE_ASSERT(!grads_swapped_ || swapped_ != nullptr, "swapped gradients without a swapped optimizer");
  ZERONE_ASSERT(!speculation || optimizer_->supports_shard_steps(), "a speculative early step without shard steps");
  speculation_ready_ = speculation;
  if (speculation_ready_) {
    for (int u = 1; u < num_units_; ++u) {
      UnitState& st = units_[u];
      if (!params_swapped(u))
        st.undo_param = Buffer(st.opt_numel * dsize_, MemCategory::scratch,
                               params_sharded(u) ? offload_place(config_.offload_param) : MemPlace::device);
      if (size_t bytes = optimizer_->undo_bytes(static_cast<size_t>(u)); bytes > 0)
        st.undo_optim = Buffer(bytes, MemCategory::scratch, offload_place(config_.offload_optimizer));
    }
  }
  if (config_.offload_param == OffloadDevice::nvme) {
    if (!stream_params) {
      // The optimizer has read the staged shards: write them to params.swp.
      std::vector<io::SwapIo::Ticket> writes;
      for (int u = 0; u < num_units_; ++u)
        if (params_swapped(u))
          writes.push_back(param_io_->start(io::IoOp::write, param_fd_.get(), param_path_,
                                            units_[u].shard_params.data(), units_[u].swap_bytes, units_[u].swap_offset));
      for (io::SwapIo::Ticket t : writes) param_io_->wait(t);
    }
    for (int u = 0; u < num_units_; ++u) {
      if (!params_swapped(u)) continue;
      units_[u].shard_params.reset();
      optimizer_->set_param(static_cast<size_t>(u), nullptr);  // set again before each update
    }
  }
  dpu_threads_ = std::max(1, omp_get_max_threads() / 2);
  last_toucher_.resize(num_units_);
  for (int u = 0; u < num_units_; ++u) last_toucher_[u] = u;
  for (int u = 0; u < num_units_; ++u)
    for (int x : model.units_touched(u)) last_toucher_[x] = std::min(last_toucher_[x], u);
  if (zeropp_enabled(config_))  // ZeRO++: collective (splits the host groups)
    zeropp_ = std::make_unique<ZeroPlusPlus>(device_comm_, device_, config_, model.compute_dtype(), num_units_);
  model.set_hooks(this);
}

ZeroEngine::~ZeroEngine() {
  if (dpu_worker_.joinable()) dpu_worker_.join();  // its error, if any, is dropped: we are unwinding
  // Never leave the kernel or the communication thread writing into freed buffers.
  if (param_io_) param_io_->drain();
  if (grad_io_) grad_io_->drain();
  if (nvme_grad_bytes_ > 0) MemoryLedger::global().sub(MemPlace::nvme, MemCategory::grad, nvme_grad_bytes_);
  if (nvme_param_bytes_ > 0) MemoryLedger::global().sub(MemPlace::nvme, MemCategory::param, nvme_param_bytes_);
  if (nvme_param_spare_bytes_ > 0)
    MemoryLedger::global().sub(MemPlace::nvme, MemCategory::scratch, nvme_param_spare_bytes_);
  for (UnitState& st : units_) {
    try {
      for (comm::Work& w : st.reduce_work) w.wait();
      for (comm::Work& w : st.gather_work) w.wait();
    } catch (...) {
    }
  }
  model_.set_hooks(nullptr);
}

// ---------------------------------------------------------------- parameters

// Note [Gathers overlap the next forward]: after the update, stages 1-2 (and stage 3's persistent
// units) must all-gather every unit's updated shards. Each unit's gather starts as soon as the
// optimizer has written its shard (so it overlaps the later shards' updates) and is waited for
// only when the unit is next used: its forward, or with_full_params(). Nothing else reads
// parameters between steps, so the all-gather hides behind compute instead of ending the step.

void ZeroEngine::start_gather(int u) {
  UnitState& st = units_[u];
  nn::FlatParam& unit = model_.units()[u];
  if (!params_sharded(u) || unit.has_params()) return;  // present, or its gather is in flight
  unit.set_params(pool_.acquire(unit.param_bytes(), MemCategory::param, /*zeroed=*/false));
  if (params_swapped(u)) {
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
//   - update: the optimizer asks for each shard before updating it (shard_begin): f32 runs read
//     it (the parameters are the master), bf16/fp16 runs only need a buffer (every element is
//     overwritten); after the update it is written back asynchronously, at most two writes in
//     flight, all complete when step() returns.
// Reads, writes and their failures go through the same SwapIo as the optimizer's swap.

Buffer ZeroEngine::acquire_staging(size_t bytes) {
  Buffer b = stage_pool_.acquire(bytes, MemCategory::param, /*zeroed=*/false);
  // Locking pages already locked is a no-op; freeing a buffer unlocks them.
  ZERONE_CHECK(!pin_staging_ || ::mlock(b.data(), b.bytes()) == 0, "offload_param.pin_memory: cannot lock ", b.bytes(),
               " bytes of parameter staging in memory: ", std::strerror(errno),
               " (raise the locked-memory limit, ulimit -l, or set pin_memory false)");
  return b;
}

void ZeroEngine::finish_read(int u) {
  UnitState& st = units_[u];
  if (st.read_ticket == 0) return;
  if (auto it = std::find(pending_reads_.begin(), pending_reads_.end(), u); it != pending_reads_.end())
    pending_reads_.erase(it);
  {
    ProfileScope profile(ProfileCategory::swap);
    param_io_->wait(std::exchange(st.read_ticket, 0));
  }
  launch_gather(u, st.staged.as<char>(), static_cast<char*>(model_.units()[u].data()));
}

void ZeroEngine::advance_reads() {
  // Blocking, in the order the reads were started: the all-gathers must be issued in the same
  // order, between the same other collectives, on every rank, whatever the disk's timing.
  while (!pending_reads_.empty()) {
    const int u = pending_reads_.front();
    pending_reads_.pop_front();
    finish_read(u);
  }
}

void ZeroEngine::load_shard_for_update(int u) {
  UnitState& st = units_[u];
  retire_param_writes(2);
  st.staged = acquire_staging(st.swap_bytes);
  if (model_.compute_dtype() == DType::f32) {
    ProfileScope profile(ProfileCategory::swap);
    param_io_->wait(param_io_->start(io::IoOp::read, param_fd_.get(), param_path_, st.staged.data(), st.swap_bytes,
                                     st.swap_offset));
  }
  optimizer_->set_param(static_cast<size_t>(u), st.staged.data());
}

void ZeroEngine::retire_param_writes(size_t keep) {
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

void ZeroEngine::launch_gather(int u, const char* shard, char* full) {
  // In slices of at most allgather_bucket_size elements of each rank's shard: slice k of every
  // rank lands at its offset in that rank's slot of the full buffer.
  UnitState& st = units_[u];
  ZERONE_ASSERT(st.gather_work.empty(), "unit ", u, " gathered twice at once");
  ProfileScope profile(ProfileCategory::comm);
  if (zeropp_ && params_sharded(u)) {  // ZeRO++: the whole unit, from the secondary copy or quantized
    st.gather_work.push_back(zeropp_->gather_params(u, shard, full, st.shard.shard_numel));
    return;
  }
  const size_t S = st.shard.shard_numel;
  for (size_t off = 0; off < S; off += config_.allgather_bucket_numel) {
    const size_t n = std::min(config_.allgather_bucket_numel, S - off);
    st.gather_work.push_back(
        device_comm_.all_gather_strided_async(shard + off * dsize_, full + off * dsize_, n * dsize_, S * dsize_));
  }
}

void ZeroEngine::wait_gather(int u) {
  UnitState& st = units_[u];
  finish_read(u);
  if (st.gather_work.empty()) return;
  {
    ProfileScope profile(ProfileCategory::comm);
    for (comm::Work& w : st.gather_work) w.wait();
  }
  st.gather_work.clear();
  if (zeropp_ && params_sharded(u)) zeropp_->gathered(u, model_.units()[u].data(), st.shard.shard_numel);  // hpZ
  if (params_swapped(u)) stage_pool_.release(std::move(st.staged));
}

void ZeroEngine::ensure_params(int u) {
  start_gather(u);
  wait_gather(u);
}

void ZeroEngine::release(int u) {
  if (!params_sharded(u)) return;
  wait_gather(u);
  pool_.release(model_.units()[u].take_params());
}

std::vector<int> ZeroEngine::touched_at(int access) const {
  if (access < 0 || access >= 2 * num_units_) return {};
  int u = access < num_units_ ? access : 2 * num_units_ - 1 - access;
  return model_.units_touched(u);
}

void ZeroEngine::prefetch_after(int access) {
  // The window of upcoming units, gathered or in flight, holds at most prefetch_numel elements
  // (Note [Working-set bound]); units already present count against it.
  size_t budget = config_.prefetch_numel;
  std::vector<int> seen = touched_at(access);
  for (int next = access + 1; next < 2 * num_units_; ++next) {
    for (int x : touched_at(next)) {
      if (!params_sharded(x) || std::find(seen.begin(), seen.end(), x) != seen.end()) continue;
      seen.push_back(x);
      size_t need = units_[x].shard.padded_numel;
      if (need > budget) return;
      budget -= need;
      start_gather(x);
    }
  }
}

void ZeroEngine::release_after(int access) {
  std::vector<int> next = touched_at(access + 1);
  for (int x : touched_at(access))
    if (std::find(next.begin(), next.end(), x) == next.end()) release(x);
}

void ZeroEngine::before_forward(int u) {
  if (config_.stage == 0) return;
  advance_reads();
  for (int x : model_.units_touched(u)) ensure_params(x);
  if (config_.stage == 3) prefetch_after(access_index(false, u));
}

void ZeroEngine::after_forward(int u) {
  if (config_.stage < 3) return;
  // After the last forward access the backward of the same unit follows: keep it.
  release_after(access_index(false, u));
}

// ---------------------------------------------------------------- gradients

void ZeroEngine::before_backward(int u) {
  if (config_.stage >= 2) {
    for (int x : model_.units_touched(u)) {
      nn::FlatParam& unit = model_.units()[x];
      if (unit.has_grads()) continue;
      finish_reduction(x);  // the previous micro-step's reduction of this unit, if still in flight
      // Unzeroed: the backward overwrites or zeroes every element (Note [Fresh gradients]).
      unit.set_grads(pool_.acquire(unit.grad_bytes(), MemCategory::grad, /*zeroed=*/false), /*fresh=*/true);
    }
  }
  if (config_.stage == 3) {
    advance_reads();
    for (int x : model_.units_touched(u)) ensure_params(x);
    prefetch_after(access_index(true, u));
  }
}

void ZeroEngine::after_backward(int u) {
  if (config_.stage == 3) release_after(access_index(true, u));
  if (config_.stage >= 2 || last_micro_step_) launch_reduction(u);
  if (config_.stage >= 2) retire_reductions();
  if (early_.active && last_micro_step_) early_after_backward(u);
}

void ZeroEngine::launch_reduction(int u) {
  UnitState& st = units_[u];
  nn::FlatParam& unit = model_.units()[u];
  ProfileScope profile(ProfileCategory::comm);
  const size_t P = st.shard.padded_numel, S = st.shard.shard_numel;
  if (config_.stage == 0) {
    // All-reduce in buckets of at most reduce_bucket_numel elements.
    for (size_t off = 0; off < P; off += config_.reduce_bucket_numel)
      st.reduce_work.push_back(
          device_comm_.all_reduce_sum_async(unit.grad() + off, std::min(config_.reduce_bucket_numel, P - off)));
    return;
  }
  if (config_.stage == 1) {
    st.reduce_work.push_back(device_comm_.reduce_scatter_sum_async(unit.grad(), unit.grad(), S));
    return;
  }
  ZERONE_ASSERT(st.reduce_work.empty(), "unit ", u, " reduced twice in one micro-step");
  st.reduce_src = unit.take_grads();
  float* out;
  if (st.accumulator_zero) {
    // First micro-step of the step: the accumulator is zero, so the shard can land in it directly
    // (Note [Gradient swap]: in a staging buffer, written to the slot once reduced).
    if (grads_swapped_) finish_grad_write(u);  // a skipped step's write may still hold a buffer
    out = grads_swapped_ ? acquire_grad_buffer(u) : st.shard_grads.as<float>();
    st.accumulator_zero = false;
  } else {
    st.reduce_out = pool_.acquire(S * sizeof(float), MemCategory::comm, /*zeroed=*/false);
    out = st.reduce_out.as<float>();
  }
  st.reduce_work.push_back(zeropp_ && zeropp_->quantizes_gradients()  // ZeRO++ qgZ
                               ? zeropp_->reduce_scatter(st.reduce_src.as<float>(), out, S)
                               : device_comm_.reduce_scatter_sum_async(st.reduce_src.as<float>(), out, S));
  reducing_.push_back(u);
  reducing_numel_ += P;
}

void ZeroEngine::retire_reductions() {
  // Reductions the communication thread has finished free their buffers now; beyond
  // reduce_bucket_size elements in flight the oldest are waited for (Note [Working-set bound]).
  // The newest always stays in flight to overlap the next unit's backward.
  while (!reducing_.empty()) {
    const int oldest = reducing_.front();
    const bool done = std::all_of(units_[oldest].reduce_work.begin(), units_[oldest].reduce_work.end(),
                                  [](const comm::Work& w) { return w.ready(); });
    if (!done && (reducing_.size() == 1 || reducing_numel_ <= config_.reduce_bucket_numel)) break;
    finish_reduction(oldest);
  }
}

void ZeroEngine::finish_reduction(int u) {
  UnitState& st = units_[u];
  if (st.reduce_work.empty()) return;
  {
    ProfileScope profile(ProfileCategory::comm);
    for (comm::Work& w : st.reduce_work) w.wait();
  }
  st.reduce_work.clear();
  if (config_.stage < 2) return;
  auto it = std::find(reducing_.begin(), reducing_.end(), u);
  ZERONE_ASSERT(it != reducing_.end(), "unit ", u, " finished a reduction it never launched");
  reducing_.erase(it);
  reducing_numel_ -= st.shard.padded_numel;
  const size_t S = st.shard.shard_numel;
  auto accumulate = [&](float* acc) {
    const float* in = st.reduce_out.as<float>();
    accumulate_into(acc, in, S);
    pool_.release(std::move(st.reduce_out));
  };
  if (grads_swapped_) {
    // Note [Gradient swap]: the first micro-step's shard landed in a staging buffer; a later one
    // landed in the pool and is added to the slot read back. Either way the sum goes to the slot.
    float* acc;
    if (st.reduce_out.empty()) {
      acc = grad_buffers_[st.grad_buffer].as<float>();
    } else {
      finish_grad_write(u);  // the previous micro-step's
      acc = acquire_grad_buffer(u);
      {
        ProfileScope profile(ProfileCategory::swap);
        grad_io_->wait(grad_io_->start(io::IoOp::read, grad_fd_.get(), grad_path_, acc, st.grad_bytes, st.grad_offset));
      }
      accumulate(acc);
    }
    if (last_micro_step_) {
      // The norm of the step's gradients, as step()'s pass would measure it (the same function,
      // Note [Deterministic gradient norm]).
      st.grad_sumsq = backend_of(acc).sum_squares(acc, S);
    }
    st.grad_write = grad_io_->start(io::IoOp::write, grad_fd_.get(), grad_path_, acc, st.grad_bytes, st.grad_offset);
    grad_writes_.push_back(u);
    pool_.release(std::move(st.reduce_src));
    return;
  }
  // Accumulate this micro-step's reduced shard (unless it landed in the accumulator directly)
  // and give the full gradients back to the pool.
  if (!st.reduce_out.empty()) accumulate(st.shard_grads.as<float>());
  pool_.release(std::move(st.reduce_src));
}

// Note [Gradient swap]: with the whole optimizer on NVMe at stages 2-3 (and no delayed update),
// the f32 gradient shard accumulators, 4 bytes per parameter, live in the rank's grads.swp (one
// 4 KiB-aligned slot per unit) instead of memory; buffer_count host staging buffers of the
// largest slot carry them (ZeRO-Infinity keeps its gradient partitions on NVMe the same way).
//   - the first micro-step's reduce-scatter of a unit lands in a staging buffer, which is written
//     to the slot once the reduction is done; a later micro-step's lands in the pooled buffer it
//     lands in without the swap, and is added to the slot read back into a staging buffer, which
//     is then written back (a slot is read only after its previous write completed);
//   - the last micro-step also measures the sum's squares with step()'s own loop, so clipping and
//     the overflow check see the norm they would see in memory;
//   - before a unit's update its slot is staged again (or its buffer still holds it, when the
//     write has not been waited for yet) and handed to the optimizer (set_grad); the buffer is
//     freed after the update. Every value is the same f32, summed in the same order, as in
//     memory, so the trajectory is unchanged (tests/zero/offload_invariance.sh, early_step.sh).
// A staging buffer is taken free, or by waiting for the oldest write, or else by finishing the
// oldest reduction (its write then frees one). Writes are waited for lazily; all are done when
// step() returns. Faults are injected in tests through a plan of their own (ZERONE_GRAD_SWAP_FAULT,
// tests/zero/offload_faults.sh).

float* ZeroEngine::acquire_grad_buffer(int u) {
  for (;;) {
    for (size_t b = 0; b < grad_buffers_.size(); ++b) {
      if (grad_buffer_user_[b] >= 0) continue;
      grad_buffer_user_[b] = u;
      units_[u].grad_buffer = static_cast<int>(b);
      return grad_buffers_[b].as<float>();
    }
    if (!grad_writes_.empty()) {
      finish_grad_write(grad_writes_.front());
      continue;
    }
    ZERONE_ASSERT(!reducing_.empty(), "no gradient staging buffer can be freed");
    finish_reduction(reducing_.front());
  }
}

void ZeroEngine::finish_grad_write(int u) {
  UnitState& st = units_[u];
  if (st.grad_write != 0) {
    {
      ProfileScope profile(ProfileCategory::swap);
      grad_io_->wait(std::exchange(st.grad_write, 0));
    }
    grad_writes_.erase(std::find(grad_writes_.begin(), grad_writes_.end(), u));
  }
  if (st.grad_buffer >= 0) grad_buffer_user_[std::exchange(st.grad_buffer, -1)] = -1;
}

void ZeroEngine::load_grad(int u) {
  if (!grads_swapped_) return;
  UnitState& st = units_[u];
  float* g;
  if (st.grad_buffer >= 0) {
    g = grad_buffers_[st.grad_buffer].as<float>();  // still holds what is being written
  } else {
    g = acquire_grad_buffer(u);
    ProfileScope profile(ProfileCategory::swap);
    grad_io_->wait(grad_io_->start(io::IoOp::read, grad_fd_.get(), grad_path_, g, st.grad_bytes, st.grad_offset));
  }
  swapped_->set_grad(static_cast<size_t>(u), g);
}

void ZeroEngine::unload_grad(int u) {
  if (!grads_swapped_) return;
  finish_grad_write(u);
  swapped_->set_grad(static_cast<size_t>(u), nullptr);
}

double ZeroEngine::reduce_grad_norm_sq(double local_sumsq) const {
  // Stage 0: every rank holds the whole reduced gradient. Otherwise each holds its shard.
  double total = config_.stage == 0 ? local_sumsq : comm_.all_reduce_sum(local_sumsq);
  return total / (static_cast<double>(world_) * world_);  // gradients are sums over ranks
}

// Note [Early optimizer step]: a unit's gradients are final once the backward of every unit that
// touches it has run in the step's last micro-step (for a tied embedding that is the embedding's
// own backward, the last) and its reduction has finished. With plan_step() announcing the step, the
// engine updates such a unit right away instead of at step(): in after_backward(u) it updates every
// unit that was final before u's backward began, so that unit's reduction had u's backward to hide
// behind, and step() updates what is left (the lowest units). Each update is the same call on the
// same gradients, master and moments as in step(), only in another order (units top down), and
// shards do not interact, so parameters, moments and losses are bit for bit those of the plain
// step (tests/zero/early_step.sh). Only the reported gradient norm may differ in its last bits: its
// per-unit sums are added in another order.
// What it moves earlier: NVMe offload's swap I/O (the optimizer state of unit u is read while the
// backward of the units below runs; SwappedOptimizer reads the next unit's first sub-group ahead, and
// writes complete behind the next unit's backward), stage 1-2's all-gather of the updated shard
// and stage 3's parameter-shard write-back. The update's arithmetic still runs on the training
// thread, between two units' backward, so on a CPU it is moved, not hidden.
// Clipping and fp16 loss scaling need the global norm of all gradients before any update: there
// the early updates are a speculation, Note [Speculative early step].
//
// Note [Speculative early step] (issue 8; SuperOffload and ZenFlow, 2025, speculate the same way).
// With --grad-clip or fp16 loss scaling, the early updates assume that the clip factor will be 1
// and that no gradient overflowed, and step() validates that once the global norm is known:
//   - norm finite and <= clip (or no clipping): the speculation holds, every early update is
//     exactly the plain step's (same call, grad_scale = 1/(world * loss_scale) * 1.0f, the factor the
//     plain step uses when it does not clip), step() updates what is left, nothing else happens.
//   - otherwise the engine takes back every early update, bit for bit (take_back_early), and then
//     does what the plain step does: steps at the end with the clip factor, or skips the step on
//     an overflow (the loss scaler is updated by the trainer as always).
// The norm deciding it is the plain step's, bit for bit: each unit's sum of squares is measured
// by grad_sumsq just before its early update (the gradients are then final and about to be read
// anyway) and the per-shard sums are added in shard order, as step() adds them when it measures
// the norm first (Note [Deterministic gradient norm]); so the decision, the clip factor and the
// reported norm are those of --early-step false.
// Taking a step back restores master, moments, step count and the compute-dtype parameters:
//   - in memory (--offload-optimizer none/cpu; the parameters everywhere but in params.swp): before
//     its speculative update a unit's optimizer state (Optimizer::save_undo: AdamW's master, m, v)
//     and its parameter shard (stage 0: the whole unit) are copied to undo buffers, and put back
//     from them. At stages 1-2 (and persistent stage-3 units) the gather of the speculative shard
//     has reached the other ranks' full copies: it is waited for, and a skipped step gathers the
//     restored shards again (a redone step gathers its own update). Stage-3 gathered copies were
//     released before the update, as in the plain step.
//   - on NVMe (optimizer.swp, params.swp): never overwritten before the step is validated; the
//     update writes each sub-group / parameter shard to a spare slot (Note [Spare slots] in
//     zero/offload.h), made current when the step ends, forgotten when it is taken back. No I/O
//     is spent on the undo; the redo reads the old slots again (the plain step's I/O).
// The first unit (the embedding) is final only when the backward ends, so it is never updated
// before the validation and has neither undo buffers nor spare slots.
// When (speculates() in partition.h): the trainer sets config.speculative_step when the early
// step is on with clipping or fp16 loss scaling, and the engine speculates only with optimizer
// or parameter state on NVMe, the I/O the early step can move under the backward. With the state
// in memory the early update is the same arithmetic on the same cores, moved and not hidden, so
// speculating there only adds its costs (measured 6-10% per step, docs/BENCHMARKS.md) and the
// engine steps at the end (tests force it with ZERONE_SPECULATE=memory). Never under a partial
// optimizer offload (ratio below 1, Note [Partial optimizer offload] in partition.h): there the
// step is at the end. Optimizers: AdamW and SGD keep undo copies of their in-memory state
// (Optimizer::save_undo; SGD: master unless f32, momentum buffer unless momentum 0); a swapped one
// uses spare slots. With swapped gradients (Note [Gradient swap]) a unit's sum of squares is the
// one measured with grad_sumsq as its last micro-step finished (unit_grad_sumsq), the value the
// plain step adds too; the gradient slot is only read by an update, so a redone step stages it
// again (update_at_end's load_grad) and a skipped one drops it as the plain step does.
// Costs: memory, per parameter of the rank's shard of the units after the first: the parameter
// (compute dtype) plus, with the optimizer in memory, AdamW's master (not for f32) and moments,
// 12-16 bytes (SGD: master and momentum buffer, 0-8 bytes), as standing buffers (category
// scratch, on the state's place; in `zerone estimate`); on NVMe, a second copy of the swapped state of those units on the disk
// (nvme.scratch), i.e. twice the disk per parameter. Time: a validated step copies the
// in-memory state once (a memcpy of 12-16 bytes per parameter, beside the update's ~30 bytes of
// traffic) and nothing for swapped state; a mispredicted step pays the undo copy back, and the
// whole update and its swap I/O again at the end (about one extra optimizer step).
// Prediction: clipping tends to persist for many steps (the norm decays slowly through the clip),
// so a step speculates only when the step before did not clip; the first step speculates. After a
// clipping step the next steps at the end (EarlyStats::held_back) until one does not clip. fp16
// overflows are rare and followed by a halved loss scale, so they do not stop speculation.
// docs/BENCHMARKS.md has the measured gain and cost.

double ZeroEngine::unit_grad_sumsq(int u) {
  // Note [Gradient swap]: the slot's sum was measured as the last micro-step finished.
  if (grads_swapped_) return units_[u].grad_sumsq;
  const float* grad = optimizer_->grad(static_cast<size_t>(u));
  return backend_of(grad).sum_squares(grad, optimizer_->numel(static_cast<size_t>(u)));
}

double ZeroEngine::local_grad_sumsq() {
  double local = 0.0;
  for (size_t i = 0; i < optimizer_->num_shards(); ++i) local += unit_grad_sumsq(static_cast<int>(i));
  return local;
}

void ZeroEngine::plan_step(float lr, float grad_clip, double loss_scale, bool skip_on_overflow) {
  ZERONE_ASSERT(!early_.begun, "plan_step() twice without step()");
  const bool can = config_.early_step && !config_.delayed_update && optimizer_->supports_shard_steps();
  const bool exact = grad_clip <= 0.0f && !skip_on_overflow;
  const bool predicted = speculate_next_ || config_.speculate_always;
  early_.speculative = can && !exact && speculation_ready_ && predicted;
  early_.active = can && (exact || early_.speculative);
  if (can && !exact && speculation_ready_ && !predicted) ++early_stats_.held_back;
  early_.lr = lr;
  early_.grad_clip = grad_clip;
  early_.loss_scale = loss_scale;
  early_.skip_on_overflow = skip_on_overflow;
  early_.sumsq = 0.0;
  early_.waiting.clear();
  early_.updated.assign(num_units_, 0);
}

void ZeroEngine::early_after_backward(int u) {
  // Update the units that were final before u's backward; u waits (its reduction is in flight).
  std::vector<int> ready;
  for (int x : early_.waiting)
    if (last_toucher_[x] > u) ready.push_back(x);
  for (size_t k = 0; k < ready.size(); ++k) early_update(ready[k], k + 1 < ready.size() ? ready[k + 1] : u);
  std::erase_if(early_.waiting, [&](int x) { return early_.updated[x] != 0; });
  early_.waiting.push_back(u);
}

void ZeroEngine::early_update(int u, int next) {
  if (!early_.begun) {
    optimizer_->begin_step(early_.lr, static_cast<float>(1.0 / (static_cast<double>(world_) * early_.loss_scale)));
    early_.begun = true;
  }
  finish_reduction(u);
  release(u);  // stage 3: a gathered copy would go stale
  if (params_swapped(u)) load_shard_for_update(u);
  UnitState& st = units_[u];
  if (early_.speculative && early_.active) {
    // Note [Speculative early step]: measure, and keep what the update overwrites in memory.
    ZERONE_ASSERT(u > 0, "the first unit is never updated before the step is validated");
    st.sumsq = unit_grad_sumsq(u);
    if (!st.undo_param.empty()) device_.copy_any(st.undo_param.data(), st.opt_param, st.opt_numel * dsize_);
    if (!st.undo_optim.empty()) optimizer_->save_undo(static_cast<size_t>(u), st.undo_optim.data());
  }
  load_grad(u);
  early_.sumsq += optimizer_->update_shard(static_cast<size_t>(u),
                                           next >= 0 ? static_cast<size_t>(next) : optim::Optimizer::kNoShard);
  on_shard_updated(u);
  early_.updated[u] = 1;
}

std::vector<int> ZeroEngine::take_back_early() {
  // Note [Speculative early step]: every write of the early updates is complete before anything
  // is restored (parameter shards on their way to params.swp, gathers of updated shards).
  retire_param_writes(0);
  std::vector<int> taken_back;
  for (int u = 0; u < num_units_; ++u) {
    if (!early_.updated[u]) continue;
    taken_back.push_back(u);
    UnitState& st = units_[u];
    wait_gather(u);
    if (!st.undo_param.empty()) device_.copy_any(st.opt_param, st.undo_param.data(), st.opt_numel * dsize_);
    if (!st.undo_optim.empty()) optimizer_->restore_undo(static_cast<size_t>(u), st.undo_optim.data());
    st.swap_dirty = false;  // the spare slot is forgotten; the current one holds the shard
    early_.updated[u] = 0;
  }
  optimizer_->abort_step();
  early_.begun = false;
  return taken_back;
}

void ZeroEngine::commit_param_slots() {
  for (UnitState& st : units_)
    if (std::exchange(st.swap_dirty, false)) std::swap(st.swap_offset, st.swap_spare);
}

double ZeroEngine::update_at_end(float lr, float grad_scale) {
  // Stage 3: gathered copies of sharded units go stale with the update.
  for (int u = 0; u < num_units_; ++u) release(u);
  const double sumsq = optimizer_->step(
      lr, grad_scale, [this](size_t shard) { on_shard_updated(static_cast<int>(shard)); },
      [this](size_t shard) {
        if (params_swapped(static_cast<int>(shard))) load_shard_for_update(static_cast<int>(shard));
        load_grad(static_cast<int>(shard));
      });
  finish_update();
  return sumsq;
}

void ZeroEngine::finish_update() {
  retire_param_writes(0);
  commit_param_slots();
  // The update consumed the gradients without zeroing them (a write stream saved): stages 0-1's
  // full buffers are overwritten by the next backward, stages 2-3's accumulators by the next
  // step's first reduce-scatter (Note [Fresh gradients]).
  for (UnitState& st : units_) st.accumulator_zero = true;
}

void ZeroEngine::skip_step() {
  // fp16 overflow: the gradients are dropped as after an update.
  for (UnitState& st : units_) st.accumulator_zero = true;
  for (int u = 0; u < num_units_; ++u)
    if (config_.stage <= 1) model_.units()[u].mark_grads_fresh();
}

ZeroEngine::StepResult ZeroEngine::step_early() {
  early_.active = false;
  StepResult result;
  if (early_.speculative) {
    // Note [Speculative early step]: validate with the plain step's norm.
    double local = 0.0;
    for (int u = 0; u < num_units_; ++u) {
      if (!early_.updated[u]) {
        finish_reduction(u);
        units_[u].sumsq = unit_grad_sumsq(u);
      }
      local += units_[u].sumsq;
    }
    result.norm = std::sqrt(reduce_grad_norm_sq(local)) / early_.loss_scale;
    const bool finite = std::isfinite(result.norm);
    const bool clips = finite && early_.grad_clip > 0.0f && result.norm > early_.grad_clip;
    if (!finite || clips) {
      ZERONE_CHECK(finite || early_.skip_on_overflow, "gradient norm is ", result.norm,
                   ": training diverged (try a lower --lr)");
      const std::vector<int> taken_back = take_back_early();
      speculate_next_ = !clips;
      if (!finite) {
        ++early_stats_.skipped;
        result.overflow = true;
        // Stages 1-2 (and persistent stage-3 units): the other ranks' full copies got the
        // speculative shards; gather the restored ones (every rank takes back the same units).
        for (int u : taken_back) {
          if (config_.stage == 0 || params_sharded(u)) continue;
          char* full = static_cast<char*>(model_.units()[u].data());
          launch_gather(u, full + units_[u].shard.shard_begin * dsize_, full);
        }
        skip_step();
        return result;
      }
      ++early_stats_.redone;
      const float clip = static_cast<float>(early_.grad_clip / result.norm);
      const double unscale = 1.0 / (static_cast<double>(world_) * early_.loss_scale);
      update_at_end(early_.lr, static_cast<float>(unscale) * clip);
      return result;
    }
    ++early_stats_.validated;
    speculate_next_ = true;
  } else {
    ++early_stats_.exact;
  }
  std::vector<int> rest;  // top down, as the backward made them final
  for (int u = num_units_ - 1; u >= 0; --u)
    if (!early_.updated[u]) rest.push_back(u);
  for (size_t k = 0; k < rest.size(); ++k) early_update(rest[k], k + 1 < rest.size() ? rest[k + 1] : -1);
  optimizer_->end_step();
  early_.begun = false;
  finish_update();
  if (!early_.speculative) {
    result.norm = std::sqrt(reduce_grad_norm_sq(early_.sumsq)) / early_.loss_scale;
    ZERONE_CHECK(std::isfinite(result.norm), "gradient norm is ", result.norm,
                 ": training diverged (try a lower --lr or --grad-clip)");
  }
  return result;
}

ZeroEngine::StepResult ZeroEngine::step(float lr, float grad_clip, double loss_scale, bool skip_on_overflow) {
  if (zeropp_) zeropp_->drop_secondaries();  // hpZ: every backward is done; the update makes them stale
  if (early_.active) {
    ZERONE_ASSERT(lr == early_.lr && grad_clip == early_.grad_clip && loss_scale == early_.loss_scale &&
                      skip_on_overflow == early_.skip_on_overflow,
                  "step() called with other arguments than plan_step()");
    return step_early();
  }
  for (int u = 0; u < num_units_; ++u) finish_reduction(u);
  if (config_.delayed_update) return step_delayed(lr, grad_clip, loss_scale, skip_on_overflow);
  // Gradients are sums over ranks of loss_scale-scaled gradients.
  const double unscale = 1.0 / (static_cast<double>(world_) * loss_scale);
  StepResult result;
  float clip = 1.0f;
  if (grad_clip > 0.0f || skip_on_overflow) {
    // The norm must be known before the update: one extra read of the gradient shards.
    result.norm = std::sqrt(reduce_grad_norm_sq(local_grad_sumsq())) / loss_scale;
    if (!std::isfinite(result.norm)) {
      ZERONE_CHECK(skip_on_overflow, "gradient norm is ", result.norm, ": training diverged (try a lower --lr)");
      result.overflow = true;  // skipped: the gradients are dropped as after an update
      skip_step();
      return result;
    }
    if (grad_clip > 0.0f && result.norm > grad_clip) clip = static_cast<float>(grad_clip / result.norm);
    speculate_next_ = clip == 1.0f;  // Note [Speculative early step]: the prediction for the next step
  }
  const double sumsq = update_at_end(lr, static_cast<float>(unscale) * clip);
  if (grad_clip <= 0.0f && !skip_on_overflow) {
    result.norm = std::sqrt(reduce_grad_norm_sq(sumsq)) / loss_scale;
    ZERONE_CHECK(std::isfinite(result.norm), "gradient norm is ", result.norm,
                 ": training diverged (try a lower --lr or --grad-clip)");
  }
  return result;
}

void ZeroEngine::on_shard_updated(int u) {
  // Shards map one to one to units (constructor). Note [Gathers overlap the next forward].
  nn::FlatParam& unit = model_.units()[u];
  UnitState& st = units_[u];
  if (zeropp_) zeropp_->drop_secondary(u);  // hpZ: stale once updated
  unload_grad(u);
  if (config_.stage <= 1) unit.mark_grads_fresh();
  if (params_swapped(u)) {
    param_writes_.emplace_back(u, param_io_->start(io::IoOp::write, param_fd_.get(), param_path_, st.staged.data(),
                                                   st.swap_bytes, st.swap_spare));
    st.swap_dirty = true;  // current from commit_param_slots() on
    return;
  }
  if (config_.stage == 0 || params_sharded(u)) return;
  char* full = static_cast<char*>(unit.data());
  launch_gather(u, full + st.shard.shard_begin * dsize_, full);
}

// Note [Delayed parameter update]: ZeRO-Offload's one-step delayed parameter update (DPU, Ren et
// al. 2021, section 5), `--delayed-update`. The optimizer step of step s runs on a thread of its
// own while the training thread runs step s+1's forward and backward, so the optimizer's time
// hides behind them instead of adding to them. The price is staleness by one step:
//
//   plain:    g_s = grad L_s(theta_{s-1}),                      theta_s = Adam(theta_{s-1}, g_s)
//   delayed:  g_s = grad L_s(theta_{max(s-2, 0)}),              theta_s = Adam(theta_{s-1}, g_s)
//
// i.e. steps 1 and 2 both compute gradients at the initial parameters theta_0, step 3 at theta_1,
// and so on; every update is still applied, in order, each to the previous update's result, with
// its own step's learning rate, clip factor and loss scale. (The paper switches DPU on after a few
// warm-up steps; here it is on from step 1, and step 1's update simply has nothing to overlap.)
// What step() does at the end of step s's backward:
//   1. wait for update s-1 (still running on the optimizer thread) and install theta_{s-1} into the
//      model: stage 0 copies the whole unit, stages 1-2 (and stage 3's persistent units) copy the
//      rank's shard into place and all-gather it (waited for at the next forward, as without the
//      flag), stage 3 copies the rank's parameter shard;
//   2. copy g_s (already reduced, and accumulated over the micro-steps) into the optimizer's own
//      gradient buffer, measuring its norm on the way (the norm and the clip factor are g_s's,
//      exactly as without the flag, so clipping and fp16 overflow detection are unchanged:
//      an overflowing step is skipped and nothing is started);
//   3. start update s on the optimizer thread (it writes master, moments and its own parameter
//      copy, never the model's parameters, which step s+1 is reading) and return.
// finish_delayed_update() (the trainer calls it after the last step, before the final validation
// and --save) waits for the last update and installs it, so the saved and final model include
// every update. A checkpoint (save_state) installs the update in flight too: the step after a
// checkpoint sees the newest parameters, like step 1, so a resumed run continues bit for bit as
// the run that saved (which is then not the trajectory of a run without checkpoints); a validation between steps sees theta_{s-1} after step s, like the forward of s+1.
// The optimizer thread uses dpu_threads_ OpenMP threads (one on a machine this small; see
// docs/BENCHMARKS.md for whether it pays on 2 cores). It does no collective and no parameter swap
// I/O (hence no --offload-param nvme); optimizer NVMe swap runs on it unchanged. Memory: one more
// f32 gradient copy and one parameter copy (compute dtype) of the rank's optimizer shard, in the
// ledger as grad and param where that shard's optimizer runs, and in zerone estimate --delayed-update
// (Note [Offload places] in partition.h). Gradient accumulation is unchanged: every
// micro-step of step s+1 sees theta_{s-1}.

void ZeroEngine::join_delayed() {
  if (!dpu_worker_.joinable()) return;
  {
    ProfileScope profile(ProfileCategory::optimizer);  // the part of the update the step did not hide
    dpu_worker_.join();
  }
  if (dpu_error_) std::rethrow_exception(std::exchange(dpu_error_, nullptr));
}

void ZeroEngine::install_delayed() {
  join_delayed();
  if (!dpu_install_pending_) return;
  dpu_install_pending_ = false;
  for (int u = 0; u < num_units_; ++u) {
    release(u);  // stage 3: gathered copies are stale now
    wait_gather(u);
    nn::FlatParam& unit = model_.units()[u];
    UnitState& st = units_[u];
    const void* fresh = dpu_params_[u].data();
    if (config_.stage == 0) {
      device_.copy(unit.data(), MemPlace::device, fresh, dpu_params_[u].place(), unit.numel() * dsize_);
    } else if (params_sharded(u)) {
      device_.copy(st.shard_params.data(), st.shard_params.place(), fresh, dpu_params_[u].place(),
                   st.shard.shard_numel * dsize_);
    } else {
      char* full = static_cast<char*>(unit.data());
      device_.copy(full + st.shard.shard_begin * dsize_, MemPlace::device, fresh, dpu_params_[u].place(),
                   st.shard.shard_numel * dsize_);
      launch_gather(u, full + st.shard.shard_begin * dsize_, full);
    }
  }
}

void ZeroEngine::finish_delayed_update() { install_delayed(); }

ZeroEngine::StepResult ZeroEngine::step_delayed(float lr, float grad_clip, double loss_scale, bool skip_on_overflow) {
  install_delayed();
  // Copy this step's gradients to the optimizer (which may then run beside the next backward) and
  // measure them on the way; the model's gradient buffers are free for the next step after this.
  double local = 0.0;
  for (size_t i = 0; i < optimizer_->num_shards(); ++i)  // as step() measures it (Note [Deterministic gradient norm])
    local += sum_squares_and_copy(grad_src_[i], optimizer_->numel(i), dpu_grads_[i].as<float>());
  for (UnitState& st : units_) st.accumulator_zero = true;
  if (config_.stage <= 1)
    for (int u = 0; u < num_units_; ++u) model_.units()[u].mark_grads_fresh();
  StepResult result;
  result.norm = std::sqrt(reduce_grad_norm_sq(local)) / loss_scale;
  if (!std::isfinite(result.norm)) {
    ZERONE_CHECK(skip_on_overflow, "gradient norm is ", result.norm,
                 ": training diverged (try a lower --lr or --grad-clip)");
    result.overflow = true;  // skipped: nothing is started, the model keeps its parameters
    return result;
  }
  float clip = 1.0f;
  if (grad_clip > 0.0f && result.norm > grad_clip) clip = static_cast<float>(grad_clip / result.norm);
  const float scale = static_cast<float>(1.0 / (static_cast<double>(world_) * loss_scale)) * clip;
  dpu_install_pending_ = true;
  dpu_worker_ = std::thread([this, lr, scale] {
    Profiler::set_thread_excluded(true);
    omp_set_num_threads(dpu_threads_);
    try {
      optimizer_->step(lr, scale);
    } catch (...) {
      dpu_error_ = std::current_exception();
    }
  });
  return result;
}

void ZeroEngine::with_full_params(const std::function<void()>& fn) {
  join_delayed();  // Note [Delayed parameter update]: the model holds theta_{s-1} until the next step
  std::vector<int> gathered;
  for (int u = 0; u < num_units_; ++u) {
    if (params_sharded(u) && !model_.units()[u].has_params()) gathered.push_back(u);
    ensure_params(u);
  }
  // Where the host cannot read device memory, fn sees host copies of the units, and the device
  // buffers are put back afterwards, also when fn throws.
  std::vector<Buffer> on_device;
  if (!device_.host_addressable()) {
    for (nn::FlatParam& unit : model_.units()) {
      Buffer host(unit.param_bytes(), MemCategory::param, MemPlace::host);
      device_.copy_to_host(host.data(), unit.data(), unit.param_bytes());
      on_device.push_back(unit.take_params());
      unit.set_params(std::move(host));
    }
  }
  auto put_back = [&] {
    for (size_t u = 0; u < on_device.size(); ++u) {
      model_.units()[u].take_params();  // the host copy goes
      model_.units()[u].set_params(std::move(on_device[u]));
    }
    on_device.clear();
  };
  try {
    fn();
  } catch (...) {
    put_back();
    throw;
  }
  put_back();
  for (int u : gathered) release(u);
}

// ---------------------------------------------------------------- checkpoints

std::vector<std::string> ZeroEngine::state_tensors() const {
  std::vector<std::string> names{"param"};
  for (const std::string& n : optimizer_->state_names()) names.push_back(n);
  return names;
}

void ZeroEngine::prepare_checkpoint() {
  join_delayed();  // --delayed-update: the optimizer thread must not be inside a step while we set it up
  std::vector<size_t> valid(units_.size());  // the shard's real elements (the rest is padding)
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitShard& sh = units_[u].shard;
    const size_t origin = config_.stage == 0 ? 0 : sh.shard_begin;
    valid[u] = sh.numel > origin ? sh.numel - origin : 0;
  }
  optimizer_->record_checksums(valid);
}

void ZeroEngine::save_state(const StateSink& sink, const ExtentSink& extent_sink) {
  // --delayed-update: a checkpoint is a synchronization point of the delay (Note [Delayed parameter
  // update]): the update in flight is installed first, so parameters and optimizer state agree,
  // and the step after it (in this run or a resumed one) sees the newest parameters, as step 1 does.
  install_delayed();
  // The elements of unit u this rank saves: its partition, clipped to the real elements.
  auto saved_range = [&](int u) {
    const UnitShard& sh = units_[u].shard;
    const size_t b = std::min(sh.numel, static_cast<size_t>(rank_) * sh.shard_numel);
    return std::pair<size_t, size_t>{b, std::min(sh.numel, b + sh.shard_numel)};
  };
  const DType dtype = model_.compute_dtype();
  for (int u = 0; u < num_units_; ++u) {
    UnitState& st = units_[u];
    auto [b, e] = saved_range(u);
    if (b == e) continue;
    if (params_swapped(u)) {
      Buffer staged = acquire_staging(st.swap_bytes);
      param_io_->wait(param_io_->start(io::IoOp::read, param_fd_.get(), param_path_, staged.data(), st.swap_bytes,
                                       st.swap_offset));
      sink(u, "param", dtype, b, e - b, staged.data());
      stage_pool_.release(std::move(staged));
    } else if (params_sharded(u)) {
      with_host_view(st.shard_params.data(), st.shard_params.place(), (e - b) * dsize_,
                     [&](const void* host) { sink(u, "param", dtype, b, e - b, host); });
    } else {
      wait_gather(u);
      with_host_view(static_cast<const char*>(model_.units()[u].data()) + b * dsize_, MemPlace::device, (e - b) * dsize_,
                     [&](const void* host) { sink(u, "param", dtype, b, e - b, host); });
    }
  }
  const std::vector<std::string> names = optimizer_->state_names();
  if (extent_sink) {
    const std::vector<optim::Optimizer::StateExtent> extents = optimizer_->state_extents();
    if (!extents.empty()) {
      for (const optim::Optimizer::StateExtent& e : extents) {
        const int u = static_cast<int>(e.piece.shard);
        const size_t origin = config_.stage == 0 ? 0 : units_[u].shard.shard_begin;
        ZERONE_ASSERT(config_.stage >= 1, "a swapped optimizer below stage 1");  // the shard is the saved range
        extent_sink(u, names[e.piece.tensor], origin + e.piece.begin, e.piece.count, e.path, e.offset, e.checksums);
      }
      return;
    }
  }
  optimizer_->export_state([&](const optim::Optimizer::StatePiece& piece, const float* data) {
    const int u = static_cast<int>(piece.shard);
    const size_t origin = config_.stage == 0 ? 0 : units_[u].shard.shard_begin;  // shard element 0 in the unit
    auto [b, e] = saved_range(u);
    const size_t pb = std::max(b, origin + piece.begin), pe = std::min(e, origin + piece.begin + piece.count);
    if (pb < pe)
      with_host_view(data + (pb - origin - piece.begin), device_.place_of(data), (pe - pb) * sizeof(float),
                     [&](const void* host) { sink(u, names[piece.tensor], DType::f32, pb, pe - pb, host); });
  });
}

kernels::Backend& ZeroEngine::backend_of(const void* p) const {
  return device_.place_of(p) == MemPlace::device ? device_ : kernels::host_backend();
}

void ZeroEngine::accumulate_into(float* acc, const float* in, size_t n) {
  kernels::Backend& backend = backend_of(acc);
  if (device_.place_of(in) == device_.place_of(acc)) return backend.accumulate(acc, in, n);
  // Note [Operands in another place] (optim/optimizer.h): the addend comes over first.
  Buffer local(n * sizeof(float), MemCategory::scratch, device_.place_of(acc));
  device_.copy_any(local.data(), in, local.bytes());
  backend.accumulate(acc, local.as<float>(), n);
}

double ZeroEngine::sum_squares_and_copy(const float* grad, size_t n, float* copy_to) {
  if (device_.place_of(grad) == device_.place_of(copy_to)) return backend_of(grad).sum_squares(grad, n, copy_to);
  const double sumsq = backend_of(grad).sum_squares(grad, n);
  device_.copy_any(copy_to, grad, n * sizeof(float));
  return sumsq;
}

void ZeroEngine::with_host_view(const void* data, MemPlace place, size_t bytes,
                                const std::function<void(const void* host)>& fn) {
  if (place != MemPlace::device || device_.host_addressable()) return fn(data);
  std::vector<char> host(bytes);
  device_.copy_to_host(host.data(), data, bytes);
  fn(host.data());
}

void ZeroEngine::load_optimizer_state(const StateSource& source, int64_t optimizer_steps) {
  const std::vector<std::string> names = optimizer_->state_names();
  optimizer_->import_state([&](const optim::Optimizer::StatePiece& piece, float* data) {
    const int u = static_cast<int>(piece.shard);
    const UnitShard& sh = units_[u].shard;
    const size_t origin = config_.stage == 0 ? 0 : sh.shard_begin;
    const size_t b = origin + piece.begin, e = std::min(sh.numel, b + piece.count);
    const size_t real = e > b ? e - b : 0;
    // The piece's memory is wherever that part of the state lives (a partial offload has two places).
    kernels::Backend& backend = backend_of(data);
    if (real > 0 && device_.place_of(data) == MemPlace::host) {
      source(u, names[piece.tensor], b, real, data);  // host memory: read straight in
    } else if (real > 0) {
      std::vector<float> host(real);
      source(u, names[piece.tensor], b, real, host.data());
      backend.copy_to_device(data, host.data(), real * sizeof(float));
    }
    backend.fill_zero(data + real, (piece.count - real) * sizeof(float));  // padding: zero, as it always is
  });
  optimizer_->set_steps_taken(optimizer_steps);
}

}  // namespace zerone::zero
