#include "zerone/zero/step_scheduler.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"
#include "zerone/zero/places.h"

namespace zerone::zero {

StepScheduler::StepScheduler(nn::Model& model, comm::Communicator& comm, const ZeroConfig& config,
                             kernels::Backend& device, ParamStore& params, GradReducer& grads,
                             optim::Optimizer& optimizer, std::unique_ptr<DelayedUpdate> delayed,
                             const std::vector<void*>& optimizer_params, const std::vector<size_t>& optimizer_numels)
    : model_(model),
      comm_(comm),
      config_(config),
      device_(device),
      params_(params),
      grads_(grads),
      optimizer_(optimizer),
      delayed_(std::move(delayed)),
      world_(comm.world_size()),
      dsize_(dtype_size(model.compute_dtype())),
      undo_(model.num_units()) {
  ZERONE_ASSERT(!config_.delayed_update == !delayed_, "--delayed-update without its buffers, or the reverse");
  for (int u = 0; u < num_units(); ++u) {
    undo_[u].optimizer_param = optimizer_params[u];
    undo_[u].optimizer_numel = optimizer_numels[u];
  }
  // Note [Speculative early step]: every unit but the first (whose gradients are final only at
  // the end of the backward, so it is never updated before the step is validated) gets an undo
  // copy of what its update overwrites in memory (swapped state uses spare slots instead).
  speculation_ready_ = speculates(config_);
  ZERONE_ASSERT(!speculation_ready_ || optimizer_.supports_shard_steps(), "a speculative early step without shard steps");
  if (speculation_ready_) {
    for (int u = 1; u < num_units(); ++u) {
      UnitUndo& st = undo_[u];
      if (!params_.swapped(u))
        st.param = Buffer(st.optimizer_numel * dsize_, MemCategory::scratch,
                          params_.sharded(u) ? offload_place(config_.offload_param) : MemPlace::device);
      if (size_t bytes = optimizer_.undo_bytes(static_cast<size_t>(u)); bytes > 0)
        st.optim = Buffer(bytes, MemCategory::scratch, offload_place(config_.offload_optimizer));
    }
  }
  last_toucher_.resize(num_units());
  for (int u = 0; u < num_units(); ++u) last_toucher_[u] = u;
  for (int u = 0; u < num_units(); ++u)
    for (int x : model.units_touched(u)) last_toucher_[x] = std::min(last_toucher_[x], u);
}

double StepScheduler::global_norm_sq(double local_sumsq) const {
  // Stage 0: every rank holds the whole reduced gradient. Otherwise each holds its shard.
  double total = config_.stage == 0 ? local_sumsq : comm_.all_reduce_sum(local_sumsq);
  return total / (static_cast<double>(world_) * world_);  // gradients are sums over ranks
}

PendingSum StepScheduler::local_sumsq() const {
  // In shard order (Note [Deterministic gradient norm]); every unit's sum launched before the
  // host reads any (Note [Norms read once a step]).
  PendingSum local;
  for (size_t i = 0; i < optimizer_.num_shards(); ++i) local += grads_.sumsq(static_cast<int>(i));
  return local;
}

// ---------------------------------------------------------------- at the end

StepResult StepScheduler::step(float lr, float grad_clip, double loss_scale, bool skip_on_overflow) {
  params_.drop_secondaries();  // hpZ: every backward is done; the update makes them stale
  if (early_.active) {
    ZERONE_ASSERT(lr == early_.lr && grad_clip == early_.grad_clip && loss_scale == early_.loss_scale &&
                      skip_on_overflow == early_.skip_on_overflow,
                  "step() called with other arguments than plan_step()");
    return step_early();
  }
  grads_.finish_all();
  if (delayed_) return step_delayed(lr, grad_clip, loss_scale, skip_on_overflow);
  // Gradients are sums over ranks of loss_scale-scaled gradients.
  const double unscale = 1.0 / (static_cast<double>(world_) * loss_scale);
  StepResult result;
  float clip = 1.0f;
  if (grad_clip > 0.0f || skip_on_overflow) {
    // The norm must be known before the update: one extra read of the gradient shards.
    result.norm = std::sqrt(global_norm_sq(local_sumsq().value())) / loss_scale;
    if (!std::isfinite(result.norm)) {
      ZERONE_CHECK(skip_on_overflow, "gradient norm is ", result.norm, ": training diverged (try a lower --lr)");
      result.overflow = true;  // skipped: the gradients are dropped as after an update
      drop_gradients();
      return result;
    }
    if (grad_clip > 0.0f && result.norm > grad_clip) clip = static_cast<float>(grad_clip / result.norm);
    speculate_next_ = clip == 1.0f;  // Note [Speculative early step]: the prediction for the next step
  }
  // With the norm measured first, the update's own sum is never read (nor waited for).
  const PendingSum sumsq = update_at_end(lr, static_cast<float>(unscale) * clip);
  if (grad_clip <= 0.0f && !skip_on_overflow) {
    result.norm = std::sqrt(global_norm_sq(sumsq.value())) / loss_scale;
    ZERONE_CHECK(std::isfinite(result.norm), "gradient norm is ", result.norm,
                 ": training diverged (try a lower --lr or --grad-clip)");
  }
  return result;
}

PendingSum StepScheduler::update_at_end(float lr, float grad_scale) {
  // Stage 3: gathered copies of sharded units go stale with the update.
  for (int u = 0; u < num_units(); ++u) params_.release(u);
  const PendingSum sumsq = optimizer_.step(
      lr, grad_scale, [this](size_t shard) { on_shard_updated(static_cast<int>(shard)); },
      [this](size_t shard) {
        params_.load_for_update(static_cast<int>(shard));
        // Shards are updated in order (ShardStepping::step).
        grads_.stage_for_update(static_cast<int>(shard), shard + 1 < optimizer_.num_shards() ? static_cast<int>(shard) + 1 : -1);
      });
  finish_update();
  return sumsq;
}

void StepScheduler::on_shard_updated(int u) {
  // Shards map one to one to units. Note [Gathers overlap the next forward] in param_store.cc.
  grads_.unstage(u);
  if (config_.stage <= 1) model_.units()[u].mark_grads_fresh();
  params_.after_update(u);
}

void StepScheduler::finish_update() {
  params_.retire_writes(0);
  params_.commit_slots();
  // The update consumed the gradients without zeroing them (a write stream saved).
  grads_.start_new_sum();
}

void StepScheduler::drop_gradients() {
  // As after an update: the next micro-step starts a new sum.
  grads_.start_new_sum();
  for (int u = 0; u < num_units(); ++u)
    if (config_.stage <= 1) model_.units()[u].mark_grads_fresh();
}

// ---------------------------------------------------------------- early

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
// by GradReducer::sumsq just before its early update (the gradients are then final and about to be read
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
//     optim/swapped.h), made current when the step ends, forgotten when it is taken back. No I/O
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
// one measured as its last micro-step finished (GradReducer::sumsq), the value the
// plain step adds too; the gradient slot is only read by an update, so a redone step stages it
// again (update_at_end's stage_for_update) and a skipped one drops it as the plain step does.
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

void StepScheduler::plan_step(float lr, float grad_clip, double loss_scale, bool skip_on_overflow) {
  ZERONE_ASSERT(!early_.begun, "plan_step() twice without step()");
  const bool can = config_.early_step && !config_.delayed_update && optimizer_.supports_shard_steps();
  const bool exact = grad_clip <= 0.0f && !skip_on_overflow;
  const bool predicted = speculate_next_ || config_.speculate_always;
  early_.speculative = can && !exact && speculation_ready_ && predicted;
  early_.active = can && (exact || early_.speculative);
  // Note [Transient gradients]: the trainer asks for them only where every step is this one.
  ZERONE_ASSERT(!grads_.transient() || (early_.active && !early_.speculative),
                "transient gradients for a step that is not an exact early step");
  if (can && !exact && speculation_ready_ && !predicted) ++early_stats_.held_back;
  early_.lr = lr;
  early_.grad_clip = grad_clip;
  early_.loss_scale = loss_scale;
  early_.skip_on_overflow = skip_on_overflow;
  early_.sumsq = PendingSum();
  early_.waiting.clear();
  early_.updated.assign(num_units(), 0);
}

void StepScheduler::after_backward(int u) {
  // Note [Transient gradients]: only the early updates hand the buffers back.
  ZERONE_ASSERT(!grads_.transient() || early_.active, "a backward with transient gradients but no plan_step()");
  if (!early_.active || !grads_.last_micro_step()) return;
  // Update the units that were final before u's backward; u waits (its reduction is in flight).
  std::vector<int> ready;
  for (int x : early_.waiting)
    if (last_toucher_[x] > u) ready.push_back(x);
  for (size_t k = 0; k < ready.size(); ++k) early_update(ready[k], k + 1 < ready.size() ? ready[k + 1] : u);
  std::erase_if(early_.waiting, [&](int x) { return early_.updated[x] != 0; });
  early_.waiting.push_back(u);
}

void StepScheduler::early_update(int u, int next) {
  if (!early_.begun) {
    optimizer_.begin_step(early_.lr, static_cast<float>(1.0 / (static_cast<double>(world_) * early_.loss_scale)));
    early_.begun = true;
  }
  grads_.finish(u);
  params_.release(u);  // stage 3: a gathered copy would go stale
  params_.load_for_update(u);
  UnitUndo& st = undo_[u];
  if (early_.speculative && early_.active) {
    // Note [Speculative early step]: measure, and keep what the update overwrites in memory.
    ZERONE_ASSERT(u > 0, "the first unit is never updated before the step is validated");
    st.sumsq = grads_.sumsq(u);
    if (!st.param.empty()) device_.copy_any(st.param.data(), st.optimizer_param, st.optimizer_numel * dsize_);
    if (!st.optim.empty()) optimizer_.save_undo(static_cast<size_t>(u), st.optim.data());
  }
  grads_.stage_for_update(u, next);
  early_.sumsq += optimizer_.update_shard(static_cast<size_t>(u),
                                          next >= 0 ? static_cast<size_t>(next) : optim::Optimizer::kNoShard);
  on_shard_updated(u);
  early_.updated[u] = 1;
}

std::vector<int> StepScheduler::take_back_early() {
  // Note [Speculative early step]: every write of the early updates is complete before anything
  // is restored (parameter shards on their way to params.swp, gathers of updated shards).
  params_.retire_writes(0);
  std::vector<int> taken_back;
  for (int u = 0; u < num_units(); ++u) {
    if (!early_.updated[u]) continue;
    taken_back.push_back(u);
    UnitUndo& st = undo_[u];
    params_.wait_gather(u);
    if (!st.param.empty()) device_.copy_any(st.optimizer_param, st.param.data(), st.optimizer_numel * dsize_);
    if (!st.optim.empty()) optimizer_.restore_undo(static_cast<size_t>(u), st.optim.data());
    params_.forget_spare(u);  // the current slot holds the shard
    early_.updated[u] = 0;
  }
  optimizer_.abort_step();
  early_.begun = false;
  return taken_back;
}

StepResult StepScheduler::step_early() {
  early_.active = false;
  StepResult result;
  if (early_.speculative) {
    // Note [Speculative early step]: validate with the plain step's norm.
    PendingSum local;
    for (int u = 0; u < num_units(); ++u) {
      if (!early_.updated[u]) {
        grads_.finish(u);
        undo_[u].sumsq = grads_.sumsq(u);
      }
      local += undo_[u].sumsq;
    }
    result.norm = std::sqrt(global_norm_sq(local.value())) / early_.loss_scale;
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
        for (int u : taken_back)
          if (config_.stage != 0 && !params_.sharded(u)) params_.gather_updated(u);
        drop_gradients();
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
  for (int u = num_units() - 1; u >= 0; --u)
    if (!early_.updated[u]) rest.push_back(u);
  for (size_t k = 0; k < rest.size(); ++k) early_update(rest[k], k + 1 < rest.size() ? rest[k + 1] : -1);
  optimizer_.end_step();
  early_.begun = false;
  finish_update();
  if (!early_.speculative) {
    result.norm = std::sqrt(global_norm_sq(early_.sumsq.value())) / early_.loss_scale;
    ZERONE_CHECK(std::isfinite(result.norm), "gradient norm is ", result.norm,
                 ": training diverged (try a lower --lr or --grad-clip)");
  }
  return result;
}

// ---------------------------------------------------------------- delayed

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
// The optimizer thread uses half the OpenMP threads where the model computes on the host's cores
// too (cpu, sim: one on a machine this small; see docs/BENCHMARKS.md for whether it pays on 2
// cores), and all but one beside a GPU, whose training thread only queues its work
// (DelayedUpdate::threads_). It does no collective and no parameter swap
// I/O (hence no --offload-param nvme); optimizer NVMe swap runs on it unchanged. Memory: one more
// f32 gradient copy and one parameter copy (compute dtype) of the rank's optimizer shard, in the
// ledger as grad and param where that shard's optimizer runs, and in zerone estimate --delayed-update
// (Note [Offload places] in partition.h). Gradient accumulation is unchanged: every
// micro-step of step s+1 sees theta_{s-1}.

DelayedUpdate::~DelayedUpdate() {
  if (worker_.joinable()) worker_.join();
}

void DelayedUpdate::redirect(optim::ShardRef& ref, MemPlace place, MemPlace param_place, DType param_dtype,
                             kernels::Backend& device) {
  if (grad_src_.empty())
    threads_ = std::max(1, device.kind() == kernels::DeviceKind::cuda ? omp_get_max_threads() - 1 : omp_get_max_threads() / 2);
  const size_t dsize = dtype_size(param_dtype);
  grad_src_.push_back(ref.grad);
  grads_.emplace_back(std::max<size_t>(ref.numel, 1) * sizeof(float), MemCategory::grad, place);
  params_.emplace_back(std::max<size_t>(ref.numel, 1) * dsize, MemCategory::param, place);
  device.copy(params_.back().data(), place, ref.param, param_place, ref.numel * dsize);
  ref.grad = grads_.back().as<float>();
  ref.param = params_.back().data();
}

void DelayedUpdate::start(optim::ShardStepping& optimizer, float lr, float grad_scale, std::vector<Event> installs) {
  install_pending_ = true;
  worker_ = std::thread([this, &optimizer, lr, grad_scale, installs = std::move(installs)] {
    omp_set_num_threads(threads_);
    try {
      for (const Event& copy : installs) copy.wait();  // they still read what the step overwrites
      worker_began_ = std::chrono::steady_clock::now();
      // The norm is not needed (step_delayed measured it); waiting for it here keeps the worker's
      // time the update's on the device too (Note [Norms read once a step]).
      (void)optimizer.step(lr, grad_scale).value();
      worker_ended_ = std::chrono::steady_clock::now();
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void DelayedUpdate::join() {
  if (!worker_.joinable()) return;
  {
    // The part of the update the step did not hide; the update itself is the worker's work.
    ProfileScope profile(ProfileCategory::optimizer, /*waits_for_work=*/true);
    worker_.join();
  }
  Profiler::add_work(ProfileCategory::optimizer, worker_began_, worker_ended_);
  worker_began_ = worker_ended_ = {};  // a failed update adds nothing next time
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::vector<Event> StepScheduler::launch_installs() {
  std::vector<Event> copies;
  if (!delayed_) return copies;
  delayed_->join();
  if (!delayed_->take_pending()) return copies;
  for (int u = 0; u < num_units(); ++u)
    copies.push_back(params_.install(u, delayed_->fresh_params(static_cast<size_t>(u)),
                                     delayed_->fresh_place(static_cast<size_t>(u))));
  return copies;
}

void StepScheduler::install_delayed() {
  for (const Event& copy : launch_installs()) copy.wait();  // complete on return: any later work sees it
}

// Note [Installing the update behind the gradients' copy]: with the optimizer off the device
// (--offload-optimizer cpu or nvme), installing the finished update is a host-to-device copy per
// unit, and handing this step's gradients to the optimizer a device-to-host copy per unit: on a
// GPU the two directions have copy engines of their own. So the installs are launched first and
// waited for only where their data is used: the compute stream waits for them after the
// gradients' measurement is submitted (the next forward reads the parameters; a collective that
// gathers them starts after the compute work submitted before it), and the optimizer thread
// waits for them before it overwrites their source. Any other way out of the step (a skipped
// fp16 step, an error) waits for them on the host. The cpu backend copies at once; the simulated
// device defers each copy to the first wait for it and fills the destination with NaN meanwhile
// (Note [Deferred copies]), so a read or a write before a wait changes the bits the tests compare.
StepResult StepScheduler::step_delayed(float lr, float grad_clip, double loss_scale, bool skip_on_overflow) {
  std::vector<Event> installs = launch_installs();
  struct WaitOnExit {  // every way out but start() below (which hands them on) waits for the copies
    const std::vector<Event>& copies;
    ~WaitOnExit() {
      for (const Event& copy : copies) copy.wait();
    }
  } wait_on_exit{installs};
  // Copy this step's gradients to the optimizer (which may then run beside the next backward) and
  // measure them on the way; the model's gradient buffers are free for the next step after this.
  PendingSum local;
  for (size_t i = 0; i < optimizer_.num_shards(); ++i)  // as step() measures it (Note [Deterministic gradient norm])
    local += sum_squares_and_copy(device_, delayed_->reduced_grads(i), optimizer_.numel(i), delayed_->optimizer_grads(i));
  const double measured = local.value();  // once for every shard (Note [Norms read once a step])
  for (const Event& copy : installs) device_.wait(kernels::Stream::compute, copy);
  drop_gradients();  // consumed: the next micro-step starts a new sum
  StepResult result;
  result.norm = std::sqrt(global_norm_sq(measured)) / loss_scale;
  if (!std::isfinite(result.norm)) {
    ZERONE_CHECK(skip_on_overflow, "gradient norm is ", result.norm,
                 ": training diverged (try a lower --lr or --grad-clip)");
    result.overflow = true;  // skipped: nothing is started, the model keeps its parameters
    return result;
  }
  float clip = 1.0f;
  if (grad_clip > 0.0f && result.norm > grad_clip) clip = static_cast<float>(grad_clip / result.norm);
  const float scale = static_cast<float>(1.0 / (static_cast<double>(world_) * loss_scale)) * clip;
  delayed_->start(optimizer_, lr, scale, std::move(installs));  // leaves `installs` empty
  return result;
}

}  // namespace zerone::zero
