#include "zerone/zero/planner.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "zerone/core/error.h"
#include "zerone/core/memory.h"

namespace zerone::zero {

// Note [Auto sizes]: DeepSpeed's defaults (reduce_bucket_size 5e8, stage3_prefetch_bucket_size
// 5e7, sub_group_size 1e9 elements with 4 staging buffers) are sized for 8 GPUs of 80 GB; on a
// smaller machine they made offload cost more memory than no offload (a 350M model at stage 3
// refused under 2 GiB for 5e8-element buckets; Llama-3.2-1B's NVMe offload staging 16.8 GB). Its
// "auto" values scale the buckets to the model (hidden^2); zerone's do the same from the units:
//   reduce and prefetch buckets: the largest unit's padded elements P_1. The working-set bound
//     (Note [Working-set bound]) already holds max(B, P_1), so a smaller bucket saves nothing and
//     this one is the smallest that does; one unit per collective at least keeps calls few.
//   sub_group_size: an eighth of the rank's optimizer elements over the staging buffers, so the
//     host staging of NVMe offload is at most an eighth of the state it moves to disk; at least
//     1024 elements (one 4 KiB block of f32) and at most DeepSpeed's 1e9.
// None of these change results (the settings table marks them so; tests/zero/offload_invariance.sh).
size_t auto_bucket_numel(const std::vector<size_t>& unit_numels, int world) {
  size_t largest = 0;
  for (size_t n : unit_numels) largest = std::max(largest, padded_numel(n, world));
  return std::max<size_t>(largest, 1);
}

size_t auto_sub_group_numel(const std::vector<size_t>& unit_numels, int world, int stage, int buffer_count) {
  ZeroConfig c;
  c.stage = stage;
  size_t total = 0;
  for (size_t n : optimizer_shard_numels(unit_numels, world, 0, c)) total += n;
  const size_t share = total / (8 * static_cast<size_t>(std::max(buffer_count, 1)));
  return std::clamp<size_t>(share, 1024, 1'000'000'000);
}

PlaceNeed place_need(const StageEstimate& e, const MemoryBudget& b) {
  PlaceNeed n;
  const int64_t ranks = std::max(1, b.ranks_per_host);
  n.device = e.device();
  n.memory = (b.unified ? e.total() : e.host()) * ranks;
  n.nvme = e.nvme() * ranks;
  return n;
}

namespace {

struct PlaceFit {
  bool device = true, memory = true, nvme = true;
  bool all() const { return device && memory && nvme; }
};

PlaceFit place_fit(const PlaceNeed& n, const MemoryBudget& b) {
  PlaceFit f;
  f.device = b.device_bytes <= 0 || n.device <= b.device_bytes;
  f.memory = b.host_bytes <= 0 || n.memory <= b.host_bytes;
  f.nvme = n.nvme == 0 || b.nvme_bytes < 0 || n.nvme <= b.nvme_bytes;
  return f;
}

std::string gib(int64_t bytes) { return human_bytes(static_cast<double>(bytes)); }

}  // namespace

std::vector<std::string> overflows(const PlaceNeed& n, const MemoryBudget& b) {
  std::vector<std::string> out;
  const PlaceFit f = place_fit(n, b);
  const std::string per_host = b.ranks_per_host > 1 ? str_cat(" (", b.ranks_per_host, " ranks on the host)") : "";
  if (!f.device) out.push_back(str_cat("device ", gib(n.device), " per rank over ", gib(b.device_bytes)));
  if (!f.memory)
    out.push_back(str_cat(b.unified ? "memory (device + host) " : "host memory ", gib(n.memory), per_host, " over ",
                          gib(b.host_bytes)));
  if (!f.nvme) out.push_back(str_cat("NVMe ", gib(n.nvme), per_host, " over ", gib(b.nvme_bytes), " free"));
  return out;
}

std::string family_label(const PlanChoice& c) {
  std::string s = str_cat("stage ", c.zero.stage);
  if (c.zero.offload_optimizer != OffloadDevice::none) {
    s += str_cat(", optimizer ", offload_device_name(c.zero.offload_optimizer));
    if (c.zero.offload_optimizer_ratio < 1.0) s += str_cat(" (ratio ", c.zero.offload_optimizer_ratio, ")");
    if (c.zero.offload_optimizer == OffloadDevice::nvme && c.zero.offload_optimizer_nvme_ratio < 1.0)
      s += str_cat(" (", c.zero.offload_optimizer_nvme_ratio, " swapped, the rest in host memory)");
  }
  if (c.zero.offload_param != OffloadDevice::none) s += str_cat(", param ", offload_device_name(c.zero.offload_param));
  if (c.cpu_checkpointing) s += ", CPU checkpointing";
  else if (c.activation_checkpointing) s += ", checkpointing";
  return s;
}

Plan make_plan(const PlanRequest& r) {
  ZERONE_CHECK(r.model != nullptr, "make_plan needs a model");
  ZERONE_CHECK(r.world >= 1, "--world ", r.world, " must be at least 1");
  ZERONE_CHECK(r.micro_batch >= 1 && r.grad_accum >= 1, "--micro-batch and --grad-accum must be at least 1");
  nn::Model& model = *r.model;
  const bool was_ckpt = model.activation_checkpointing(), was_cpu = model.cpu_checkpointing();
  auto restore = [&] {
    model.set_activation_checkpointing(was_ckpt);
    if (was_cpu || model.cpu_checkpointing()) model.set_cpu_checkpointing(was_cpu);
  };
  const std::vector<size_t> numels = model.unit_numels();
  const int K = optim::optimizer_state_tensors(r.optimizer);
  const bool nvme_ok = r.budget.nvme_bytes >= 0;

  // Candidate values of each knob, in a fixed order.
  std::vector<int> stages;
  for (int s = 0; s <= 3; ++s)
    if (!r.stage || *r.stage == s) stages.push_back(s);
  auto devices = [&](std::optional<OffloadDevice> fixed) {
    std::vector<OffloadDevice> d;
    for (OffloadDevice o : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      if (fixed ? *fixed == o : (o != OffloadDevice::nvme || nvme_ok)) d.push_back(o);
    return d;
  };
  std::vector<std::pair<bool, bool>> checkpointing;  // (activation, cpu)
  for (bool a : {false, true})
    for (bool c : {false, true}) {
      if (c && !a) continue;
      if (r.activation_checkpointing && *r.activation_checkpointing != a) continue;
      if (r.cpu_checkpointing && *r.cpu_checkpointing != c) continue;
      checkpointing.emplace_back(a, c);
    }
  std::vector<std::pair<int, int>> batches;  // (micro_batch, grad_accum)
  if (r.micro_batch_free) {
    const int per_rank = r.micro_batch * r.grad_accum;
    for (int m = per_rank; m >= 1; --m)
      if (per_rank % m == 0) batches.emplace_back(m, per_rank / m);
  } else {
    batches.emplace_back(r.micro_batch, r.grad_accum);
  }
  const size_t auto_bucket = auto_bucket_numel(numels, r.world);
  auto sizes = [&](std::optional<size_t> fixed, std::vector<size_t> options) {
    if (fixed) return std::vector<size_t>{*fixed};
    std::sort(options.begin(), options.end());
    options.erase(std::unique(options.begin(), options.end()), options.end());
    return options;
  };
  const std::vector<size_t> reduce_buckets =
      sizes(r.reduce_bucket_numel, {auto_bucket, std::max(auto_bucket, size_t{50'000'000}),
                                    std::max(auto_bucket, size_t{200'000'000}), std::max(auto_bucket, size_t{500'000'000})});
  const std::vector<size_t> prefetches = sizes(r.prefetch_numel, {0, auto_bucket, std::max(auto_bucket, size_t{50'000'000})});

  Plan plan;
  std::vector<PlanCandidate> fitting;
  std::map<std::tuple<int, int, int, bool, bool>, size_t> family_index;  // -> its slot in family_best
  std::vector<PlanCandidate> family_best;
  auto better = [](const PlanCandidate& a, const PlanCandidate& b) {  // a strictly better than b
    if (a.fits() != b.fits()) return a.fits();
    if (a.fits()) {
      if (a.cost.total_s != b.cost.total_s) return a.cost.total_s < b.cost.total_s;
      return a.need.memory < b.need.memory;
    }
    return a.need.memory + a.need.device < b.need.memory + b.need.device;
  };
  auto consider = [&](PlanCandidate cand) {
    ++plan.candidates;
    const PlaceFit f = place_fit(cand.need, r.budget);
    if (f.memory && f.nvme && (!plan.min_device_bytes || cand.need.device < *plan.min_device_bytes))
      plan.min_device_bytes = cand.need.device;
    if (f.device && f.nvme && (!plan.min_memory_bytes || cand.need.memory < *plan.min_memory_bytes))
      plan.min_memory_bytes = cand.need.memory;
    if (f.device && f.memory && (!plan.min_nvme_bytes || cand.need.nvme < *plan.min_nvme_bytes))
      plan.min_nvme_bytes = cand.need.nvme;
    if (!plan.smallest || std::make_pair(cand.need.memory, cand.need.device) <
                              std::make_pair(plan.smallest->need.memory, plan.smallest->need.device))
      plan.smallest = cand;
    if (cand.fits()) ++plan.fitting;
    const auto key = std::make_tuple(cand.choice.zero.stage, static_cast<int>(cand.choice.zero.offload_optimizer),
                                     static_cast<int>(cand.choice.zero.offload_param), cand.choice.activation_checkpointing,
                                     cand.choice.cpu_checkpointing);
    auto it = family_index.find(key);
    if (it == family_index.end()) {
      family_index.emplace(key, family_best.size());
      family_best.push_back(std::move(cand));
    } else if (better(cand, family_best[it->second])) {
      family_best[it->second] = std::move(cand);
    }
  };

  try {
    for (auto [ckpt, cpu_ckpt] : checkpointing) {
      try {
        model.set_activation_checkpointing(ckpt);
        model.set_cpu_checkpointing(cpu_ckpt);
      } catch (const Error&) {
        continue;  // a model without blocks (the image classifiers) has no checkpointing
      }
      for (auto [mb, accum] : batches) {
        // The traffic: the activation table without checkpointing (CPU checkpointing has no
        // effect without it, Note [CPU checkpointing]).
        model.set_activation_checkpointing(false);
        StepWorkload work;
        work.activation_bytes = static_cast<int64_t>(model.activation_bytes(mb, r.seq));
        model.set_activation_checkpointing(ckpt);
        work.host_activation_bytes = static_cast<int64_t>(model.host_activation_bytes(mb, r.seq));
        work.unit_numels = numels;
        work.flops_per_token = r.flops_per_token > 0 ? r.flops_per_token : 6.0 * static_cast<double>(model.num_parameters());
        work.micro_batch = mb;
        work.seq = r.seq;
        work.grad_accum = accum;
        work.world = r.world;
        work.ranks_per_host = r.budget.ranks_per_host;
        work.dtype = r.dtype;
        work.optim_tensors = K;
        work.activation_checkpointing = ckpt;
        work.cpu_checkpointing = cpu_ckpt;
        for (int stage : stages) {
          const std::vector<OffloadDevice> opts = stage >= 1 ? devices(r.offload_optimizer) : std::vector<OffloadDevice>{};
          const std::vector<OffloadDevice> params = stage == 3 ? devices(r.offload_param) : std::vector<OffloadDevice>{};
          if (stage == 0 && r.offload_optimizer && *r.offload_optimizer != OffloadDevice::none) continue;
          if (stage != 3 && r.offload_param && *r.offload_param != OffloadDevice::none) continue;
          for (OffloadDevice opt : opts.empty() ? std::vector<OffloadDevice>{OffloadDevice::none} : opts) {
            // A given NVMe ratio below 1 splits NVMe offload: only that (train refuses it elsewhere).
            if (r.offload_optimizer_nvme_ratio && *r.offload_optimizer_nvme_ratio < 1.0 && opt != OffloadDevice::nvme) continue;
            std::vector<double> ratios = {1.0};
            if (opt != OffloadDevice::none) ratios = {1.0, 0.75, 0.5, 0.25};
            if (r.offload_optimizer_ratio) ratios = {*r.offload_optimizer_ratio};
            for (OffloadDevice par : params.empty() ? std::vector<OffloadDevice>{OffloadDevice::none} : params) {
              for (double ratio : ratios) {
                if (opt == OffloadDevice::none && ratio < 1.0) continue;
                // Knobs that matter only for some settings take one value elsewhere.
                // Stages 0-1 hold no gradient working set: the bucket only sets the calls, the
                // run's own (or auto) value stays.
                const std::vector<size_t> rb = stage >= 2 ? reduce_buckets : std::vector<size_t>{r.base.reduce_bucket_numel};
                const std::vector<size_t> pf = stage == 3 ? prefetches : std::vector<size_t>{prefetches.back()};
                std::vector<std::pair<size_t, int>> swaps = {{r.base.sub_group_numel, r.base.offload_buffer_count}};
                if (opt == OffloadDevice::nvme) {
                  swaps.clear();
                  const std::vector<int> buffers = r.buffer_count ? std::vector<int>{*r.buffer_count} : std::vector<int>{2, 4};
                  for (int bc : buffers) {
                    const std::vector<size_t> groups = sizes(
                        r.sub_group_numel, {auto_sub_group_numel(numels, r.world, stage, bc), 10'000'000, 100'000'000, 1'000'000'000});
                    for (size_t g : groups) swaps.emplace_back(g, bc);
                  }
                }
                // Note [Optimizer state on NVMe and in host memory]: the swapped share, with NVMe
                // (not also under a partial offload: one split at a time is enough to fit).
                std::vector<double> nvme_ratios = {1.0};
                if (opt == OffloadDevice::nvme && ratio == 1.0) nvme_ratios = {1.0, 0.75, 0.5, 0.25};
                if (opt == OffloadDevice::nvme && r.offload_optimizer_nvme_ratio) nvme_ratios = {*r.offload_optimizer_nvme_ratio};
                for (double nvme_ratio : nvme_ratios) {
                  for (size_t bucket : rb)
                    for (size_t prefetch : pf)
                      for (auto [group, bc] : swaps) {
                        PlanCandidate cand;
                        PlanChoice& ch = cand.choice;
                        ch.zero = r.base;
                        ch.zero.stage = stage;
                        ch.zero.offload_optimizer = opt;
                        ch.zero.offload_param = par;
                        ch.zero.offload_optimizer_ratio = ratio;
                        ch.zero.offload_optimizer_nvme_ratio = nvme_ratio;
                        ch.zero.reduce_bucket_numel = bucket;
                        ch.zero.prefetch_numel = prefetch;
                        ch.zero.sub_group_numel = group;
                        ch.zero.offload_buffer_count = bc;
                        ch.zero.transient_gradients = r.base.transient_gradients && accum == 1;  // Note [Transient gradients]
                        ch.activation_checkpointing = ckpt;
                        ch.cpu_checkpointing = cpu_ckpt;
                        ch.micro_batch = mb;
                        ch.grad_accum = accum;
                        // Note [Gradient sums on the device]: where the run leaves it open and a
                        // separate device adds micro-steps, both places.
                        const bool sums_open =
                            !r.grad_sums_on_device && accum > 1 && !r.budget.unified && gradient_sums_placeable(ch.zero);
                        for (bool on_device : sums_open ? std::vector<bool>{true, false}
                                                        : std::vector<bool>{r.grad_sums_on_device.value_or(false)}) {
                          PlanCandidate c = cand;
                          c.choice.zero.grad_sums_on_device = on_device;
                          c.estimate = estimate(model, r.world, r.dtype, mb, r.seq, c.choice.zero, r.optimizer, stage, r.collectives)[0];
                          c.need = place_need(c.estimate, r.budget);
                          c.overflow = overflows(c.need, r.budget);
                          c.cost = step_cost(work, c.choice.zero, c.estimate, r.speed);
                          consider(std::move(c));
                        }
                      }
                }
              }
            }
          }
        }
      }
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();

  // The best of each family, best first (stable: ties keep the search order).
  std::vector<size_t> order(family_best.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return better(family_best[a], family_best[b]); });
  if (!order.empty() && family_best[order[0]].fits()) plan.best = family_best[order[0]];
  for (size_t i = plan.best ? 1 : 0; i < order.size(); ++i) {
    const PlanCandidate& c = family_best[order[i]];
    RunnerUp ru{c, ""};
    if (!c.fits()) {
      for (const std::string& o : c.overflow) ru.why += str_cat(ru.why.empty() ? "does not fit: " : "; ", o);
    } else {
      const StepCost& a = c.cost;
      const StepCost& b = plan.best->cost;
      std::pair<double, const char*> deltas[] = {{a.compute_s - b.compute_s, "compute"},
                                                 {a.memory_s - b.memory_s, "memory traffic"},
                                                 {a.optimizer_s - b.optimizer_s, "optimizer step"},
                                                 {a.nvme_s - b.nvme_s, "NVMe I/O"},
                                                 {a.comm_s - b.comm_s, "communication"},
                                                 {a.transfer_s - b.transfer_s, "host-device copies"}};
      auto worst = *std::max_element(std::begin(deltas), std::end(deltas));
      const double pct = b.total_s > 0 ? 100.0 * (a.total_s / b.total_s - 1.0) : 0.0;
      const bool more = c.need.memory + c.need.device > plan.best->need.memory + plan.best->need.device;
      ru.why = pct < 0.05 ? (more ? "as fast, needs more memory" : "as fast and as small: the earlier in the search order was kept")
                          : str_cat("slower by ", static_cast<int>(pct + 0.5), "%: ", worst.second, " +",
                                    static_cast<int>(worst.first * 1000.0 + 0.5), " ms/step");
    }
    plan.runners_up.push_back(std::move(ru));
  }
  return plan;
}

}  // namespace zerone::zero
