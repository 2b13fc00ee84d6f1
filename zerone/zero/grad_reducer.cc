#include "zerone/zero/grad_reducer.h"

#include <sys/mman.h>

#include <cerrno>

#include <algorithm>
#include <cstring>
#include <utility>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"
#include "zerone/zero/places.h"

namespace zerone::zero {

// Note [Gradient swap]: with the whole optimizer on NVMe at stages 2-3 (and no delayed update),
// the f32 gradient shard accumulators, 4 bytes per parameter, live in the rank's grads.swp (one
// 4 KiB-aligned slot per unit) instead of memory; offload_buffer_count host staging buffers of the
// largest slot carry them (ZeRO-Infinity keeps its gradient partitions on NVMe the same way).
//   - the first micro-step's reduce-scatter of a unit lands in a staging buffer, which is written
//     to the slot once the reduction is done; a later micro-step's lands in the pooled buffer it
//     lands in without the swap, and is added to the slot read back into a staging buffer, which
//     is then written back (a slot is read only after its previous write completed);
//   - the last micro-step also measures the sum's squares with the step's own function, so
//     clipping and the overflow check see the norm they would see in memory;
//   - before a unit's update its slot is staged again (or its buffer still holds it, when the
//     write has not been waited for yet) and handed to the optimizer (set_grad); the buffer is
//     freed after the update. Every value is the same f32, summed in the same order, as in
//     memory, so the trajectory is unchanged (tests/zero/offload_invariance.sh, early_step.sh).
// A staging buffer is taken free, or by waiting for the oldest write, or else by finishing the
// oldest reduction (its write then frees one). Writes are waited for lazily; all are done when
// the step ends. Faults are injected in tests through a plan of their own (grad_fault_plan,
// tests/zero/offload_faults.sh).

GradReducer::GradReducer(nn::Model& model, const ZeroConfig& config, std::vector<UnitShard> shards,
                         const std::vector<char>& host_accumulators, kernels::Backend& device,
                         comm::DeviceCommunicator& comm, BufferPool& pool, GradStore store, io::SwapDirectory* swap_dir,
                         const optim::NvmeConfig& nvme, ZeroPlusPlus* zeropp)
    : model_(model),
      config_(config),
      device_(device),
      comm_(comm),
      pool_(pool),
      zeropp_(zeropp),
      store_(store) {
  units_.resize(shards.size());
  for (size_t u = 0; u < shards.size(); ++u) {
    units_[u].shard = shards[u];
    units_[u].host_accumulator = host_accumulators[u] != 0;
  }
  if (transient()) {
    // Note [Transient gradients]: two buffers of the largest shard where the accumulators would be.
    ZERONE_ASSERT(config_.stage >= 2 && config_.transient_gradients, "transient gradients the config does not ask for");
    size_t largest = 0;
    for (const UnitGrads& st : units_) {
      ZERONE_ASSERT(st.host_accumulator == units_[0].host_accumulator, "transient gradients in two places");
      largest = std::max(largest, st.shard.shard_numel);
    }
    const MemPlace place = !units_.empty() && units_[0].host_accumulator ? MemPlace::host : MemPlace::device;
    for (int b = 0; b < kTransientGradBuffers; ++b)
      staging_.emplace_back(largest * sizeof(float), MemCategory::grad, place);
    staging_user_.assign(staging_.size(), -1);
    return;
  }
  if (device_sums()) {
    // Note [Gradient sums on the device]: every sum on the device, host buffers to stage them in.
    ZERONE_ASSERT(config_.stage >= 2 && config_.grad_sums_on_device, "device sums the config does not ask for");
    size_t largest = 0;
    for (const UnitGrads& st : units_) {
      ZERONE_ASSERT(!st.host_accumulator, "device sums with a host accumulator");
      largest = std::max(largest, st.shard.shard_numel);
    }
    for (int b = 0; b < kDeviceSumStagingBuffers; ++b)
      staging_.emplace_back(largest * sizeof(float), MemCategory::grad, MemPlace::host);
    staging_user_.assign(staging_.size(), -1);
    return;
  }
  if (!swapped()) return;
  // One 4 KiB-aligned slot per unit in grads.swp, offload_buffer_count staging buffers.
  ZERONE_ASSERT(swap_dir != nullptr && config_.stage >= 2, "swapped gradients without a swap directory or below stage 2");
  uint64_t offset = 0;
  size_t largest = 0;
  for (UnitGrads& st : units_) {
    st.swap_bytes = optim::swap_tensor_bytes(st.shard.shard_numel);
    st.swap_offset = offset;
    offset += st.swap_bytes;
    largest = std::max(largest, st.swap_bytes);
  }
  swap_path_ = swap_dir->path() + "/grads.swp";
  swap_fd_ = swap_dir->create_file("grads.swp", offset);
  for (int b = 0; b < config_.offload_buffer_count; ++b) {
    staging_.emplace_back(largest, MemCategory::swap, MemPlace::host, io::kSwapAlignBytes);
    ZERONE_CHECK(!nvme.pin_memory || ::mlock(staging_.back().data(), largest) == 0,
                 "offload_optimizer.pin_memory: cannot lock ", largest, " bytes of gradient staging in memory: ",
                 std::strerror(errno), " (raise the locked-memory limit, ulimit -l, or set pin_memory false)");
  }
  staging_user_.assign(staging_.size(), -1);
  io_ = io::make_uring_io(nvme.aio);
  if (!nvme.grad_fault_plan.empty())  // tests: a plan of its own, counting this file's transfers
    io_ = io::make_fault_injecting_io(std::move(io_), io::parse_fault_plan(nvme.grad_fault_plan));
  nvme_grad_bytes_ = static_cast<int64_t>(offset);
  MemoryLedger::global().add(MemPlace::nvme, MemCategory::grad, nvme_grad_bytes_);
}

GradReducer::~GradReducer() {
  // Never leave the kernel, the communication thread or a copy writing into freed buffers.
  if (io_) io_->drain();
  if (nvme_grad_bytes_ > 0) MemoryLedger::global().sub(MemPlace::nvme, MemCategory::grad, nvme_grad_bytes_);
  for (UnitGrads& st : units_) {
    try {
      for (comm::Work& w : st.reduce_work) w.wait();
      st.accumulated.wait();
      st.staged.wait();
    } catch (...) {
    }
  }
}

const float* GradReducer::adopt(int u) {
  nn::FlatParam& unit = model_.units()[u];
  UnitGrads& st = units_[u];
  if (config_.stage <= 1) unit.allocate_grads();
  else unit.release_grads();
  if (swapped() || transient()) return nullptr;  // handed over before each update (stage_for_update)
  if (config_.stage >= 2) {
    st.accumulator = Buffer(st.shard.shard_numel * sizeof(float), MemCategory::grad,
                            st.host_accumulator ? MemPlace::host : MemPlace::device);
    return device_sums() ? nullptr : st.accumulator.as<float>();
  }
  if (config_.stage == 1) return unit.grad() + comm_.in_place_shard_offset(st.shard.shard_numel);  // reduced in place
  return unit.grad();
}

void GradReducer::before_backward(int u) {
  if (config_.stage < 2) return;
  for (int x : model_.units_touched(u)) {
    nn::FlatParam& unit = model_.units()[x];
    if (unit.has_grads()) continue;
    complete(x);  // the previous micro-step's reduction of this unit, if still in flight
    // Unzeroed: the backward overwrites or zeroes every element (Note [Fresh gradients]).
    unit.set_grads(pool_.acquire(unit.grad_bytes(), MemCategory::grad, /*zeroed=*/false), /*fresh=*/true);
  }
}

void GradReducer::after_backward(int u) {
  if (config_.stage >= 2 || last_micro_step_) launch(u);
  if (config_.stage >= 2) retire();
}

void GradReducer::launch(int u) {
  UnitGrads& st = units_[u];
  nn::FlatParam& unit = model_.units()[u];
  ProfileScope profile(ProfileCategory::comm);
  const size_t P = st.shard.padded_numel, S = st.shard.shard_numel;
  if (config_.stage == 0) {
    // All-reduce in buckets of at most reduce_bucket_numel elements.
    for (size_t off = 0; off < P; off += config_.reduce_bucket_numel)
      st.reduce_work.push_back(comm_.all_reduce_sum_async(unit.grad() + off, std::min(config_.reduce_bucket_numel, P - off)));
    return;
  }
  if (config_.stage == 1) {
    st.reduce_work.push_back(comm_.reduce_scatter_sum_async(unit.grad(), unit.grad(), S));
    return;
  }
  ZERONE_ASSERT(st.reduce_work.empty(), "unit ", u, " reduced twice in one micro-step");
  st.reduce_src = unit.take_grads();
  st.final_reduction = last_micro_step_;
  float* out;
  // Note [Transient gradients]: every micro-step is the step's only one.
  ZERONE_ASSERT(!transient() || (st.accumulator_zero && last_micro_step_), "unit ", u,
                " reduced twice in one step with transient gradients");
  if (st.accumulator_zero) {
    // First micro-step of the step: the accumulator is zero, so the shard can land in it directly
    // (Note [Gradient swap]: in a staging buffer, written to the slot once reduced; Note
    // [Transient gradients]: in a buffer held until the unit's update).
    if (swapped()) finish_write(u);  // a skipped step's write may still hold a buffer
    out = swapped() || transient() ? acquire_staging(u) : st.accumulator.as<float>();
    st.accumulator_zero = false;
  } else {
    st.reduce_out = pool_.acquire(S * sizeof(float), MemCategory::comm, /*zeroed=*/false);
    out = st.reduce_out.as<float>();
  }
  st.reduce_work.push_back(zeropp_ && zeropp_->quantizes_gradients()  // ZeRO++ qgZ
                               ? zeropp_->reduce_scatter(st.reduce_src.as<float>(), out, S)
                               : comm_.reduce_scatter_sum_async(st.reduce_src.as<float>(), out, S));
  reducing_.push_back(u);
  reducing_numel_ += P;
}

void GradReducer::retire() {
  // Reductions the communication thread has finished free their buffers now; beyond
  // reduce_bucket_size elements in flight the oldest are waited for (Note [Working-set bound]).
  // The newest always stays in flight to overlap the next unit's backward.
  while (!reducing_.empty()) {
    const int oldest = reducing_.front();
    const bool done = std::all_of(units_[oldest].reduce_work.begin(), units_[oldest].reduce_work.end(),
                                  [](const comm::Work& w) { return w.ready(); });
    if (!done && (reducing_.size() == 1 || reducing_numel_ <= config_.reduce_bucket_numel)) break;
    complete(oldest);  // the host does not wait for the addition (Note [Host sums added on the device])
  }
}

void GradReducer::finish_all() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) finish(u);
}

