#include "zerone/optim/adamw.h"

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"

namespace zerone::optim {

AdamW::AdamW(std::vector<ShardRef> shards, DType param_dtype, const AdamWOptions& options)
    : shards_(std::move(shards)), param_dtype_(param_dtype), options_(options) {
  state_.resize(shards_.size());
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardRef& s = shards_[i];
    State& st = state_[i];
    st.m = Buffer(s.numel * sizeof(float), MemCategory::optim);
    st.v = Buffer(s.numel * sizeof(float), MemCategory::optim);
    if (param_dtype_ != DType::f32) {
      st.master = Buffer(s.numel * sizeof(float), MemCategory::master);
      convert_to_f32(s.param, param_dtype_, st.master.as<float>(), s.numel);
    }
    for (auto [b, e] : s.decay_ranges) ZERONE_ASSERT(b <= e && e <= s.numel, "bad decay range");
  }
}

float* AdamW::master(size_t i) {
  return param_dtype_ == DType::f32 ? static_cast<float*>(shards_[i].param) : state_[i].master.as<float>();
}

double AdamW::step(float lr, float grad_scale, const std::function<void(size_t shard)>& shard_done) {
  ProfileScope profile(ProfileCategory::optimizer);
  ++step_;
  kernels::cpu::AdamWHyper h;
  h.lr = lr;
  h.beta1 = options_.beta1;
  h.beta2 = options_.beta2;
  h.eps = options_.eps;
  h.step = step_;
  h.grad_scale = grad_scale;
  double sumsq = 0.0;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardRef& s = shards_[i];
    float* master_i = master(i);
    void* param_out = param_dtype_ == DType::f32 ? nullptr : s.param;
    // Walk the shard as alternating no-decay / decay ranges (decay_ranges are sorted).
    size_t pos = 0;
    auto run = [&](size_t begin, size_t end, float wd) {
      if (end <= begin) return;
      h.weight_decay = wd;
      void* p = param_out ? static_cast<char*>(param_out) + begin * dtype_size(param_dtype_) : nullptr;
      sumsq += kernels::cpu::adamw_update(master_i + begin, m(i) + begin, v(i) + begin, s.grad + begin, p,
                                          param_dtype_, end - begin, h);
    };
    for (auto [b, e] : s.decay_ranges) {
      run(pos, b, 0.0f);
      run(b, e, options_.weight_decay);
      pos = e;
    }
    run(pos, s.numel, 0.0f);
    if (shard_done) shard_done(i);
  }
  return sumsq;
}

}  // namespace zerone::optim
