#include "zerone/train/save_weights.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "zerone/core/error.h"
#include "zerone/core/memory.h"
#include "zerone/io/llmc_checkpoint.h"
#include "zerone/nn/gpt2.h"

namespace zerone::train {

SavedWeights save_weights(const std::string& path, bool hf, const io::HfSaveExtras& extras, nn::Model& model,
                          zero::ZeroEngine& engine, bool lead) {
  SavedWeights saved;
  for (const nn::FlatParam& unit : model.units()) saved.model_param_bytes += static_cast<int64_t>(unit.param_bytes());
  const MemoryLedger& ledger = MemoryLedger::global();
  auto measure = [&] {
    const int64_t held = ledger.current(MemPlace::device, MemCategory::param) + ledger.current(MemPlace::host, MemCategory::param);
    saved.peak_param_bytes = std::max(saved.peak_param_bytes, held);
  };
  // The units are held strictly in order on every rank, also where a writer skips one, so that
  // the ranks' gathers pair up (Note [Streaming save]).
  std::optional<zero::ZeroEngine::HeldUnit> held;
  int next = 0;
  auto hold_through = [&](int last) {
    for (; next <= last; ++next) {
      held.reset();
      held.emplace(engine, next);
      measure();
    }
  };
  if (lead) {
    const io::UnitLoader load = [&](int u) {
      ZERONE_ASSERT(u >= next - 1, "save: unit ", u, " requested after unit ", next - 1);
      hold_through(u);
    };
    const DType dtype = model.compute_dtype();
    if (hf) io::save_hf_checkpoint(path, model, load, extras);
    else io::save_llmc_checkpoint(path, dynamic_cast<const nn::GPT2&>(model), dtype == DType::f16 ? DType::f32 : dtype, load);
  }
  hold_through(model.num_units() - 1);
  held.reset();
  return saved;
}

}  // namespace zerone::train