void GradReducer::finish(int u) {
  complete(u);
  units_[u].accumulated.wait();
}

// Note [Host sums added on the device]: with the optimizer offloaded (stages 2-3), a unit's
// gradient shard accumulator is host memory. The first micro-step's reduced shard lands in it
// directly (a device-to-host copy); every later micro-step's lands in a device buffer and has to
// be added to the sum. Adding on the host would make the host wait for the device's queue to
// drain, copy, and add while the device idles with nothing queued. Instead (DeepSpeed's
// "accumulate in CPU via GPU" does the same) the sum goes to the device and back, all queued:
//   host-to-device: the accumulator into the unit's full-gradient buffer, free once reduced
//                   (reduce_src: P >= S floats);
//   compute:        reduce_out += that copy (after the copy's event);
//   device-to-host: reduce_out into the accumulator; its event is `accumulated`.
// f32 addition commutes, so reduce_out + sum is bit for bit the host's sum + reduce_out. Both
// device buffers go back to the pool with the copies' events as their last uses (Note [Pooled
// reuse after last use]), so the working set is what it was; whoever reads the accumulator reads
// it through finish(), which waits for `accumulated`. The next micro-step's addition into it
// (started by before_backward or retire, which do not wait) has its host-to-device copy wait on
// the device for `accumulated`, so the host does not wait for an addition; where the pool has no
// settled buffer of the size asked for, the streams wait for the oldest's last uses (Note [Pooled
// reuse in stream order], core/memory.cc). Where the host can read the device's memory (the cpu device) the sum is added in
// place as before. The simulated device defers the copies until their events are observed (Note
// [Deferred copies]): a missed wait reads NaN there (tests/zero/delayed_update_test.cc: HostSums).
bool GradReducer::adds_on_device(const UnitGrads& st) const {
  return !device_.host_addressable() && device_.place_of(st.accumulator.data()) == MemPlace::host &&
         device_.place_of(st.reduce_out.data()) == MemPlace::device &&
         device_.place_of(st.reduce_src.data()) == MemPlace::device;
}

