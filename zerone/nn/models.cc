#include <algorithm>
#include <cstring>

#include "zerone/core/error.h"
#include "zerone/nn/gpt2.h"
#include "zerone/nn/llama.h"
#include "zerone/nn/model.h"
#include "zerone/nn/sequential.h"

namespace zerone::nn {

std::vector<size_t> Model::unit_numels() const {
  std::vector<size_t> out;
  for (const FlatParam& unit : units()) out.push_back(unit.numel());
  return out;
}

float Model::forward(const Batch& batch) {
  ZERONE_ASSERT(input_kind() == InputKind::tokens && batch.tokens != nullptr, "model ", spec(),
                " was handed a batch without tokens");
  return forward(batch.tokens, batch.targets, batch.size, batch.seq);
}

bool UnitModel::accumulate_grads(int u, std::initializer_list<int> overwritten) {
  FlatParam& unit = units_[u];
  if (!unit.grads_fresh()) return true;
  for (size_t t = 0; t < unit.tensors().size(); ++t)
    if (std::find(overwritten.begin(), overwritten.end(), static_cast<int>(t)) == overwritten.end())
      std::memset(unit.grad(t), 0, unit.tensors()[t].numel() * sizeof(float));
  std::memset(unit.grad() + unit.numel(), 0, (unit.padded_numel() - unit.numel()) * sizeof(float));
  unit.mark_grads_written();
  return false;
}

std::unique_ptr<Model> make_model(const std::string& spec, DType compute_dtype, size_t align_numel, bool allocate) {
  if (is_sequential_spec(spec))
    return std::make_unique<Sequential>(parse_sequential_spec(spec), compute_dtype, align_numel, allocate);
  if (is_llama_spec(spec)) return std::make_unique<Llama>(parse_llama_spec(spec), compute_dtype, align_numel, allocate);
  return std::make_unique<GPT2>(parse_model_spec(spec), compute_dtype, align_numel, allocate);
}

}  // namespace zerone::nn
