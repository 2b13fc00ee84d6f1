#include "zerone/optim/adamw.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"

namespace zerone::optim {

AdamW::AdamW(std::vector<ShardRef> shards, DType param_dtype, const AdamWOptions& options, MemPlace state_place)
    : shards_(std::move(shards)), param_dtype_(param_dtype), options_(options), state_place_(state_place) {
  state_.resize(shards_.size());
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardRef& s = shards_[i];
    State& st = state_[i];
    st.m = Buffer(s.numel * sizeof(float), MemCategory::optim, state_place);
    st.v = Buffer(s.numel * sizeof(float), MemCategory::optim, state_place);
    if (param_dtype_ != DType::f32) {
      st.master = Buffer(s.numel * sizeof(float), MemCategory::master, state_place);
      load_master(st.master.as<float>(), state_place, s.param, param_dtype_, s.numel);
    }
    for (auto [b, e] : s.decay_ranges) ZERONE_ASSERT(b <= e && e <= s.numel, "bad decay range");
  }
}

float* AdamW::master(size_t i) {
  return param_dtype_ == DType::f32 ? static_cast<float*>(shards_[i].param) : state_[i].master.as<float>();
}

kernels::AdamWHyper AdamW::hyper(const AdamWOptions& options, float lr, float grad_scale, int step) {
  kernels::AdamWHyper h;
  h.lr = lr;
  h.beta1 = options.beta1;
  h.beta2 = options.beta2;
  h.eps = options.eps;
  h.step = step;
  h.grad_scale = grad_scale;
  return h;
}

PendingSum AdamW::update_slice(MemPlace run_place, const ShardRef& s, DType param_dtype, const AdamWOptions& options,
                               kernels::AdamWHyper h, size_t begin, size_t end, float* master, float* m, float* v) {
  ZERONE_ASSERT(begin <= end && end <= s.numel);
  kernels::Backend& backend = kernels::backend_for(run_place);
  const size_t ds = dtype_size(param_dtype);
  void* param_out = param_dtype == DType::f32 ? nullptr : static_cast<char*>(s.param) + begin * ds;
  // The slice's operands where the update runs, staged once for all its decay runs (Note
  // [Operands in another place]), and one call for the runs, so that a GPU copies its norm's
  // partials once per slice (Note [Updates that measure the norm]); the host reads them once a
  // step (Note [Norms read once a step], core/pending_sum.h).
  return run_with_operands_in(run_place, param_dtype, end - begin, {master, s.grad + begin, param_out},
                              [&](const RunOperands& o) {
                                std::vector<kernels::Backend::AdamWRange> ranges;  // the decay runs, in order
                                for_each_decay_run(s, begin, end, options.weight_decay, [&](size_t b, size_t e, float wd) {
                                  h.weight_decay = wd;
                                  const size_t at = b - begin;
                                  ranges.push_back({o.master + at, m + at, v + at, o.grad + at,
                                                    o.param ? static_cast<char*>(o.param) + at * ds : nullptr, e - b, h});
                                });
                                return ranges.empty() ? 0.0 : backend.adamw_update_ranges(ranges, param_dtype);
                              });
}

namespace {

// Whether the operand at p (null: none) lives outside run_place.
bool elsewhere(MemPlace run_place, const void* p) {
  return p != nullptr && kernels::device_backend().place_of(p) != run_place;
}

}  // namespace