void GradReducer::add_on_device(UnitGrads& st) {
  const size_t bytes = st.shard.shard_numel * sizeof(float);
  ZERONE_ASSERT(st.reduce_src.bytes() >= bytes, "a full-gradient buffer smaller than its shard");
  device_.wait(kernels::Stream::host_to_device, st.accumulated);  // the previous micro-step's sum is back
  float* sum = st.reduce_src.as<float>();
  const Event sum_in = device_.copy_async(sum, MemPlace::device, st.accumulator.data(), MemPlace::host, bytes);
  device_.wait(kernels::Stream::compute, sum_in);
  device_.accumulate(st.reduce_out.as<float>(), sum, st.shard.shard_numel);
  st.accumulated = device_.copy_async(st.accumulator.data(), MemPlace::host, st.reduce_out.data(), MemPlace::device, bytes);
  const Event compute = device_.record(kernels::Stream::compute), comm = device_.record(kernels::Stream::comm);
  pool_.release(std::move(st.reduce_out), {compute, comm, st.accumulated});
  pool_.release(std::move(st.reduce_src), {compute, comm, sum_in});
}

void GradReducer::complete(int u) {
  UnitGrads& st = units_[u];
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
    accumulate_into(device_, acc, st.reduce_out.as<float>(), S);
    release_to_pool(pool_, std::move(st.reduce_out), device_);
  };
  if (swapped()) {
    // Note [Gradient swap]: the first micro-step's shard landed in a staging buffer; a later one
    // landed in the pool and is added to the slot read back. Either way the sum goes to the slot.
    float* acc;
    if (st.reduce_out.empty()) {
      acc = staging_[st.staging].as<float>();
    } else {
      finish_write(u);  // the previous micro-step's
      acc = acquire_staging(u);
      {
        ProfileScope profile(ProfileCategory::swap);
        io_->wait(io_->start(io::IoOp::read, swap_fd_.get(), swap_path_, acc, st.swap_bytes, st.swap_offset));
      }
      accumulate(acc);
    }
    if (last_micro_step_) {
      // The norm of the step's gradients, as the step's pass would measure it (the same function,
      // Note [Deterministic gradient norm]).
      st.swapped_sumsq = backend_of(device_, acc).sum_squares(acc, S);
    }
    st.write = io_->start(io::IoOp::write, swap_fd_.get(), swap_path_, acc, st.swap_bytes, st.swap_offset);
    writes_.push_back(u);
    release_to_pool(pool_, std::move(st.reduce_src), device_);
    return;
  }
  // Accumulate this micro-step's reduced shard (unless it landed in the accumulator directly)
  // and give the full gradients back to the pool.
  if (!st.reduce_out.empty()) {
    if (adds_on_device(st)) return add_on_device(st);
    accumulate(st.accumulator.as<float>());
  }
  release_to_pool(pool_, std::move(st.reduce_src), device_);
  // Note [Gradient sums on the device]: the step's sum is complete; it starts for the host while
  // the backward goes on, where a buffer is free.
  if (device_sums() && st.final_reduction) start_staging_copy(u, /*evict=*/false);
}

