#include "zerone/core/error.h"
#include "zerone/nn/gpt2.h"
#include "zerone/nn/llama.h"
#include "zerone/nn/model.h"

namespace zerone::nn {

std::vector<size_t> Model::unit_numels() const {
  std::vector<size_t> out;
  for (const FlatParam& unit : units()) out.push_back(unit.numel());
  return out;
}

std::unique_ptr<Model> make_model(const std::string& spec, DType compute_dtype, size_t align_numel, bool allocate) {
  if (is_llama_spec(spec)) return std::make_unique<Llama>(parse_llama_spec(spec), compute_dtype, align_numel, allocate);
  return std::make_unique<GPT2>(parse_model_spec(spec), compute_dtype, align_numel, allocate);
}

}  // namespace zerone::nn
