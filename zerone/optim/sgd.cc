#include "zerone/optim/sgd.h"

#include <algorithm>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"

namespace zerone::optim {

SGD::SGD(std::vector<ShardRef> shards, DType param_dtype, const SGDOptions& options, MemPlace state_place)
    : shards_(std::move(shards)), param_dtype_(param_dtype), options_(options), state_place_(state_place) {
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
      load_master(st.master.as<float>(), state_place, s.param, param_dtype_, s.numel);
    }
    for (auto [b, e] : s.decay_ranges) ZERONE_ASSERT(b <= e && e <= s.numel, "bad decay range");
  }
}

float* SGD::master(size_t i) {
  return param_dtype_ == DType::f32 ? static_cast<float*>(shards_[i].param) : state_[i].master.as<float>();
}

PendingSum SGD::update_slice(MemPlace run_place, const ShardRef& s, DType param_dtype, const SGDOptions& options,
                             float lr, float grad_scale, bool first, size_t begin, size_t end, float* master,
                             float* momentum) {
  ZERONE_ASSERT(begin <= end && end <= s.numel);
  kernels::Backend& backend = kernels::backend_for(run_place);
  const size_t ds = dtype_size(param_dtype);
  void* param_out = param_dtype == DType::f32 ? nullptr : static_cast<char*>(s.param) + begin * ds;
  // The slice's operands staged once for all its decay runs (Note [Operands in another place]).
  return run_with_operands_in(run_place, param_dtype, end - begin, {master, s.grad + begin, param_out},
                              [&](const RunOperands& o) {
                                PendingSum sumsq;
                                for_each_decay_run(s, begin, end, options.weight_decay, [&](size_t b, size_t e, float wd) {
                                  const size_t at = b - begin;
                                  const kernels::SGDHyper h{lr, options.momentum, options.dampening, options.nesterov,
                                                            wd, grad_scale, first};
                                  sumsq += backend.sgd_update(o.master + at, momentum ? momentum + at : nullptr,
                                                              o.grad + at, o.param ? static_cast<char*>(o.param) + at * ds : nullptr,
                                                              param_dtype, e - b, h);
                                });
                                return sumsq;
                              });
}

void SGD::begin_step(float lr, float grad_scale) {
  first_ = step_ == 0;
  ++step_;
  lr_ = lr;
  grad_scale_ = grad_scale;
}

PendingSum SGD::update_shard(size_t i, size_t /*next_shard*/) {
  ProfileScope profile(ProfileCategory::optimizer);
  return update_slice(state_place_, shards_[i], param_dtype_, options_, lr_, grad_scale_, first_, 0, shards_[i].numel, master(i),
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