bool GradReducer::start_staging_copy(int u, bool evict, int keep) {
  UnitGrads& st = units_[u];
  ZERONE_ASSERT(st.staging < 0, "unit ", u, "'s sum staged twice");
  auto free_buffer = std::find(staging_user_.begin(), staging_user_.end(), -1);
  if (free_buffer == staging_user_.end()) {
    if (!evict) return false;
    // A unit whose copy started early but which is not being updated gives its buffer up and is
    // copied again at its own update (an update order the early copies did not foresee: the
    // update at the end goes bottom up, the backward top down). The optimizer reads one unit's
    // sum at a time, `keep`'s, so the other buffer is never the one it reads.
    free_buffer = std::find_if(staging_user_.begin(), staging_user_.end(),
                               [u, keep](int holder) { return holder != u && holder != keep; });
    ZERONE_ASSERT(free_buffer != staging_user_.end(), "no staging buffer for unit ", u, "'s sum");
    release_staging(*free_buffer);
  }
  const size_t b = static_cast<size_t>(free_buffer - staging_user_.begin());
  staging_user_[b] = u;
  st.staging = static_cast<int>(b);
  st.staged = device_.copy_async(staging_[b].data(), MemPlace::host, st.accumulator.data(), MemPlace::device,
                                 st.shard.shard_numel * sizeof(float));
  return true;
}

void GradReducer::release_staging(int u) {
  UnitGrads& st = units_[u];
  if (st.staging < 0) return;
  st.staged.wait();  // the buffer's next copy must not meet this one (Note [Deferred copies])
  staging_user_[std::exchange(st.staging, -1)] = -1;
}

