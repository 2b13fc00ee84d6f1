#include "zerone/zero/engine.h"

#include <algorithm>
#include <utility>

#include "zerone/core/error.h"
#include "zerone/optim/placement.h"
#include "zerone/zero/places.h"

namespace zerone::zero {

// Note [Deterministic gradient norm] (kernels/cpu/reduce.h): every path that measures the norm
// before an update (step(), the speculative early step, --delayed-update) uses the backend's
// sum_squares, whose order depends only on the length, so they agree to the bit. With swapped
// gradients (Note [Gradient swap]) each unit's sum is measured as the last micro-step finishes and
// kept by the GradReducer; the other paths then take that value (GradReducer::sumsq), so again
// every path adds the same per-unit sums.

void ZeroEngine::check(const ZeroConfig& config, int world) {
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
  check_zeropp(config, world);  // ZeRO++
  ZERONE_CHECK(config.offload_optimizer_ratio >= 0.0 && config.offload_optimizer_ratio <= 1.0,
               "offload_optimizer.ratio ", config.offload_optimizer_ratio, " is out of range: expected [0, 1]");
  ZERONE_CHECK(config.offload_optimizer_nvme_ratio > 0.0 && config.offload_optimizer_nvme_ratio <= 1.0,
               "--offload-optimizer-nvme-ratio ", config.offload_optimizer_nvme_ratio, " is out of range: expected (0, 1]");
}

const ZeroConfig& ZeroEngine::checked(const ZeroConfig& config, int world) {
  check(config, world);
  return config;
}

ZeroEngine::ZeroEngine(nn::Model& model, comm::Communicator& comm, const ZeroConfig& config,
                       const optim::OptimizerOptions& optimizer, const Materialize& materialize,
                       const optim::NvmeConfig& nvme, comm::Communicator* native_comm)
    : model_(model),
      comm_(comm),
      config_(checked(config, comm.world_size())),  // 1. Check (before anything is sized from it).
      world_(comm.world_size()),
      rank_(comm.rank()),
      num_units_(model.num_units()),
      device_(model.backend()),
      device_comm_(comm, model.backend(), native_comm),
      dsize_(dtype_size(model.compute_dtype())),
      pool_(static_cast<size_t>(
                working_set_bytes(model.unit_numels(), world_, model.compute_dtype(), config_).device()),
            MemCategory::comm) {
  // Note [Pooled reuse in stream order] (core/memory.cc): a working-set buffer is used on the compute
  // and comm streams only.
  pool_.order_reuse_by([this](const Event& last_use) {
    device_.wait(kernels::Stream::compute, last_use);
    device_.wait(kernels::Stream::comm, last_use);
  });
  // 2. Lay out: the shards, where the optimizer state goes, the swap files.
  // Note [Partial optimizer offload]: how much of each optimizer shard is offloaded; a unit's
  // gradient shard (and the delayed update's copies) live where its offloaded part steps.
  optim::StatePlacement placement;
  placement.offload_place = offload_place(config_.offload_optimizer);
  placement.offloaded_numels = offloaded_optimizer_numels(model.unit_numels(), world_, rank_, config_);
  if (config_.offload_optimizer == OffloadDevice::nvme)  // Note [Optimizer state on NVMe and in host memory]
    placement.nvme_numels = nvme_optimizer_numels(model.unit_numels(), world_, rank_, config_);
  placement.sub_group_numel = config_.sub_group_numel;
  placement.offload_buffer_count = config_.offload_buffer_count;
  placement.nvme = nvme;
  const bool fully_swapped =
      optim::swaps_all_state(optimizer_shard_numels(model.unit_numels(), world_, rank_, config_), placement);
  // Note [Streaming construction]: with --offload-param nvme each unit's parameter shard is written
  // to params.swp as soon as the unit is materialized, through at most two pooled staging buffers,
  // so building the engine never holds more than a unit or two of parameters. The optimizer's
  // initial master (bf16/fp16) is then made from the shards read back one at a time
  // (optim::SwappedOptimizer's ParamSource, ParamStore::read_back); f32 runs need none (the parameters are the master). An
  // in-memory optimizer with a master copy (optimizer offload none/cpu, or partial) reads every
  // shard at its construction, so there the shards stay staged until it is built, as before.
  const bool stream_params = config_.offload_param == OffloadDevice::nvme &&
                             (model.compute_dtype() == DType::f32 || fully_swapped);
  if (config_.offload_optimizer == OffloadDevice::nvme || config_.offload_param == OffloadDevice::nvme)
    swap_dir_ = std::make_unique<io::SwapDirectory>(nvme.nvme_path, nvme.rank, "--nvme-path");
  placement.swap_dir = swap_dir_.get();
  std::vector<UnitShard> shards(num_units_);
  // Note [Gradient sums on the device]: staged for each update, or with --delayed-update copied into
  // the optimizer's own gradients (Note [Delayed parameter update]) from where they were summed.
  const bool sums_on_device = gradients_on_device(model.unit_numels(), world_, config_);
  std::vector<char> host_accumulators(num_units_);
  for (int u = 0; u < num_units_; ++u) {
    shards[u] = unit_shard(model.units()[u].numel(), world_, rank_, config_);
    host_accumulators[u] = !sums_on_device && placement.offloaded_numels[u] > 0 ? 1 : 0;
  }
  if (zeropp_enabled(config_))  // ZeRO++: collective (splits the host groups)
    zeropp_ = std::make_unique<ZeroPlusPlus>(device_comm_, device_, pool_, config_, model.compute_dtype(), shards);
  params_ = std::make_unique<ParamStore>(model, config_, shards, device_, device_comm_, pool_, swap_dir_.get(), nvme,
                                         speculates(config_), zeropp_.get());
  const GradStore grad_store = gradients_transient(model.unit_numels(), world_, config_) ? GradStore::transient
                               : sums_on_device && !config_.delayed_update ? GradStore::device_sums
                               : gradients_swapped(model.unit_numels(), world_, rank_, config_) ? GradStore::swapped
                                                                                                  : GradStore::accumulators;
  grads_ = std::make_unique<GradReducer>(model, config_, shards, host_accumulators, device_, device_comm_, pool_,
                                         grad_store, swap_dir_.get(), nvme, zeropp_.get());

  // 3. Materialize, one unit at a time.
  auto delayed = config_.delayed_update ? std::make_unique<DelayedUpdate>() : nullptr;
  std::vector<void*> optimizer_params;
  std::vector<size_t> optimizer_numels;
  std::vector<optim::ShardRef> optimizer_shards = take_over_units(
      materialize, stream_params, placement.offloaded_numels, delayed.get(), optimizer_params, optimizer_numels);

  // 4. Make the optimizer over the shards (optim/placement.h picks which from where its state goes).
  std::vector<optim::ShardRef> in_memory;  // what read_back falls back to
  if (fully_swapped) {
    // Note [Speculative early step]: every unit but the first (whose gradients are final only at
    // the end of the backward, so it is never updated before the step is validated) gets spare
    // swap slots. With streamed parameters the initial master reads each shard back from params.swp.
    placement.spare_slots.assign(num_units_, speculates(config_) ? 1 : 0);
    if (!placement.spare_slots.empty()) placement.spare_slots[0] = 0;
    if (stream_params) {
      in_memory = optimizer_shards;
      placement.param_source = [&](size_t shard) {
        return params_->read_back(static_cast<int>(shard), in_memory[shard].param);
      };
    }
  }
  optimizer_ = optim::make_optimizer(std::move(optimizer_shards), model.compute_dtype(), optimizer, placement);
  ZERONE_ASSERT(!grads_->swapped() || fully_swapped, "swapped gradients without a swapped optimizer");
  params_->attach(*optimizer_, stream_params);
  grads_->attach(*optimizer_);
  scheduler_ = std::make_unique<StepScheduler>(model, comm, config_, device_, *params_, *grads_, *optimizer_,
                                               std::move(delayed), optimizer_params, optimizer_numels);
  model.set_hooks(this);
}

ZeroEngine::~ZeroEngine() {
  // The parts stop their own threads, I/O and collectives (member order, engine.h).
  model_.set_hooks(nullptr);
  optim::wait_installs();
  optim::release_kept_staging();  // Note [Installing staged operands]: kept for this engine's steps
}

void ZeroEngine::materialize_unit(int u, const Materialize& materialize) {
  nn::FlatParam& unit = model_.units()[u];
  if (unit.has_params()) return;
  ZERONE_ASSERT(materialize, "unit ", u, " has no parameters and no way to materialize them");
  // Initialization and the checkpoint readers write from the host (Note [Materializing on a device]).
  model_.write_params_from_host(u, [&] { materialize(u); });
}

std::vector<optim::ShardRef> ZeroEngine::take_over_units(const Materialize& materialize, bool stream_params,
                                                         const std::vector<size_t>& offloaded, DelayedUpdate* delayed,
                                                         std::vector<void*>& optimizer_params,
                                                         std::vector<size_t>& optimizer_numels) {
  std::vector<optim::ShardRef> shards;
  for (int u = 0; u < num_units_; ++u) {
    nn::FlatParam& unit = model_.units()[u];
    const UnitShard& sh = params_->shard(u);
    ZERONE_ASSERT(sh.padded_numel == unit.padded_numel(), "model built with the wrong alignment for world ", world_);
    materialize_unit(u, materialize);
    optim::ShardRef ref;
    const size_t begin = config_.stage == 0 ? 0 : sh.shard_begin;
    ref.numel = config_.stage == 0 ? unit.numel() : sh.shard_numel;
    ref.grad = grads_->adopt(u);
    const ParamStore::OptimizerSlice slice = params_->adopt(u, stream_params);
    ref.param = slice.param;
    optimizer_params.push_back(params_->swapped(u) ? nullptr : slice.param);
    optimizer_numels.push_back(ref.numel);
    for (const nn::TensorSpec& t : unit.tensors()) {
      if (!t.weight_decay) continue;
      size_t b = std::max(t.offset, begin), e = std::min(t.offset + t.numel(), begin + ref.numel);
      if (b < e) ref.decay_ranges.emplace_back(b - begin, e - begin);
    }
    // Note [Delayed parameter update]: the optimizer reads a copy of the gradients and writes
    // parameters of its own, where the unit's offloaded optimizer part runs.
    if (delayed)
      delayed->redirect(ref, offloaded[u] > 0 ? MemPlace::host : MemPlace::device, slice.place, model_.compute_dtype(),
                        device_);
    shards.push_back(std::move(ref));
    if (params_->sharded(u)) unit.release_params();
  }
  params_->finish_adopting();
  return shards;
}

// ---------------------------------------------------------------- the hooks

void ZeroEngine::before_forward(int u) {
  if (config_.stage == 0) return;
  params_->advance_reads();
  for (int x : model_.units_touched(u)) params_->ensure(x);
  if (config_.stage == 3) params_->prefetch_after(params_->access_index(false, u));
}

void ZeroEngine::after_forward(int u) {
  if (config_.stage < 3) return;
  // After the last forward access the backward of the same unit follows: keep it.
  params_->release_after(params_->access_index(false, u));
}

void ZeroEngine::before_backward(int u) {
  grads_->before_backward(u);
  if (config_.stage == 3) {
    params_->advance_reads();
    for (int x : model_.units_touched(u)) params_->ensure(x);
    params_->prefetch_after(params_->access_index(true, u));
  }
}

void ZeroEngine::after_backward(int u) {
  if (config_.stage == 3) params_->release_after(params_->access_index(true, u));
  grads_->after_backward(u);
  scheduler_->after_backward(u);
}

// ---------------------------------------------------------------- steps

void ZeroEngine::plan_step(float lr, float grad_clip, double loss_scale, bool skip_on_overflow) {
  scheduler_->plan_step(lr, grad_clip, loss_scale, skip_on_overflow);
}

StepResult ZeroEngine::step(float lr, float grad_clip, double loss_scale, bool skip_on_overflow) {
  return scheduler_->step(lr, grad_clip, loss_scale, skip_on_overflow);
}

void ZeroEngine::finish_delayed_update() { scheduler_->install_delayed(); }

void ZeroEngine::with_full_params(const std::function<void()>& fn) {
  std::vector<std::unique_ptr<HeldUnit>> held;
  for (int u = 0; u < num_units_; ++u) held.push_back(std::make_unique<HeldUnit>(*this, u));
  fn();  // the units are put back and released also when fn throws
}

ZeroEngine::HeldUnit::HeldUnit(ZeroEngine& engine, int u) : engine_(engine), unit_(u) {
  engine.scheduler_->join_delayed();  // Note [Delayed parameter update]: the model holds theta_{s-1} until the next step
  nn::FlatParam& unit = engine.model_.units()[u];
  gathered_ = engine.params_->sharded(u) && !unit.has_params();
  engine.params_->ensure(u);
  if (!engine.device_.host_addressable()) {
    // Pageable, as Model::write_params_from_host's: the copy waits anyway.
    Buffer host(unit.param_bytes(), MemCategory::param, MemPlace::host, 64, default_arena());
    engine.device_.copy_to_host(host.data(), unit.data(), unit.param_bytes());
    on_device_ = unit.take_params();
    unit.set_params(std::move(host));
  }
}

ZeroEngine::HeldUnit::~HeldUnit() {
  nn::FlatParam& unit = engine_.model_.units()[unit_];
  if (!on_device_.empty()) {
    unit.take_params();  // the host copy goes
    unit.set_params(std::move(on_device_));
  }
  if (gathered_) engine_.params_->release(unit_);
}

// ---------------------------------------------------------------- checkpoints

std::vector<std::string> ZeroEngine::state_tensors() const {
  std::vector<std::string> names{"param"};
  for (const std::string& n : optimizer_->state_names()) names.push_back(n);
  return names;
}

void ZeroEngine::prepare_checkpoint() {
  scheduler_->join_delayed();  // --delayed-update: the optimizer thread must not be inside a step while we set it up
  std::vector<size_t> valid(num_units_);  // the shard's real elements (the rest is padding)
  for (int u = 0; u < num_units_; ++u) {
    const UnitShard& sh = params_->shard(u);
    const size_t origin = config_.stage == 0 ? 0 : sh.shard_begin;
    valid[u] = sh.numel > origin ? sh.numel - origin : 0;
  }
  optimizer_->record_checksums(valid);
}

void ZeroEngine::save_state(const StateSink& sink, const ExtentSink& extent_sink) {
  // --delayed-update: a checkpoint is a synchronization point of the delay (Note [Delayed parameter
  // update]): the update in flight is installed first, so parameters and optimizer state agree,
  // and the step after it (in this run or a resumed one) sees the newest parameters, as step 1 does.
  scheduler_->install_delayed();
  // The elements of unit u this rank saves: its partition, clipped to the real elements.
  auto saved_range = [&](int u) {
    const UnitShard& sh = params_->shard(u);
    const size_t b = std::min(sh.numel, static_cast<size_t>(rank_) * sh.shard_numel);
    return std::pair<size_t, size_t>{b, std::min(sh.numel, b + sh.shard_numel)};
  };
  const DType dtype = model_.compute_dtype();
  for (int u = 0; u < num_units_; ++u) {
    auto [b, e] = saved_range(u);
    if (b == e) continue;
    params_->read_partition(u, b, e, [&](const void* host) { sink(u, "param", dtype, b, e - b, host); });
  }
  const std::vector<std::string> names = optimizer_->state_names();
  if (extent_sink) {
    const std::vector<optim::Optimizer::StateExtent> extents = optimizer_->state_extents();
    if (!extents.empty()) {
      for (const optim::Optimizer::StateExtent& e : extents) {
        const int u = static_cast<int>(e.piece.shard);
        const size_t origin = config_.stage == 0 ? 0 : params_->shard(u).shard_begin;
        ZERONE_ASSERT(config_.stage >= 1, "a swapped optimizer below stage 1");  // the shard is the saved range
        extent_sink(u, names[e.piece.tensor], origin + e.piece.begin, e.piece.count, e.path, e.offset, e.checksums);
      }
      return;
    }
  }
  optimizer_->export_state([&](const optim::Optimizer::StatePiece& piece, const float* data) {
    const int u = static_cast<int>(piece.shard);
    const size_t origin = config_.stage == 0 ? 0 : params_->shard(u).shard_begin;  // shard element 0 in the unit
    auto [b, e] = saved_range(u);
    const size_t pb = std::max(b, origin + piece.begin), pe = std::min(e, origin + piece.begin + piece.count);
    if (pb < pe)
      with_host_view(device_, data + (pb - origin - piece.begin), device_.place_of(data), (pe - pb) * sizeof(float),
                     [&](const void* host) { sink(u, names[piece.tensor], DType::f32, pb, pe - pb, host); });
  });
}

void ZeroEngine::load_optimizer_state(const StateSource& source, int64_t optimizer_steps) {
  const std::vector<std::string> names = optimizer_->state_names();
  optimizer_->import_state([&](const optim::Optimizer::StatePiece& piece, float* data) {
    const int u = static_cast<int>(piece.shard);
    const UnitShard& sh = params_->shard(u);
    const size_t origin = config_.stage == 0 ? 0 : sh.shard_begin;
    const size_t b = origin + piece.begin, e = std::min(sh.numel, b + piece.count);
    const size_t real = e > b ? e - b : 0;
    // The piece's memory is wherever that part of the state lives (a partial offload has two places).
    kernels::Backend& backend = backend_of(device_, data);
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
