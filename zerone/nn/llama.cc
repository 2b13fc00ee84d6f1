#include "zerone/nn/llama.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <sstream>
#include <tuple>

#include "zerone/core/error.h"
#include "zerone/core/rng.h"

namespace zerone::nn {


size_t LlamaConfig::num_parameters() const {
  const size_t C = channels, V = vocab_size, R = static_cast<size_t>(num_heads + 2 * num_kv_heads) * head_dim;
  const size_t block = C + R * C + C * static_cast<size_t>(num_heads) * head_dim + C + 2 * ffn * C + C * ffn;
  return V * C + num_layers * block + C + (tie_word_embeddings ? 0 : V * C);
}

bool LlamaConfig::operator==(const LlamaConfig& o) const { return to_string() == o.to_string(); }

std::string LlamaConfig::to_string() const {
  std::string s = str_cat("llama:layers=", num_layers, ",dim=", channels, ",heads=", num_heads, ",kv_heads=", num_kv_heads,
                          ",ffn=", ffn, ",vocab=", vocab_size, ",ctx=", max_seq_len);
  if (head_dim * num_heads != channels) s += str_cat(",head_dim=", head_dim);
  s += str_cat(",theta=", rope_theta, ",eps=", rms_norm_eps, ",tied=", tie_word_embeddings ? 1 : 0);
  if (rope_scaling.factor > 0)
    s += str_cat(",rope_factor=", rope_scaling.factor, ",rope_low=", rope_scaling.low_freq_factor, ",rope_high=",
                 rope_scaling.high_freq_factor, ",rope_orig=", rope_scaling.original_max_position);
  return s;
}

bool is_llama_spec(const std::string& spec) {
  return spec.rfind("llama:", 0) == 0 || spec == "tinyllama-1.1b" || spec == "llama-3.2-1b" || spec == "llama-2-7b" ||
         spec == "llama-2-13b" || spec == "llama-3-8b";
}

LlamaConfig parse_llama_spec(const std::string& spec) {
  LlamaConfig c;  // Llama-3.2-1B
  c.rope_scaling = kernels::RopeScaling{32.0f, 1.0f, 4.0f, 8192};
  auto preset = [&](int L, int C, int NH, int NKV, int F, int V, int ctx, float theta, bool tied) {
    c.num_layers = L;
    c.channels = C;
    c.num_heads = NH;
    c.num_kv_heads = NKV;
    c.head_dim = C / NH;
    c.ffn = F;
    c.vocab_size = V;
    c.max_seq_len = ctx;
    c.rope_theta = theta;
    c.tie_word_embeddings = tied;
    c.rope_scaling = kernels::RopeScaling{};
  };
  if (spec == "llama-3.2-1b") return c;
  if (spec == "tinyllama-1.1b") { preset(22, 2048, 32, 4, 5632, 32000, 2048, 10000.0f, false); return c; }
  if (spec == "llama-2-7b") { preset(32, 4096, 32, 32, 11008, 32000, 4096, 10000.0f, false); return c; }
  if (spec == "llama-2-13b") { preset(40, 5120, 40, 40, 13824, 32000, 4096, 10000.0f, false); return c; }
  if (spec == "llama-3-8b") { preset(32, 4096, 32, 8, 14336, 128256, 8192, 500000.0f, false); return c; }
  const std::string prefix = "llama:";
  ZERONE_CHECK(spec.rfind(prefix, 0) == 0, "--model '", spec, "': expected a LLaMA preset (tinyllama-1.1b, llama-3.2-1b, ",
               "llama-2-7b, llama-2-13b, llama-3-8b) or llama:layers=..,dim=..,heads=..,kv_heads=..,ffn=..,vocab=..,ctx=..");
  // A spec names its rotary scaling explicitly (rope_factor ...): none unless given.
  c.rope_scaling = kernels::RopeScaling{};
  bool head_dim_given = false;
  std::stringstream items(spec.substr(prefix.size()));
  for (std::string item; std::getline(items, item, ',');) {
    auto eq = item.find('=');
    ZERONE_CHECK(eq != std::string::npos, "--model '", spec, "': '", item, "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    auto number = [&](double lo, double hi) {
      double v = 0;
      size_t used = 0;
      try {
        v = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      ZERONE_CHECK(used == value.size() && !value.empty() && std::isfinite(v) && v >= lo && v <= hi, "--model '", spec,
                   "': ", key, "=", value, " is out of range: expected a number in [", lo, ", ", hi, "]");
      return v;
    };
    auto integer = [&](long lo, long hi) {
      double v = number(static_cast<double>(lo), static_cast<double>(hi));
      ZERONE_CHECK(v == std::floor(v), "--model '", spec, "': ", key, "=", value, " is not an integer");
      return static_cast<int>(v);
    };
    if (key == "layers") c.num_layers = integer(1, 4096);
    else if (key == "dim") c.channels = integer(1, 1 << 16);
    else if (key == "heads") c.num_heads = integer(1, 4096);
    else if (key == "kv_heads") c.num_kv_heads = integer(1, 4096);
    else if (key == "head_dim") { c.head_dim = integer(2, 2048); head_dim_given = true; }
    else if (key == "ffn") c.ffn = integer(1, 1 << 20);
    else if (key == "vocab") c.vocab_size = integer(1, 1 << 24);
    else if (key == "ctx") c.max_seq_len = integer(1, 1 << 24);
    else if (key == "theta") c.rope_theta = static_cast<float>(number(1.0, 1e12));
    else if (key == "eps") c.rms_norm_eps = static_cast<float>(number(1e-12, 1.0));
    else if (key == "tied") c.tie_word_embeddings = integer(0, 1) == 1;
    else if (key == "rope_factor") c.rope_scaling.factor = static_cast<float>(number(0.0, 1e6));
    else if (key == "rope_low") c.rope_scaling.low_freq_factor = static_cast<float>(number(1e-6, 1e6));
    else if (key == "rope_high") c.rope_scaling.high_freq_factor = static_cast<float>(number(1e-6, 1e6));
    else if (key == "rope_orig") c.rope_scaling.original_max_position = integer(1, 1 << 24);
    else ZERONE_CHECK(false, "--model '", spec, "': unknown key '", key, "' (expected layers, dim, heads, kv_heads, ",
                      "head_dim, ffn, vocab, ctx, theta, eps, tied, rope_factor, rope_low, rope_high, rope_orig)");
  }
  if (!head_dim_given) {
    ZERONE_CHECK(c.channels % c.num_heads == 0, "--model '", spec, "': dim=", c.channels, " is not divisible by heads=",
                 c.num_heads, " (or give head_dim)");
    c.head_dim = c.channels / c.num_heads;
  }
  ZERONE_CHECK(c.head_dim % 2 == 0, "--model '", spec, "': the head size ", c.head_dim, " must be even (rotary pairs)");
  ZERONE_CHECK(c.num_heads % c.num_kv_heads == 0, "--model '", spec, "': heads=", c.num_heads,
               " is not a multiple of kv_heads=", c.num_kv_heads);
  ZERONE_CHECK(c.rope_scaling.factor == 0 || c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor, "--model '",
               spec, "': rope_high must exceed rope_low");
  return c;
}

Llama::Llama(const LlamaConfig& config, DType compute_dtype, size_t align_numel, bool allocate)
    : UnitModel(compute_dtype), config_(config) {
  const int64_t C = config.channels, V = config.vocab_size, F = config.ffn, hs = config.head_dim;
  const int64_t R = static_cast<int64_t>(config.num_heads + 2 * config.num_kv_heads) * hs;
  units_.reserve(config.num_layers + 2);
  units_.emplace_back("embedding", std::vector<TensorSpec>{{"wte", {V, C}, true}}, dtype_, align_numel, allocate);
  for (int l = 0; l < config.num_layers; ++l)
    units_.emplace_back(str_cat("block.", l),
                        std::vector<TensorSpec>{{"attn_norm", {C}, false},
                                                {"wqkv", {R, C}, true},
                                                {"wo", {C, config.num_heads * hs}, true},
                                                {"mlp_norm", {C}, false},
                                                {"w_gate_up", {2 * F, C}, true},
                                                {"w_down", {C, F}, true}},
                        dtype_, align_numel, allocate);
  std::vector<TensorSpec> final_tensors{{"norm", {C}, false}};
  if (!config.tie_word_embeddings) final_tensors.push_back({"lm_head", {V, C}, true});
  units_.emplace_back("final", std::move(final_tensors), dtype_, align_numel, allocate);
  inv_freq_.resize(hs / 2);
  kernels::rope_inv_freq(inv_freq_.data(), static_cast<int>(hs), config.rope_theta, config.rope_scaling);
}

void Llama::init_unit(int u, uint64_t seed) {
  FlatParam& unit = units_[u];
  ZERONE_ASSERT(unit.has_params(), "init_unit on a unit without storage");
  std::vector<float> values;
  for (size_t t = 0; t < unit.tensors().size(); ++t) {
    const TensorSpec& spec = unit.tensors()[t];
    values.assign(spec.numel(), 1.0f);  // norm weights
    if (spec.shape.size() == 2) {
      fill_normal(values.data(), values.size(), seed, u * 64 + t, 0.02);  // Note [Parallel initialization]
    }
    convert_from_f32(values.data(), unit.param(t), dtype_, values.size());
  }
}

namespace {

// Every activation buffer, in the order of Llama::Activations' members: its element count and
// element size (inputs and targets are int32 token ids; h1, h2, act, hf and dgate_up, which only
// GEMMs read, are in the compute dtype: Note [GEMM operands in the compute dtype], kernels/
// backend.h; so are the logits, which backward overwrites with dlogits: Note [Logits in the
// compute dtype], qkv and atty: Note [Attention's inputs and output in the compute dtype], and
// gate_up: Note [The MLP's hidden activation in the compute dtype]; a 16-bit run's rounded copies of
// dresidual and dqkv: Note [Gradients rounded where they are made]; the rest f32; inv_freq is the
// device copy of the rotary table).
// With activation checkpointing (Note [Activation checkpointing] in model.h) one slot (S = 1) of block
// internals, recomputed in backward; the block outputs (residual3) for all L, or two device slots
// of them and, as the last entry, their host copies (Note [CPU checkpointing] in model.h).
std::array<ActivationBuffer, 30> llama_activation_buffers(const LlamaConfig& c, DType dtype, int B, int T,
                                                          bool checkpointing, bool on_host,
                                                          kernels::AttentionSaved att_saved) {
  const size_t L = c.num_layers, C = c.channels, NH = c.num_heads, V = c.vocab_size, F = c.ffn;
  const size_t S = checkpointing ? 1 : L;
  const size_t A = NH * c.head_dim, R = static_cast<size_t>(c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  const size_t BT = static_cast<size_t>(B) * T;
  const size_t f = 4, g = dtype_size(dtype);  // f32 (and int32); a GEMM operand
  const size_t rounded = dtype != DType::f32;   // the rounded gradients: a 16-bit run's only
  return {{{BT * C, f},         {S * BT * C, g},  {S * BT, f},         {S * BT * R, g},
           {S * BT * A, g},     {S * kernels::attention_saved_numel(att_saved, B, NH, T), f},
           {S * BT * C, f},     {S * BT * C, g},  {S * BT, f},         {S * BT * 2 * F, g},
           {S * BT * F, g},     {UnitModel::output_slots_numel(on_host, L, BT * C), f},
           {BT * C, g},         {BT, f},          {BT * V, g},         {BT, f},
           {BT, f},             {BT * C, f},      {BT * C, f},         {BT * C, f},
           {BT * A, f},         {BT * R, f},      {BT * 2 * F, g},     {BT * F, f},
           {rounded * BT * C, g}, {rounded * BT * R, g},
           {BT, f},             {BT, f},
           {static_cast<size_t>(c.head_dim) / 2, f}, {UnitModel::saved_inputs_numel(on_host, L, BT * C), f}}};
}

}  // namespace

size_t Llama::activation_bytes(const LlamaConfig& config, DType dtype, int B, int T, bool checkpointing, bool on_host,
                               kernels::AttentionSaved att_saved) {
  // Overflow guard as GPT2::activation_bytes: the per-layer attention matrix dominates for long T.
  const long double L = config.num_layers, NH = config.num_heads, BT = static_cast<long double>(B) * T;
  const long double width = 8.0L * config.channels + 3.0L * (config.num_heads + 2 * config.num_kv_heads) * config.head_dim +
                            6.0L * config.ffn + config.vocab_size + 16;
  const long double approx = 4 * (L * BT * width + L * B * NH * static_cast<long double>(T) * T + BT * width);
  ZERONE_CHECK(approx < 0x1p62L, "activations of ", config.to_string(), " at micro-batch ", B, " x seq ", T,
               " would need about ", static_cast<double>(approx), " bytes: beyond any machine");
  size_t total = 0;
  for (const ActivationBuffer& b : llama_activation_buffers(config, dtype, B, T, checkpointing, on_host, att_saved))
    total += b.numel * b.elem_bytes;
  return total;
}

std::vector<size_t> Llama::unit_numels(const LlamaConfig& c) {
  Llama shape(c, DType::f32, 1, /*allocate=*/false);
  std::vector<size_t> out;
  for (const FlatParam& u : shape.units()) out.push_back(u.numel());
  return out;
}

void Llama::ensure_activations(int B, int T) {
  Activations& a = acts_;
  if (a.B == B && a.T == T && a.checkpointing == checkpointing_ && a.on_host == saved_inputs_on_host()) return;
  a = Activations{};
  a.B = B;
  a.T = T;
  a.checkpointing = checkpointing_;
  a.on_host = saved_inputs_on_host();
  auto sizes = llama_activation_buffers(config_, dtype_, B, T, checkpointing_, a.on_host, allocated_attention_saved());
  Buffer* buffers[] = {&a.encoded, &a.h1,       &a.rstd1,  &a.qkv,    &a.atty,      &a.att,   &a.residual2,
                       &a.h2,      &a.rstd2,    &a.gate_up, &a.act,   &a.residual3, &a.hf,    &a.rstdf,
                       &a.logits,  &a.losses,   &a.lse,    &a.tmp_c,  &a.dresidual, &a.dbuf_c, &a.datty,
                       &a.dqkv,    &a.dgate_up, &a.dact,   &a.dresidual_rounded, &a.dqkv_rounded,
                       &a.inputs, &a.targets, &a.inv_freq, &a.saved};
  static_assert(sizeof(buffers) / sizeof(buffers[0]) == std::tuple_size_v<decltype(sizes)>);
  for (size_t i = 0; i < sizes.size(); ++i)  // the last: the host copies of the saved block inputs
    *buffers[i] = Buffer(sizes[i].numel * sizes[i].elem_bytes, MemCategory::activation,
                         i + 1 == sizes.size() ? MemPlace::host : MemPlace::device);
  backend_.copy_to_device(a.inv_freq.data(), inv_freq_.data(), inv_freq_.size() * sizeof(float));
}

float Llama::forward(const int32_t* inputs, const int32_t* targets, int B, int T) {
  ZERONE_CHECK(T >= 1 && T <= config_.max_seq_len, "sequence length ", T, " is outside 1..", config_.max_seq_len,
               " (the model's context length)");
  ZERONE_CHECK(B >= 1, "batch size must be at least 1, got ", B);
  ensure_activations(B, T);
  Activations& a = acts_;
  const int L = config_.num_layers, C = config_.channels, V = config_.vocab_size, N = B * T;
  const float eps = config_.rms_norm_eps;
  const size_t BTC = static_cast<size_t>(N) * C;
  backend_.copy_to_device(a.inputs.data(), inputs, sizeof(int32_t) * N);  // (B,T)
  have_targets_ = targets != nullptr;
  if (have_targets_) backend_.copy_to_device(a.targets.data(), targets, sizeof(int32_t) * N);

  hooks_->before_forward(0);
  backend_.embedding_forward(a.encoded.as<float>(), a.inputs.as<int32_t>(), p(0, 0), nullptr, dtype_, B, T, C, V);  // (B,T,C)
  hooks_->after_forward(0);

  for (int l = 0; l < L; ++l) {
    hooks_->before_forward(1 + l);
    block_forward(l);
    save_block_output(a.residual3, a.saved, l, L, BTC);
    hooks_->after_forward(1 + l);
  }

  const int uf = L + 1;
  hooks_->before_forward(uf);
  const float* last = L == 0 ? a.encoded.as<float>() : block_output(a.residual3, L - 1, BTC);
  backend_.rmsnorm_forward(a.hf.data(), dtype_, a.rstdf.as<float>(), last, p(uf, kNorm), dtype_, N, C, eps);
  backend_.linear_forward(a.logits.data(), dtype_, a.hf.data(), dtype_, head(), nullptr, dtype_, N, C, V);  // (B,T,V)
  hooks_->after_forward(uf);
  if (!have_targets_) return 0.0f;
  backend_.crossentropy_forward(a.losses.as<float>(), a.lse.as<float>(), a.logits.data(), dtype_, a.targets.as<int32_t>(),
                                N, V, V);
  return static_cast<float>(backend_.sum(a.losses.as<float>(), N) / N);
}

Llama::BlockActs Llama::block_acts(int l) {
  Activations& a = acts_;
  const size_t N = static_cast<size_t>(a.B) * a.T, C = config_.channels, BTC = N * C, F = config_.ffn;
  const size_t A = static_cast<size_t>(config_.num_heads) * config_.head_dim;
  const size_t R = static_cast<size_t>(config_.num_heads + 2 * config_.num_kv_heads) * config_.head_dim;
  const size_t s = checkpointing_ ? 0 : l;  // the slot of the block internals
  BlockActs b;
  b.residual = l == 0 ? a.encoded.as<float>() : block_output(a.residual3, l - 1, BTC);  // (B,T,C)
  const size_t g = dtype_size(dtype_);  // the GEMM operands' element size
  b.h1 = a.h1.as<char>() + s * BTC * g;                                                     // (B,T,C)
  b.rstd1 = a.rstd1.as<float>() + s * N;                                                    // (B,T)
  b.qkv = a.qkv.as<char>() + s * N * R * g;                                                 // (B,T,R), q and k rotated
  b.atty = a.atty.as<char>() + s * N * A * g;                                               // (B,T,NH*hs)
  b.att = a.att.as<float>() + s * kernels::attention_saved_numel(attention_saved_, a.B, config_.num_heads, a.T);  // Note [Attention's saved state]
  b.residual2 = a.residual2.as<float>() + s * BTC;
  b.h2 = a.h2.as<char>() + s * BTC * g;
  b.rstd2 = a.rstd2.as<float>() + s * N;
  b.gate_up = a.gate_up.as<char>() + s * N * 2 * F * g;                                     // (B,T,2F)
  b.act = a.act.as<char>() + s * N * F * g;                                                 // (B,T,F)
  b.residual3 = block_output(a.residual3, l, BTC);  // always kept (Note [CPU checkpointing]: a slot)
  return b;
}

void Llama::block_forward(int l) {
  const int u = 1 + l, B = acts_.B, T = acts_.T, C = config_.channels, NH = config_.num_heads;
  const int NKV = config_.num_kv_heads, hs = config_.head_dim, F = config_.ffn, N = B * T;
  const int A = NH * hs, R = (NH + 2 * NKV) * hs;
  const float eps = config_.rms_norm_eps;
  const size_t BTC = static_cast<size_t>(N) * C;
  BlockActs b = block_acts(l);
  float* tmp = acts_.tmp_c.as<float>();
  // h1, h2 and act in the compute dtype (Note [GEMM operands in the compute dtype]).
  backend_.rmsnorm_forward(b.h1, dtype_, b.rstd1, b.residual, p(u, kAttnNorm), dtype_, N, C, eps);
  // qkv and atty in the compute dtype (Note [Attention's inputs and output in the compute dtype]).
  backend_.linear_forward(b.qkv, dtype_, b.h1, dtype_, p(u, kWqkv), nullptr, dtype_, N, C, R);
  backend_.rope_forward(b.qkv, dtype_, acts_.inv_freq.as<float>(), B, T, R, NH + NKV, hs);
  backend_.gqa_attention_forward(b.atty, b.att, b.qkv, B, T, NH, NKV, hs, dtype_);
  backend_.linear_forward(tmp, DType::f32, b.atty, dtype_, p(u, kWo), nullptr, dtype_, N, A, C);
  backend_.residual_forward(b.residual2, b.residual, tmp, BTC);
  backend_.rmsnorm_forward(b.h2, dtype_, b.rstd2, b.residual2, p(u, kMlpNorm), dtype_, N, C, eps);
  // gate_up in the compute dtype (Note [The MLP's hidden activation in the compute dtype]).
  backend_.linear_forward(b.gate_up, dtype_, b.h2, dtype_, p(u, kWGateUp), nullptr, dtype_, N, C, 2 * F);
  backend_.swiglu_forward(b.act, dtype_, b.gate_up, dtype_, N, F);
  backend_.linear_forward(tmp, DType::f32, b.act, dtype_, p(u, kWDown), nullptr, dtype_, N, F, C);
  backend_.residual_forward(b.residual3, b.residual2, tmp, BTC);
}

void Llama::backward(float grad_scale) {
  ZERONE_ASSERT(have_targets_ && acts_.B > 0, "backward() needs a forward() with targets first");
  Activations& a = acts_;
  const int B = a.B, T = a.T, L = config_.num_layers, C = config_.channels, NH = config_.num_heads;
  const int NKV = config_.num_kv_heads, hs = config_.head_dim, F = config_.ffn, V = config_.vocab_size, N = B * T;
  const int A = NH * hs, R = (NH + 2 * NKV) * hs;
  const size_t BTC = static_cast<size_t>(N) * C;
  const bool tied = config_.tie_word_embeddings;
  float* dresidual = a.dresidual.as<float>();  // (B,T,C) gradient wrt the residual stream
  float* dbuf = a.dbuf_c.as<float>();          // (B,T,C)
  // Note [Gradients rounded where they are made]: in a 16-bit run the rmsnorm backwards store
  // dresidual rounded and rope's backward stores dqkv rounded, and the bias-less linears' backward
  // GEMMs take those copies; in f32 they take dresidual and dqkv.
  const bool rounds = dtype_ != DType::f32;
  const DType grad_operand_dtype = rounds ? dtype_ : DType::f32;
  void* dresidual_rounded = rounds ? a.dresidual_rounded.data() : nullptr;  // (B,T,C)
  void* dqkv_rounded = rounds ? a.dqkv_rounded.data() : nullptr;            // (B,T,R)
  const void* dresidual_operand = rounds ? dresidual_rounded : dresidual;
  const void* dqkv_operand = rounds ? dqkv_rounded : a.dqkv.data();

  const int uf = L + 1;
  hooks_->before_backward(uf);
  // (B,T,V) over the logits, in the compute dtype (Note [Logits in the compute dtype]).
  void* dlogits = a.logits.data();
  backend_.crossentropy_backward(dlogits, dtype_, a.logits.data(), dtype_, a.lse.as<float>(), a.targets.as<int32_t>(),
                                 grad_scale / N, N, V, V);
  bool accumulate_head;
  float* dhead;
  if (tied) {
    accumulate_grads(uf, {});
    accumulate_head = accumulate_grads(0, {0});  // the head writes wte's gradient; the embedding adds below
    dhead = g(0, 0);
  } else {
    accumulate_head = accumulate_grads(uf, {kLmHead});
    dhead = g(uf, kLmHead);
  }
  backend_.linear_backward(dbuf, dhead, nullptr, dlogits, dtype_, a.hf.data(), dtype_, head(), dtype_, N, C, V,
                           accumulate_head);
  const float* last = L == 0 ? a.encoded.as<float>() : block_output(a.residual3, L - 1, BTC);
  backend_.fill_zero(dresidual, BTC * sizeof(float));
  backend_.rmsnorm_backward(dresidual, g(uf, kNorm), dbuf, last, p(uf, kNorm), dtype_, a.rstdf.as<float>(), N, C,
                            L > 0 ? dresidual_rounded : nullptr, grad_operand_dtype);
  hooks_->after_backward(uf);

  for (int l = L - 1; l >= 0; --l) {
    const int u = 1 + l;
    hooks_->before_backward(u);
    // Note [Activation checkpointing]: recompute the block's internals from its saved input.
    if (checkpointing_) {
      restore_block_input(a.residual3, a.saved, l, BTC);
      block_forward(l);
    }
    const BlockActs b = block_acts(l);
    const void *h1 = b.h1, *h2 = b.h2, *act = b.act, *qkv = b.qkv, *atty = b.atty;  // in the compute dtype
    const void* gate_up = b.gate_up;                                                  // in the compute dtype
    const float *residual = b.residual, *rstd1 = b.rstd1, *att = b.att;
    const float *residual2 = b.residual2, *rstd2 = b.rstd2;
    float* dact = a.dact.as<float>();         // (B,T,F)
    void* dgate_up = a.dgate_up.data();       // (B,T,2F) in the compute dtype
    float* datty = a.datty.as<float>();       // (B,T,NH*hs)
    float* dqkv = a.dqkv.as<float>();         // (B,T,R)
    const bool acc = accumulate_grads(u, {kWqkv, kWo, kWGateUp, kWDown});

    // residual3 = residual2 + down(swiglu(gate_up(norm(residual2))))
    backend_.linear_backward(dact, g(u, kWDown), nullptr, dresidual_operand, grad_operand_dtype, act, dtype_,
                             p(u, kWDown), dtype_, N, F, C, acc);
    backend_.swiglu_backward(dgate_up, dtype_, dact, gate_up, dtype_, N, F);
    backend_.linear_backward(dbuf, g(u, kWGateUp), nullptr, dgate_up, dtype_, h2, dtype_, p(u, kWGateUp), dtype_, N,
                             C, 2 * F, acc);
    backend_.rmsnorm_backward(dresidual, g(u, kMlpNorm), dbuf, residual2, p(u, kMlpNorm), dtype_, rstd2, N, C,
                              dresidual_rounded, grad_operand_dtype);
    // residual2 = residual + wo(attention(rope(wqkv(norm(residual)))))
    backend_.linear_backward(datty, g(u, kWo), nullptr, dresidual_operand, grad_operand_dtype, atty, dtype_,
                             p(u, kWo), dtype_, N, A, C, acc);
    backend_.gqa_attention_backward(dqkv, datty, qkv, atty, att, B, T, NH, NKV, hs, dtype_);
    backend_.rope_backward(dqkv, a.inv_freq.as<float>(), B, T, R, NH + NKV, hs, dqkv_rounded, grad_operand_dtype);
    backend_.linear_backward(dbuf, g(u, kWqkv), nullptr, dqkv_operand, grad_operand_dtype, h1, dtype_, p(u, kWqkv),
                             dtype_, N, C, R, acc);
    // The embedding's backward takes the f32 sum: below layer 0 no rounded copy is read.
    backend_.rmsnorm_backward(dresidual, g(u, kAttnNorm), dbuf, residual, p(u, kAttnNorm), dtype_, rstd1, N, C,
                              l > 0 ? dresidual_rounded : nullptr, grad_operand_dtype);
    hooks_->after_backward(u);
  }

  hooks_->before_backward(0);
  if (!tied) accumulate_grads(0, {});
  backend_.embedding_backward(g(0, 0), nullptr, dresidual, a.inputs.as<int32_t>(), B, T, C, V);
  hooks_->after_backward(0);
}

// forward() and backward()'s calls, each block's once (every block makes the same calls). The
// backward GEMMs' gradient operands are in the compute dtype (Note [Gradients rounded where they
// are made]; f32 in an f32 run).
void Llama::count_scratch(kernels::ScratchCount& count, int B, int T) const {
  const int L = config_.num_layers, C = config_.channels, NH = config_.num_heads, NKV = config_.num_kv_heads;
  const int hs = config_.head_dim, F = config_.ffn, V = config_.vocab_size, N = B * T;
  const int A = NH * hs, R = (NH + 2 * NKV) * hs;
  const DType f32 = DType::f32;
  if (L > 0) {  // block_forward, then backward's block
    count.linear_forward(dtype_, dtype_, false, dtype_, N, C, R);  // wqkv
    count.attention_forward(B, T, NH, NKV, hs, dtype_);
    count.linear_forward(f32, dtype_, false, dtype_, N, A, C);      // wo
    count.linear_forward(dtype_, dtype_, false, dtype_, N, C, 2 * F);  // gate_up
    count.linear_forward(f32, dtype_, false, dtype_, N, F, C);      // down
    count.linear_backward(true, false, dtype_, dtype_, dtype_, N, F, C);  // down
    count.linear_backward(true, false, dtype_, dtype_, dtype_, N, C, 2 * F);
    count.norm_backward(N, C);
    count.linear_backward(true, false, dtype_, dtype_, dtype_, N, A, C);  // wo
    count.attention_backward(B, T, NH, NKV, hs, dtype_);
    count.linear_backward(true, false, dtype_, dtype_, dtype_, N, C, R);  // wqkv
  }
  count.linear_forward(dtype_, dtype_, false, dtype_, N, C, V);  // the head
  count.sums(static_cast<size_t>(N));                            // the loss
  count.linear_backward(true, false, dtype_, dtype_, dtype_, N, C, V);
  count.norm_backward(N, C);  // the final norm
}

}  // namespace zerone::nn