float* GradReducer::acquire_staging(int u) {
  for (;;) {
    for (size_t b = 0; b < staging_.size(); ++b) {
      if (staging_user_[b] >= 0) continue;
      staging_user_[b] = u;
      units_[u].staging = static_cast<int>(b);
      return staging_[b].as<float>();
    }
    // Note [Transient gradients]: only an update frees a buffer, and the schedule never needs a third.
    ZERONE_ASSERT(!transient(), "unit ", u, " found both transient gradient buffers held (units ", staging_user_[0],
                  " and ", staging_user_[1], ")");
    if (!writes_.empty()) {
      finish_write(writes_.front());
      continue;
    }
    ZERONE_ASSERT(!reducing_.empty(), "no gradient staging buffer can be freed");
    finish(reducing_.front());
  }
}

void GradReducer::finish_write(int u) {
  UnitGrads& st = units_[u];
  if (st.write != 0) {
    {
      ProfileScope profile(ProfileCategory::swap);
      io_->wait(std::exchange(st.write, 0));
    }
    writes_.erase(std::find(writes_.begin(), writes_.end(), u));
  }
  if (st.staging >= 0) staging_user_[std::exchange(st.staging, -1)] = -1;
}

void GradReducer::stage_for_update(int u, int next) {
  UnitGrads& st = units_[u];
  if (device_sums()) {  // Note [Gradient sums on the device]
    ZERONE_ASSERT(st.reduce_work.empty(), "unit ", u, " updated before its gradients were reduced");
    if (st.staging < 0) start_staging_copy(u, /*evict=*/true);
    // The next update's sum, where complete, crosses while this update runs.
    if (next >= 0 && next != u) {
      UnitGrads& nx = units_[next];
      if (nx.staging < 0 && nx.final_reduction && nx.reduce_work.empty()) start_staging_copy(next, /*evict=*/true, u);
    }
    {
      ProfileScope profile(ProfileCategory::optimizer);
      st.staged.wait();
    }
    optimizer_->set_grad(static_cast<size_t>(u), staging_[st.staging].as<float>());
    return;
  }
  if (transient()) {  // Note [Transient gradients]: where the reduction landed
    ZERONE_ASSERT(st.staging >= 0 && st.reduce_work.empty(), "unit ", u, " updated before its gradients were reduced");
    optimizer_->set_grad(static_cast<size_t>(u), staging_[st.staging].as<float>());
    return;
  }
  if (!swapped()) return;
  float* g;
  if (st.staging >= 0) {
    g = staging_[st.staging].as<float>();  // still holds what is being written
  } else {
    g = acquire_staging(u);
    ProfileScope profile(ProfileCategory::swap);
    io_->wait(io_->start(io::IoOp::read, swap_fd_.get(), swap_path_, g, st.swap_bytes, st.swap_offset));
  }
  optimizer_->set_grad(static_cast<size_t>(u), g);
}

void GradReducer::unstage(int u) {
  if (device_sums()) {
    release_staging(u);
    optimizer_->set_grad(static_cast<size_t>(u), nullptr);
    return;
  }
  if (transient()) {
    UnitGrads& st = units_[u];
    if (st.staging >= 0) staging_user_[std::exchange(st.staging, -1)] = -1;
    optimizer_->set_grad(static_cast<size_t>(u), nullptr);
    return;
  }
  if (!swapped()) return;
  finish_write(u);
  optimizer_->set_grad(static_cast<size_t>(u), nullptr);
}

PendingSum GradReducer::sumsq(int u) const {
  // Note [Gradient swap]: the slot's sum was measured as the last micro-step finished.
  if (swapped()) return units_[u].swapped_sumsq;
  const float* grad = optimizer_->grad(static_cast<size_t>(u));
  // Note [Gradient sums on the device]: measured there, as a run without offload measures it.
  if (device_sums()) grad = units_[u].accumulator.as<float>();
  if (transient()) {  // Note [Transient gradients]: the buffer, before the update hands it back
    ZERONE_ASSERT(units_[u].staging >= 0, "the sum of squares of unit ", u, "'s transient gradients after its update");
    grad = staging_[units_[u].staging].as<float>();
  }
  return backend_of(device_, grad).sum_squares(grad, optimizer_->numel(static_cast<size_t>(u)));
}

void GradReducer::start_new_sum() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    units_[u].accumulator_zero = true;
    units_[u].final_reduction = false;
    if (device_sums()) release_staging(u);  // a copy started for a step that was skipped
  }
}

}  // namespace zerone::zero
