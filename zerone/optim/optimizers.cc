#include "zerone/optim/optimizers.h"

namespace zerone::optim {

std::string optimizer_name(const OptimizerOptions& options) {
  return std::holds_alternative<SGDOptions>(options) ? "sgd" : "adamw";
}

int optimizer_state_tensors(const OptimizerOptions& options) {
  if (const auto* sgd = std::get_if<SGDOptions>(&options)) return sgd->momentum != 0.0f ? 1 : 0;
  return 2;
}

std::unique_ptr<Optimizer> make_optimizer(std::vector<ShardRef> shards, DType param_dtype,
                                          const OptimizerOptions& options, MemPlace state_place) {
  if (const auto* sgd = std::get_if<SGDOptions>(&options))
    return std::make_unique<SGD>(std::move(shards), param_dtype, *sgd, state_place);
  return std::make_unique<AdamW>(std::move(shards), param_dtype, std::get<AdamWOptions>(options), state_place);
}

}  // namespace zerone::optim
