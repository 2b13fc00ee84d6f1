#include <algorithm>

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

void Model::write_params_from_host(int u, const std::function<void()>& write) {
  FlatParam& unit = units()[u];
  if (backend_.host_addressable()) {
    if (!unit.has_params()) unit.allocate_params();
    write();
    return;
  }
  Buffer on_device = unit.has_params() ? unit.take_params() : Buffer();
  // Pageable (Note [Host state in pageable memory]): the copy below waits anyway, and pinning a
  // large unit (a Llama-2-7B layer's 404 MB) and freeing it again costs more than the copy.
  unit.set_params(Buffer(unit.param_bytes(), MemCategory::param, MemPlace::host, 64, default_arena()));
  write();
  if (on_device.empty()) on_device = Buffer(unit.param_bytes(), MemCategory::param, MemPlace::device);
  Buffer on_host = unit.take_params();
  backend_.copy_to_device(on_device.data(), on_host.data(), on_host.bytes());
  unit.set_params(std::move(on_device));
}

std::vector<float> Model::logits_to_host(size_t first_row, size_t rows) const {
  const DType dtype = logits_dtype();
  const size_t stride = static_cast<size_t>(logits_stride()), numel = rows * stride;
  std::vector<uint8_t> stored(numel * dtype_size(dtype));
  backend().copy_to_host(stored.data(), static_cast<const uint8_t*>(logits()) + first_row * stride * dtype_size(dtype),
                         stored.size());
  std::vector<float> wide(numel);
  convert_to_f32(stored.data(), dtype, wide.data(), numel);
  return wide;
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
      backend_.fill_zero(unit.grad(t), unit.tensors()[t].numel() * sizeof(float));
  backend_.fill_zero(unit.grad() + unit.numel(), (unit.padded_numel() - unit.numel()) * sizeof(float));
  unit.mark_grads_written();
  return false;
}

void Model::set_cpu_checkpointing(bool on) {
  ZERONE_CHECK(!on, "activation_checkpointing.cpu_checkpointing applies to the transformer models; ", spec(),
               " has no blocks whose inputs are saved");
}

void UnitModel::save_block_output(Buffer& outputs, Buffer& saved, int l, int L, size_t BTC) const {
  if (!saved_inputs_on_host() || l == L - 1) return;
  backend_.copy_to_host(saved.as<float>() + static_cast<size_t>(l) * BTC, block_output(outputs, l, BTC),
                        BTC * sizeof(float));
}

void UnitModel::restore_block_input(Buffer& outputs, const Buffer& saved, int l, size_t BTC) const {
  if (!saved_inputs_on_host() || l == 0) return;
  backend_.copy_to_device(block_output(outputs, l - 1, BTC), saved.as<float>() + static_cast<size_t>(l - 1) * BTC,
                          BTC * sizeof(float));
}

std::unique_ptr<Model> make_model(const std::string& spec, DType compute_dtype, size_t align_numel, bool allocate) {
  if (is_sequential_spec(spec))
    return std::make_unique<Sequential>(parse_sequential_spec(spec), compute_dtype, align_numel, allocate);
  if (is_llama_spec(spec)) return std::make_unique<Llama>(parse_llama_spec(spec), compute_dtype, align_numel, allocate);
  return std::make_unique<GPT2>(parse_model_spec(spec), compute_dtype, align_numel, allocate);
}

}  // namespace zerone::nn
