#include "zerone/optim/sgd.h"

#include <omp.h>

#include <algorithm>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"

namespace zerone::optim {
namespace {

// Runs of elements with one weight decay. Note [SGD arithmetic]: the operations and their
// order are torch.optim.SGD's (single-tensor path), each rounded to f32: d = g*scale; d = d + wd*p;
// b = b*momentum + (1-dampening)*d; d = d + momentum*b (nesterov) or d = b; p = p - lr*d. The
// compiler must not fuse them (this file is built with -ffp-contract=off), so every placement and
// world size computes the same bits, and PyTorch's within its own rounding.
template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst>
double update_loop(const float* grad, float* master, float* momentum, size_t n, const SGDOptions& o, float wd, float lr,
                   float grad_scale) {
  double sumsq = 0.0;
  const float keep = 1.0f - o.dampening, mu = o.momentum;
#pragma omp parallel for simd reduction(+ : sumsq) schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    sumsq += static_cast<double>(g) * g;
    float d = g * grad_scale;
    if constexpr (kDecay) d = d + wd * master[i];
    if constexpr (kMomentum) {
      const float b = kFirst ? d : momentum[i] * mu + keep * d;
      momentum[i] = b;
      d = kNesterov ? d + mu * b : b;
    }
    master[i] = master[i] - lr * d;
  }
  return sumsq;
}

double update_run(const float* grad, float* master, float* momentum, void* param_out, DType param_dtype, size_t n,
                  const SGDOptions& o, float wd, float lr, float grad_scale, bool first) {
  // One loop per combination, so that none of them branches per element and all vectorize.
  using Loop = double (*)(const float*, float*, float*, size_t, const SGDOptions&, float, float, float);
  static constexpr Loop loops[16] = {
      update_loop<false, false, false, false>, update_loop<false, false, false, true>,
      update_loop<false, false, true, false>,  update_loop<false, false, true, true>,
      update_loop<false, true, false, false>,  update_loop<false, true, false, true>,
      update_loop<false, true, true, false>,   update_loop<false, true, true, true>,
      update_loop<true, false, false, false>,  update_loop<true, false, false, true>,
      update_loop<true, false, true, false>,   update_loop<true, false, true, true>,
      update_loop<true, true, false, false>,   update_loop<true, true, false, true>,
      update_loop<true, true, true, false>,    update_loop<true, true, true, true>};
  const bool with_momentum = momentum != nullptr;
  const int which = (wd != 0.0f ? 8 : 0) | (with_momentum ? 4 : 0) | (with_momentum && o.nesterov ? 2 : 0) | (first ? 1 : 0);
  const double sumsq = loops[which](grad, master, momentum, n, o, wd, lr, grad_scale);
  if (param_out) convert_from_f32(master, param_out, param_dtype, n);
  return sumsq;
}

}  // namespace

SGD::SGD(std::vector<ShardRef> shards, DType param_dtype, const SGDOptions& options, MemPlace state_place)
    : shards_(std::move(shards)), param_dtype_(param_dtype), options_(options) {
  ZERONE_CHECK(options.momentum >= 0.0f && options.dampening >= 0.0f && options.weight_decay >= 0.0f,
               "SGD: momentum ", options.momentum, ", dampening ", options.dampening, " and weight decay ",
               options.weight_decay, " must not be negative");
  ZERONE_CHECK(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
               "SGD: Nesterov momentum needs a momentum above 0 and dampening 0 (momentum ", options.momentum,
               ", dampening ", options.dampening, ")");
  state_.resize(shards_.size());
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardRef& s = shards_[i];
    State& st = state_[i];
    if (options_.momentum != 0.0f) st.momentum = Buffer(s.numel * sizeof(float), MemCategory::optim, state_place);
    if (param_dtype_ != DType::f32) {
      st.master = Buffer(s.numel * sizeof(float), MemCategory::master, state_place);
      convert_to_f32(s.param, param_dtype_, st.master.as<float>(), s.numel);
    }
    for (auto [b, e] : s.decay_ranges) ZERONE_ASSERT(b <= e && e <= s.numel, "bad decay range");
  }
}

float* SGD::master(size_t i) {
  return param_dtype_ == DType::f32 ? static_cast<float*>(shards_[i].param) : state_[i].master.as<float>();
}

double SGD::update_slice(const ShardRef& s, DType param_dtype, const SGDOptions& options, float lr, float grad_scale,
                         bool first, size_t begin, size_t end, float* master, float* momentum) {
  ZERONE_ASSERT(begin <= end && end <= s.numel);
  void* param_out = param_dtype == DType::f32 ? nullptr : s.param;
  double sumsq = 0.0;
  for_each_decay_run(s, begin, end, options.weight_decay, [&](size_t b, size_t e, float wd) {
    void* p = param_out ? static_cast<char*>(param_out) + b * dtype_size(param_dtype) : nullptr;
    sumsq += update_run(s.grad + b, master + (b - begin), momentum ? momentum + (b - begin) : nullptr, p, param_dtype,
                        e - b, options, wd, lr, grad_scale, first);
  });
  return sumsq;
}

void SGD::begin_step(float lr, float grad_scale) {
  first_ = step_ == 0;
  ++step_;
  lr_ = lr;
  grad_scale_ = grad_scale;
}

double SGD::update_shard(size_t i, size_t /*next_shard*/) {
  ProfileScope profile(ProfileCategory::optimizer);
  return update_slice(shards_[i], param_dtype_, options_, lr_, grad_scale_, first_, 0, shards_[i].numel, master(i),
                      momentum_buffer(i));
}

std::vector<std::string> SGD::state_names() const {
  std::vector<std::string> names;
  if (param_dtype_ != DType::f32) names.push_back("master");
  if (options_.momentum != 0.0f) names.push_back("momentum_buffer");
  return names;
}

std::vector<float*> SGD::state_tensors(size_t i) {
  std::vector<float*> out;
  if (param_dtype_ != DType::f32) out.push_back(master(i));
  if (options_.momentum != 0.0f) out.push_back(momentum_buffer(i));
  return out;
}

void SGD::export_state(const std::function<void(const StatePiece&, const float* data)>& fn) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    std::vector<float*> tensors = state_tensors(i);
    for (size_t k = 0; k < tensors.size(); ++k) fn(StatePiece{i, static_cast<int>(k), 0, shards_[i].numel}, tensors[k]);
  }
}

void SGD::import_state(const std::function<void(const StatePiece&, float* data)>& fn) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    std::vector<float*> tensors = state_tensors(i);
    for (size_t k = 0; k < tensors.size(); ++k) fn(StatePiece{i, static_cast<int>(k), 0, shards_[i].numel}, tensors[k]);
  }
}

}  // namespace zerone::optim
