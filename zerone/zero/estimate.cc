#include "zerone/zero/estimate.h"

#include "zerone/core/error.h"

namespace zerone::zero {

std::vector<StageEstimate> estimate(const nn::Model& model, int world, DType dtype, int micro_batch, int seq,
                                    const ZeroConfig& base, const optim::OptimizerOptions& optimizer,
                                    std::optional<int> only_stage, CollectiveRoute route) {
  ZERONE_CHECK(world >= 1 && world <= 1'000'000, "--world ", world, " is out of range: expected 1..1000000");
  ZERONE_CHECK(micro_batch >= 1, "--micro-batch ", micro_batch, " must be at least 1");
  ZERONE_CHECK(seq >= 1 && seq <= model.max_seq_len(), "--seq ", seq, " is outside 1..", model.max_seq_len(),
               " (the model's context length)");
  ZERONE_CHECK(!only_stage || (*only_stage >= 0 && *only_stage <= 3), "--zero-stage ", only_stage.value_or(0),
               " is out of range: expected 0..3");
  std::vector<size_t> numels = model.unit_numels();
  // Note [Backend scratch]: the model's operations, then the engine's deterministic sums over a
  // unit's gradient or an update's slice of it, bounded by the unit padded for `world` (no shard
  // is larger) and its tensors' weight-decay runs (an update's ranges).
  kernels::ScratchCount scratch = model.scratch_count(micro_batch, seq);
  for (size_t u = 0; u < numels.size(); ++u)
    scratch.sums(padded_numel(numels[u], world), model.units()[u].tensors().size() + 1);
  std::vector<StageEstimate> out;
  for (int stage = 0; stage <= 3; ++stage) {
    if (only_stage && stage != *only_stage) continue;
    ZeroConfig config = base;
    config.stage = stage;
    // A stage that cannot offload (stage 0 keeps no optimizer shard; only stage 3 shards
    // parameters) is shown as it would run: without that offload.
    if (stage == 0) config.offload_optimizer = OffloadDevice::none;
    if (stage != 3) config.offload_param = OffloadDevice::none;
    StageEstimate e;
    e.stage = stage;
    e.model_state = model_state_bytes(numels, world, 0, dtype, config, optim::optimizer_state_tensors(optimizer));
    e.working_set = working_set_bytes(numels, world, dtype, config);
    e.host_activations = static_cast<int64_t>(model.host_activation_bytes(micro_batch, seq));
    e.activations = static_cast<int64_t>(model.activation_bytes(micro_batch, seq)) - e.host_activations;
    e.staged_collectives = staged_collective_bytes(numels, world, dtype, config, route);
    e.backend_scratch = scratch.bytes();
    out.push_back(e);
  }
  return out;
}

PlacedBytes placed_bytes(const StageEstimate& e) {
  PlacedBytes all = e.model_state.placed;
  all.at(MemPlace::device, MemCategory::activation) += e.activations;
  all.at(MemPlace::host, MemCategory::activation) += e.host_activations;
  all.at(MemPlace::device, MemCategory::param) += e.working_set.param;
  all.at(MemPlace::device, MemCategory::grad) += e.working_set.grad;
  all.at(MemPlace::device, MemCategory::comm) += e.working_set.comm;
  all.at(MemPlace::host, MemCategory::comm) += e.working_set.host;
  all.at(MemPlace::host, MemCategory::scratch) += e.working_set.host_scratch;
  all.at(MemPlace::host, MemCategory::comm) += e.staged_collectives;
  all.at(MemPlace::device, MemCategory::scratch) += e.backend_scratch;
  return all;
}

std::string describe_places(const StageEstimate& e) {
  const PlacedBytes all = placed_bytes(e);
  std::string out;
  for (size_t p = 0; p < MemoryLedger::kPlaces; ++p)
    for (size_t c = 0; c < MemoryLedger::kCategories; ++c) {
      auto place = static_cast<MemPlace>(p);
      auto cat = static_cast<MemCategory>(c);
      if (int64_t b = all.get(place, cat); b != 0)
        out += str_cat(out.empty() ? "" : ", ", mem_place_name(place), " ", mem_category_name(cat), " ", b);
    }
  return out;
}

}  // namespace zerone::zero