// Note [Installing staged operands]: an update that ran on the host (the optimizer offloaded)
// staged the device's parameters (and an f32 master that is the parameters) in host scratch; they
// go back with copy_async, and the device's compute stream waits for the copy (every kernel
// submitted later reads the new values), not the host: a synchronous copy would make the host
// wait for the device's queue to drain at every slice. The scratch is kept until its copy
// completed: freed by a later install that finds it done, at the latest by wait_installs(), which
// every optimizer's end_step() and abort_step() call. Writes back to the host stay synchronous
// (the host reads them next), and so does staging in: with f32 parameters the master is the
// device's parameters and is copied over before each slice, and at stage 1 the gradient slice is,
// so there the host still waits for the device once per slice. At most kInstallsInFlight copies
// are in flight: a further install waits for the oldest, so that the host scratch they hold is
// bounded by that many slices (the largest unit's shard each) however far the copy stream lags.
// The scratch is kept for the next slices rather than freed (kKeptStagingBuffers, each as large
// as the largest slice so far, taken by any slice that fits): on a GPU it is pinned memory, and
// pinning a Llama-2-7B layer's 404 MB of bf16 parameters takes a system call and a zero fill while
// freeing it synchronizes the device, once per unit and step otherwise (the pinned arena caches
// blocks of at most 256 MiB, Note [Pinned host memory]). The ledger counts the kept buffers as
// scratch in run_place, which is what they hold, until the engine releases them as it goes
// (release_kept_staging). zerone estimate bounds them (Note [Working-set bound]: host_scratch).
namespace {

struct PendingInstall {
  Buffer staging;
  Event copied;
};
std::mutex g_installs_mutex;
// In submission order. Never destroyed: an exit may leave entries, whose buffers must not be freed
// after the arenas they came from (Note [CUDA at exit] in kernels/cuda/cuda_backend.cc). The same
// for the kept staging.
std::deque<PendingInstall>& g_installs = *new std::deque<PendingInstall>;
std::vector<Buffer>& g_kept_staging = *new std::vector<Buffer>;
std::atomic<uint64_t> g_installs_launched{0};
std::atomic<uint64_t> g_staging_allocations{0};

// Under g_installs_mutex: a staging buffer no copy reads any more goes back to the kept ones (the
// smallest kept one gives way when there are kKeptStagingBuffers already and it is smaller).
void keep_locked(Buffer&& staging) {
  if (staging.empty()) return;
  if (g_kept_staging.size() < kKeptStagingBuffers) {
    g_kept_staging.push_back(std::move(staging));
    return;
  }
  auto smallest = std::min_element(g_kept_staging.begin(), g_kept_staging.end(),
                                   [](const Buffer& a, const Buffer& b) { return a.bytes() < b.bytes(); });
  if (smallest->bytes() < staging.bytes()) *smallest = std::move(staging);
}

void retire_installs_locked() {
  while (!g_installs.empty() && (g_installs.front().copied.ready() || g_installs.size() >= kInstallsInFlight)) {
    g_installs.front().copied.wait();
    keep_locked(std::move(g_installs.front().staging));
    g_installs.pop_front();
  }
}

// At least `bytes` of staging in `place`: the smallest kept buffer that holds them, or a new one
// as large as the largest kept (so that later slices fit it too).
Buffer take_staging(size_t bytes, MemPlace place) {
  size_t largest = bytes;
  {
    std::lock_guard<std::mutex> lock(g_installs_mutex);
    retire_installs_locked();
    auto best = g_kept_staging.end();
    for (auto it = g_kept_staging.begin(); it != g_kept_staging.end(); ++it) {
      if (it->place() != place) continue;
      largest = std::max(largest, it->bytes());
      if (it->bytes() >= bytes && (best == g_kept_staging.end() || it->bytes() < best->bytes())) best = it;
    }
    if (best != g_kept_staging.end()) {
      Buffer out = std::move(*best);
      g_kept_staging.erase(best);
      return out;
    }
  }
  g_staging_allocations.fetch_add(1, std::memory_order_relaxed);
  return Buffer(largest, MemCategory::scratch, place);
}

void keep_staging(Buffer&& staging) {
  std::lock_guard<std::mutex> lock(g_installs_mutex);
  keep_locked(std::move(staging));
}

// Copies the first `bytes` of `staging` to dst on the device, the staging kept until it is read.
void install_on_device(void* dst, Buffer&& staging, size_t bytes) {
  ZERONE_ASSERT(bytes <= staging.bytes(), "an install larger than its staging");
  kernels::Backend& device = kernels::device_backend();
  std::lock_guard<std::mutex> lock(g_installs_mutex);
  retire_installs_locked();
  // Kept before the copy is queued, so that nothing can free the staging while the copy reads it.
  PendingInstall& pending = g_installs.emplace_back(PendingInstall{std::move(staging), Event()});
  pending.copied = device.copy_async(dst, MemPlace::device, pending.staging.data(), pending.staging.place(), bytes);
  device.wait(kernels::Stream::compute, pending.copied);
  g_installs_launched.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

uint64_t installs_launched() { return g_installs_launched.load(std::memory_order_relaxed); }
uint64_t staging_allocations() { return g_staging_allocations.load(std::memory_order_relaxed); }

void wait_installs() {
  std::lock_guard<std::mutex> lock(g_installs_mutex);
  for (PendingInstall& p : g_installs) {
    p.copied.wait();
    keep_locked(std::move(p.staging));
  }
  g_installs.clear();
}

void release_kept_staging() {
  std::vector<Buffer> released;
  {
    std::lock_guard<std::mutex> lock(g_installs_mutex);
    released.swap(g_kept_staging);
  }
}

bool operands_in(MemPlace run_place, const RunOperands& operands) {
  return kernels::device_backend().host_addressable() ||
         (!elsewhere(run_place, operands.master) && !elsewhere(run_place, operands.grad) &&
          !elsewhere(run_place, operands.param));
}

PendingSum run_with_operands_in(MemPlace run_place, DType param_dtype, size_t n, const RunOperands& operands,
                                const std::function<PendingSum(const RunOperands& local)>& run) {
  if (operands_in(run_place, operands)) return run(operands);
  kernels::Backend& device = kernels::device_backend();
  RunOperands local = operands;
  // Scratch in run_place for the operands that live elsewhere, from the kept staging (Note
  // [Installing staged operands]); each holds at least its operand's bytes.
  Buffer master, grad, param;
  const size_t master_bytes = n * sizeof(float), grad_bytes = n * sizeof(float), param_bytes = n * dtype_size(param_dtype);
  if (elsewhere(run_place, operands.master)) {
    master = take_staging(master_bytes, run_place);
    device.copy_any(master.data(), operands.master, master_bytes);
    local.master = master.as<float>();
  }
  if (elsewhere(run_place, operands.grad)) {
    grad = take_staging(grad_bytes, run_place);
    device.copy_any(grad.data(), operands.grad, grad_bytes);
    local.grad = grad.as<float>();
  }
  if (elsewhere(run_place, operands.param)) {
    param = take_staging(param_bytes, run_place);
    local.param = param.data();
  }
  const PendingSum sumsq = run(local);
  keep_staging(std::move(grad));
  // Back where they live: to the device without the host waiting (Note [Installing staged operands]).
  auto write_back = [&](void* dst, Buffer& staged, size_t bytes) {
    if (staged.empty()) return;
    if (device.place_of(dst) == MemPlace::device && staged.place() == MemPlace::host) {
      install_on_device(dst, std::move(staged), bytes);
    } else {
      device.copy_any(dst, staged.data(), bytes);
      keep_staging(std::move(staged));
    }
  };
  write_back(operands.master, master, master_bytes);
  write_back(operands.param, param, param_bytes);
  return sumsq;
}

void load_master(float* master, MemPlace master_place, const void* param, DType param_dtype, size_t n) {
  kernels::Backend& device = kernels::device_backend();
  if (device.host_addressable() || device.place_of(param) == master_place) {
    kernels::backend_for(master_place).convert(master, DType::f32, param, param_dtype, n);
    return;
  }
  // Through the kept staging (Note [Installing staged operands]): one pinned buffer for every
  // shard, which the first step's updates then take.
  const size_t bytes = n * dtype_size(param_dtype);
  Buffer local = take_staging(bytes, master_place);
  device.copy_any(local.data(), param, bytes);
  kernels::backend_for(master_place).convert(master, DType::f32, local.data(), param_dtype, n);
  keep_staging(std::move(local));
}

void for_each_decay_run(const ShardRef& s, size_t begin, size_t end, float weight_decay,
                        const std::function<void(size_t b, size_t e, float weight_decay)>& fn) {
  auto run = [&](size_t b, size_t e, float wd) {
    b = std::max(b, begin);
    e = std::min(e, end);
    if (b < e) fn(b, e, wd);
  };
  size_t pos = 0;
  for (auto [b, e] : s.decay_ranges) {
    run(pos, b, 0.0f);
    run(b, e, weight_decay);
    pos = e;
  }
  run(pos, s.numel, 0.0f);
}

void AdamW::begin_step(float lr, float grad_scale) {
  ++step_;
  h_ = hyper(options_, lr, grad_scale, step_);
}

PendingSum AdamW::update_shard(size_t i, size_t /*next_shard*/) {
  ProfileScope profile(ProfileCategory::optimizer);
  return update_slice(state_place_, shards_[i], param_dtype_, options_, h_, 0, shards_[i].numel, master(i), m(i), v(i));
}

std::vector<float*> AdamW::undo_tensors(size_t i) {
  if (param_dtype_ == DType::f32) return {m(i), v(i)};
  return {master(i), m(i), v(i)};
}

void StepUndo::save_undo(size_t i, void* dst) {
  char* out = static_cast<char*>(dst);
  const size_t bytes = undo_numel(i) * sizeof(float);
  kernels::Backend& backend = kernels::backend_for(undo_place());
  for (float* t : undo_tensors(i)) {
    backend.copy(out, undo_place(), t, undo_place(), bytes);
    out += bytes;
  }
}

void StepUndo::restore_undo(size_t i, const void* src) {
  const char* in = static_cast<const char*>(src);
  const size_t bytes = undo_numel(i) * sizeof(float);
  kernels::Backend& backend = kernels::backend_for(undo_place());
  for (float* t : undo_tensors(i)) {
    backend.copy(t, undo_place(), in, undo_place(), bytes);
    in += bytes;
  }
}

PendingSum ShardStepping::step(float lr, float grad_scale, const std::function<void(size_t shard)>& shard_done,
                               const std::function<void(size_t shard)>& shard_begin) {
  ZERONE_ASSERT(supports_shard_steps(), "an optimizer without per-shard steps must override step()");
  begin_step(lr, grad_scale);
  PendingSum sumsq;
  const size_t n = num_shards();
  for (size_t i = 0; i < n; ++i) {
    if (shard_begin) shard_begin(i);
    sumsq += update_shard(i, i + 1 < n ? i + 1 : kNoShard);
    if (shard_done) shard_done(i);
  }
  end_step();
  return sumsq;
}

std::vector<std::string> adamw_state_names(DType param_dtype) {
  if (param_dtype == DType::f32) return {"exp_avg", "exp_avg_sq"};
  return {"master", "exp_avg", "exp_avg_sq"};
}

namespace {
// The state tensors of shard i in state_names() order.
std::vector<float*> adamw_tensors(AdamW& adam, size_t i, DType param_dtype) {
  if (param_dtype == DType::f32) return {adam.m(i), adam.v(i)};
  return {adam.master(i), adam.m(i), adam.v(i)};
}
}  // namespace

void AdamW::export_state(const std::function<void(const StatePiece&, const float* data)>& fn) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    std::vector<float*> tensors = adamw_tensors(*this, i, param_dtype_);
    for (size_t k = 0; k < tensors.size(); ++k) fn(StatePiece{i, static_cast<int>(k), 0, shards_[i].numel}, tensors[k]);
  }
}

void AdamW::import_state(const std::function<void(const StatePiece&, float* data)>& fn) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    std::vector<float*> tensors = adamw_tensors(*this, i, param_dtype_);
    for (size_t k = 0; k < tensors.size(); ++k) fn(StatePiece{i, static_cast<int>(k), 0, shards_[i].numel}, tensors[k]);
  }
}

}  // namespace zerone::optim
