// FlatParam: one unit's parameters in one contiguous buffer (DESIGN §2).
//
// A unit (the token embedding, one transformer block, the final norm) is the granularity of ZeRO-3
// gathering and of gradient reduction. Its tensors are laid out back to back in declaration order
// and the total is padded to a multiple of `align_numel` (world_size * 64) so that rank r owns the
// equal shard [r*S, (r+1)*S). Padding elements are zero and never change.
//
// The FlatParam owns the full parameter storage (compute dtype, category `param`) and the full
// gradient storage (f32, category `grad`) while they are allocated. At world size 1 and ZeRO stages
// 0-1 both live for the whole run; the ZeRO engine releases the full gradients between uses at
// stage 2 and the full parameters too at stage 3 (it keeps the rank's shard elsewhere).
// Thread-safety: none; one owner.
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
  // Lays out the tensors and, when `allocate`, the full parameter and gradient buffers (zeroed).
  FlatParam(std::string unit_name, std::vector<TensorSpec> tensors, DType dtype, size_t align_numel,
            bool allocate = true);

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

  // Storage control for the ZeRO engine. allocate_* gives zeroed buffers; release_* frees them
  // (param()/grad() must not be used until allocated again).
  bool has_params() const { return !params_.empty(); }
  bool has_grads() const { return !grads_.empty(); }
  void allocate_params();
  void release_params() { params_.reset(); }
  void allocate_grads();
  void release_grads() { grads_.reset(); grads_fresh_ = false; }
  // The same with storage the caller provides and takes back (the engine's working-set pool,
  // Note [Working-set pool]): set_* adopts a buffer of exactly param_bytes() / grad_bytes()
  // (contents as given); take_* hands the storage out and leaves the unit without it.
  void set_params(Buffer params);
  Buffer take_params() { return std::move(params_); }
  // Note [Fresh gradients]: a gradient buffer set with `fresh` holds garbage; the model's next
  // backward overwrites the gradients its GEMMs produce and zeroes the rest (and the padding)
  // before accumulating, then calls mark_grads_written(). Saves zeroing the whole buffer first.
  void set_grads(Buffer grads, bool fresh = false);
  Buffer take_grads() {
    grads_fresh_ = false;
    return std::move(grads_);
  }
  bool grads_fresh() const { return grads_fresh_; }
  void mark_grads_written() { grads_fresh_ = false; }
  // The gradients were consumed (an optimizer step): the next backward overwrites them.
  void mark_grads_fresh() { grads_fresh_ = has_grads(); }
  size_t param_bytes() const { return padded_numel_ * dtype_size(dtype_); }
  size_t grad_bytes() const { return padded_numel_ * sizeof(float); }

 private:
  std::string name_;
  std::vector<TensorSpec> tensors_;
  DType dtype_;
  size_t numel_ = 0, padded_numel_ = 0;
  Buffer params_, grads_;
  bool grads_fresh_ = false;
};

}  // namespace zerone::nn
