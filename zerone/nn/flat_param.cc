#include "zerone/nn/flat_param.h"

#include <cstring>

#include "zerone/core/error.h"

namespace zerone::nn {

size_t TensorSpec::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

FlatParam::FlatParam(std::string unit_name, std::vector<TensorSpec> tensors, DType dtype, size_t align_numel,
                     bool allocate)
    : name_(std::move(unit_name)), tensors_(std::move(tensors)), dtype_(dtype) {
  ZERONE_ASSERT(align_numel > 0);
  for (TensorSpec& t : tensors_) {
    t.offset = numel_;
    numel_ += t.numel();
  }
  padded_numel_ = (numel_ + align_numel - 1) / align_numel * align_numel;
  if (allocate) {
    allocate_params();
    allocate_grads();
  }
}

void FlatParam::allocate_params() {
  if (params_.empty()) params_ = Buffer(param_bytes(), MemCategory::param);
}

void FlatParam::allocate_grads() {
  if (grads_.empty()) grads_ = Buffer(grad_bytes(), MemCategory::grad);
}

void FlatParam::set_params(Buffer params) {
  ZERONE_ASSERT(params_.empty() && params.bytes() == param_bytes(), "unit ", name_, ": parameter buffer of ",
                params.bytes(), " bytes, expected ", param_bytes());
  params_ = std::move(params);
}

void FlatParam::set_grads(Buffer grads, bool fresh) {
  ZERONE_ASSERT(grads_.empty() && grads.bytes() == grad_bytes(), "unit ", name_, ": gradient buffer of ",
                grads.bytes(), " bytes, expected ", grad_bytes());
  grads_ = std::move(grads);
  grads_fresh_ = fresh;
}

void FlatParam::zero_grad() {
  grads_fresh_ = false;
  if (!grads_.empty()) grads_.zero();
}

}  // namespace zerone::nn
