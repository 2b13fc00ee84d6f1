// FlatParam: one unit's parameters in one contiguous buffer (DESIGN §2).
//
// A unit (the token embedding, one transformer block, the final norm) is the granularity of ZeRO-3
// gathering and of gradient reduction. Its tensors are laid out back to back in declaration order
// and the total is padded to a multiple of `align_numel` (world_size * 64) so that rank r owns the
// equal shard [r*S, (r+1)*S). Padding elements are zero and never change.
//
// The FlatParam owns the parameter storage (compute dtype, category `param`) and the gradient
// storage (f32, category `grad`). Thread-safety: none; one owner.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/memory.h"

namespace zerone::nn {

struct TensorSpec {
  std::string name;            // e.g. "qkvw"
  std::vector<int64_t> shape;  // row-major
  bool weight_decay = false;   // AdamW decays matrices and embeddings, not biases or norms
  size_t offset = 0;           // in elements from the start of the flat buffer (set by FlatParam)
  size_t numel() const;
};

class FlatParam {
 public:
  FlatParam(std::string unit_name, std::vector<TensorSpec> tensors, DType dtype, size_t align_numel);

  const std::string& name() const { return name_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  DType dtype() const { return dtype_; }
  size_t numel() const { return numel_; }                // sum of the tensors, unpadded
  size_t padded_numel() const { return padded_numel_; }  // multiple of align_numel

  void* data() { return params_.data(); }
  const void* data() const { return params_.data(); }
  float* grad() { return grads_.as<float>(); }
  const float* grad() const { return grads_.as<float>(); }
  // Pointer to tensor i inside the parameter (compute dtype) and gradient (f32) buffers.
  void* param(size_t i) { return static_cast<char*>(data()) + tensors_[i].offset * dtype_size(dtype_); }
  const void* param(size_t i) const { return static_cast<const char*>(data()) + tensors_[i].offset * dtype_size(dtype_); }
  float* grad(size_t i) { return grad() + tensors_[i].offset; }

  void zero_grad();

 private:
  std::string name_;
  std::vector<TensorSpec> tensors_;
  DType dtype_;
  size_t numel_ = 0, padded_numel_ = 0;
  Buffer params_, grads_;
};

}  // namespace zerone::nn
