#include "zerone/nn/gpt2.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <cstring>
#include <set>
#include <sstream>

#include "zerone/core/error.h"
#include "zerone/core/rng.h"

namespace zerone::nn {

int pad_vocab(int vocab_size) { return (vocab_size + 127) / 128 * 128; }

size_t GPT2Config::num_parameters() const {
  size_t C = channels, L = num_layers;
  size_t block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  return static_cast<size_t>(padded_vocab_size) * C + static_cast<size_t>(max_seq_len) * C + L * block + 2 * C;
}

std::string GPT2Config::to_string() const {
  std::string s = str_cat("gpt2:layers=", num_layers, ",dim=", channels, ",heads=", num_heads, ",vocab=", vocab_size,
                          ",ctx=", max_seq_len);
  if (padded_vocab_size != pad_vocab(vocab_size)) s += str_cat(",padded_vocab=", padded_vocab_size);
  return s;
}

GPT2Config parse_model_spec(const std::string& spec) {
  GPT2Config c;  // 124M defaults
  auto preset = [&](int L, int C, int NH) {
    c.num_layers = L;
    c.channels = C;
    c.num_heads = NH;
  };
  if (spec == "gpt2-124m" || spec == "gpt2") return c;
  if (spec == "gpt2-350m") { preset(24, 1024, 16); return c; }
  if (spec == "gpt2-774m") { preset(36, 1280, 20); return c; }
  if (spec == "gpt2-1.5b") { preset(48, 1600, 25); return c; }
  const std::string prefix = "gpt2:";
  ZERONE_CHECK(spec.rfind(prefix, 0) == 0, "--model '", spec,
               "': expected a preset (gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b) or a spec such as "
               "gpt2:layers=4,dim=128,heads=4,vocab=512,ctx=256");
  bool padded_given = false;
  std::set<std::string> seen;
  const std::string body = spec.substr(prefix.size());
  ZERONE_CHECK(!body.empty(), "--model '", spec, "': no keys after 'gpt2:' (e.g. gpt2:layers=4,dim=128,heads=4,vocab=512,ctx=256)");
  std::stringstream items(body + ",");  // so that a trailing comma leaves an empty last item
  std::string item;
  size_t count = std::count(body.begin(), body.end(), ',') + 1;
  for (size_t i = 0; i < count && std::getline(items, item, ','); ++i) {
    auto eq = item.find('=');
    ZERONE_CHECK(!item.empty(), "--model '", spec, "': an empty item (two commas, or a trailing comma)");
    ZERONE_CHECK(eq != std::string::npos, "--model '", spec, "': '", item, "' is not key=value");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    ZERONE_CHECK(seen.insert(key).second, "--model '", spec, "': key '", key, "' is given twice");
    // Limits as llm.c's checkpoint header rules (io/llmc_checkpoint.cc), so sizes cannot overflow.
    long long limit = key == "layers" || key == "heads" ? 4096 : key == "dim" ? 65536 : key == "ctx" ? (1 << 20) : (1 << 24);
    long long v = 0;
    bool digits = !value.empty() && value.size() <= 9 && value[0] != '0' &&
                  std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (digits) v = std::stoll(value);
    ZERONE_CHECK(digits && v >= 1 && v <= limit, "--model '", spec, "': ", key, "=", value,
                 " is not a positive decimal integer of at most ", limit);
    int iv = static_cast<int>(v);
    if (key == "layers") c.num_layers = iv;
    else if (key == "dim") c.channels = iv;
    else if (key == "heads") c.num_heads = iv;
    else if (key == "vocab") c.vocab_size = iv;
    else if (key == "ctx") c.max_seq_len = iv;
    else if (key == "padded_vocab") { c.padded_vocab_size = iv; padded_given = true; }
    else ZERONE_CHECK(false, "--model '", spec, "': unknown key '", key,
                      "' (expected layers, dim, heads, vocab, ctx, padded_vocab)");
  }
  if (!padded_given) c.padded_vocab_size = pad_vocab(c.vocab_size);
  ZERONE_CHECK(c.channels % c.num_heads == 0, "--model '", spec, "': dim=", c.channels,
               " is not divisible by heads=", c.num_heads);
  ZERONE_CHECK(c.padded_vocab_size >= c.vocab_size, "--model '", spec, "': padded_vocab=", c.padded_vocab_size,
               " is smaller than vocab=", c.vocab_size);
  return c;
}

GPT2::GPT2(const GPT2Config& config, DType compute_dtype, size_t align_numel, bool allocate)
    : UnitModel(compute_dtype), config_(config) {
  const int64_t C = config.channels, Vp = config.padded_vocab_size, maxT = config.max_seq_len;
  units_.reserve(config.num_layers + 2);
  units_.emplace_back("embedding",
                      std::vector<TensorSpec>{{"wte", {Vp, C}, true}, {"wpe", {maxT, C}, true}}, dtype_, align_numel,
                      allocate);
  for (int l = 0; l < config.num_layers; ++l) {
    units_.emplace_back(str_cat("block.", l),
                        std::vector<TensorSpec>{{"ln1w", {C}, false},
                                                {"ln1b", {C}, false},
                                                {"qkvw", {3 * C, C}, true},
                                                {"qkvb", {3 * C}, false},
                                                {"attprojw", {C, C}, true},
                                                {"attprojb", {C}, false},
                                                {"ln2w", {C}, false},
                                                {"ln2b", {C}, false},
                                                {"fcw", {4 * C, C}, true},
                                                {"fcb", {4 * C}, false},
                                                {"fcprojw", {C, 4 * C}, true},
                                                {"fcprojb", {C}, false}},
                        dtype_, align_numel, allocate);
  }
  units_.emplace_back("final", std::vector<TensorSpec>{{"lnfw", {C}, false}, {"lnfb", {C}, false}}, dtype_,
                      align_numel, allocate);
}

void GPT2::init_unit(int u, uint64_t seed) {
  const double std_base = 0.02, std_proj = 0.02 / std::sqrt(2.0 * config_.num_layers);
  std::vector<float> values;
  {
    FlatParam& unit = units_[u];
    ZERONE_ASSERT(unit.has_params(), "init_unit on a unit without storage");
    for (size_t t = 0; t < unit.tensors().size(); ++t) {
      const TensorSpec& spec = unit.tensors()[t];
      values.assign(spec.numel(), 0.0f);
      bool is_norm_weight = spec.name == "ln1w" || spec.name == "ln2w" || spec.name == "lnfw";
      if (is_norm_weight) {
        std::fill(values.begin(), values.end(), 1.0f);
      } else if (spec.shape.size() == 2) {
        double stddev = (spec.name == "attprojw" || spec.name == "fcprojw") ? std_proj : std_base;
        size_t rows = spec.shape[0], cols = spec.shape[1];
        if (spec.name == "wte") rows = config_.vocab_size;  // padded rows stay 0
        fill_normal(values.data(), rows * cols, seed, u * 64 + t, stddev);  // Note [Parallel initialization]
      }
      convert_from_f32(values.data(), unit.param(t), dtype_, values.size());
    }
  }
}

namespace {

// Every activation buffer, in the order of GPT2::Activations' members: its element count and
// element size. The token ids are int32; ln1, ln2, fch_gelu and lnf, which only GEMMs read, are in
// the compute dtype (Note [GEMM operands in the compute dtype], kernels/backend.h), and so are the
// logits, which backward overwrites with dlogits (Note [Logits in the compute dtype]), qkv and
// atty (Note [Attention's inputs and output in the compute dtype]) and fch (Note [The MLP's hidden
// activation in the compute dtype]); the rest are f32.
// With activation checkpointing (Note [Activation checkpointing] in model.h) the block internals
// are kept for one block (S = 1 slot, recomputed in backward) and only the block outputs
// (residual3) for all L; with CPU checkpointing two device slots of them, and the last entry, the
// host copies (Note [CPU checkpointing] in model.h).
std::array<ActivationBuffer, 28> activation_buffers(const GPT2Config& c, DType dtype, int B, int T, bool checkpointing,
                                                    bool on_host, kernels::AttentionSaved att_saved) {
  const size_t L = c.num_layers, C = c.channels, NH = c.num_heads, Vp = c.padded_vocab_size;
  const size_t S = checkpointing ? 1 : L;
  const size_t BT = static_cast<size_t>(B) * T;
  const size_t f = 4, g = dtype_size(dtype);  // f32 (and int32); a GEMM operand
  return {{{BT * C, f},          {S * BT * C, g},      {S * BT, f},         {S * BT, f},
           {S * BT * 3 * C, g},  {S * BT * C, g},      {S * kernels::attention_saved_numel(att_saved, B, NH, T), f},
           {S * BT * C, f},      {S * BT * C, g},      {S * BT, f},         {S * BT, f},
           {S * BT * 4 * C, g},  {S * BT * 4 * C, g},  {UnitModel::output_slots_numel(on_host, L, BT * C), f},
           {BT * C, g},          {BT, f},              {BT, f},             {BT * Vp, g},
           {BT, f},              {BT, f},              {BT * C, f},         {BT * C, f},
           {BT * C, f},          {BT * 3 * C, f},      {BT * 4 * C, f},     {BT, f},
           {BT, f},              {UnitModel::saved_inputs_numel(on_host, L, BT * C), f}}};
}

}  // namespace

size_t GPT2::activation_bytes(const GPT2Config& config, DType dtype, int B, int T, bool checkpointing, bool on_host,
                              kernels::AttentionSaved att_saved) {
  // In long double first: L * B * NH * T * T overflows 64 bits for absurd shapes, and a wrapped
  // total would pass the start-up memory check.
  const long double L = config.num_layers, C = config.channels, NH = config.num_heads, Vp = config.padded_vocab_size;
  const long double BT = static_cast<long double>(B) * T;
  const long double approx = 4 * (L * BT * (13 * C + 4 + 8 * C) + L * B * NH * static_cast<long double>(T) * T +
                                  BT * (Vp + 11 * C + 8));
  ZERONE_CHECK(approx < 0x1p62L, "activations of ", config.to_string(), " at micro-batch ", B, " x seq ", T,
               " would need about ", static_cast<double>(approx), " bytes: beyond any machine");
  size_t total = 0;
  for (const ActivationBuffer& b : activation_buffers(config, dtype, B, T, checkpointing, on_host, att_saved))
    total += b.numel * b.elem_bytes;
  return total;
}

std::vector<size_t> GPT2::unit_numels(const GPT2Config& c) {
  const size_t C = c.channels;
  std::vector<size_t> out;
  out.push_back(static_cast<size_t>(c.padded_vocab_size) * C + static_cast<size_t>(c.max_seq_len) * C);
  for (int l = 0; l < c.num_layers; ++l) out.push_back(12 * C * C + 13 * C);
  out.push_back(2 * C);
  return out;
}

void GPT2::ensure_activations(int B, int T) {
  Activations& a = acts_;
  if (a.B == B && a.T == T && a.checkpointing == checkpointing_ && a.on_host == saved_inputs_on_host()) return;
  a = Activations{};
  a.B = B;
  a.T = T;
  a.checkpointing = checkpointing_;
  a.on_host = saved_inputs_on_host();
  auto sizes = activation_buffers(config_, dtype_, B, T, checkpointing_, a.on_host, allocated_attention_saved());
  Buffer* buffers[] = {&a.encoded, &a.ln1,      &a.ln1_mean, &a.ln1_rstd, &a.qkv,    &a.atty,   &a.att,
                       &a.residual2, &a.ln2,    &a.ln2_mean, &a.ln2_rstd, &a.fch,    &a.fch_gelu, &a.residual3,
                       &a.lnf,     &a.lnf_mean, &a.lnf_rstd, &a.logits,   &a.losses, &a.lse,    &a.tmp_c,
                       &a.dresidual, &a.dbuf_c, &a.dqkv,     &a.dfch,     &a.inputs, &a.targets, &a.saved};
  static_assert(sizeof(buffers) / sizeof(buffers[0]) == std::tuple_size_v<decltype(sizes)>);
  for (size_t i = 0; i < sizes.size(); ++i)  // the last: the host copies of the saved block inputs
    *buffers[i] = Buffer(sizes[i].numel * sizes[i].elem_bytes, MemCategory::activation,
                         i + 1 == sizes.size() ? MemPlace::host : MemPlace::device);
}

float GPT2::forward(const int32_t* inputs, const int32_t* targets, int B, int T) {
  ZERONE_CHECK(T >= 1 && T <= config_.max_seq_len, "sequence length ", T, " is outside 1..", config_.max_seq_len,
               " (the model's context length)");
  ZERONE_CHECK(B >= 1, "batch size must be at least 1, got ", B);
  ensure_activations(B, T);
  Activations& a = acts_;
  const int L = config_.num_layers, C = config_.channels;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size, N = B * T;
  const size_t BTC = static_cast<size_t>(N) * C;
  backend_.copy_to_device(a.inputs.data(), inputs, sizeof(int32_t) * N);  // (B,T)
  have_targets_ = targets != nullptr;
  if (have_targets_) backend_.copy_to_device(a.targets.data(), targets, sizeof(int32_t) * N);

  hooks_->before_forward(0);
  backend_.embedding_forward(a.encoded.as<float>(), a.inputs.as<int32_t>(), p(0, kWte), p(0, kWpe), dtype_, B, T, C, Vp);  // (B,T,C)
  hooks_->after_forward(0);

  for (int l = 0; l < L; ++l) {
    hooks_->before_forward(1 + l);
    block_forward(l);
    save_block_output(a.residual3, a.saved, l, L, BTC);
    hooks_->after_forward(1 + l);
  }

  const int uf = L + 1;
  hooks_->before_forward(uf);  // the head also reads wte (unit 0): the engine keeps it available
  const float* last = L == 0 ? a.encoded.as<float>() : block_output(a.residual3, L - 1, BTC);
  backend_.layernorm_forward(a.lnf.data(), dtype_, a.lnf_mean.as<float>(), a.lnf_rstd.as<float>(), last,
                             p(uf, kLnfw), p(uf, kLnfb), dtype_, N, C);
  backend_.linear_forward(a.logits.data(), dtype_, a.lnf.data(), dtype_, p(0, kWte), nullptr, dtype_, N, C, Vp);  // (B,T,Vp)
  hooks_->after_forward(uf);
  if (!have_targets_) return 0.0f;
  backend_.crossentropy_forward(a.losses.as<float>(), a.lse.as<float>(), a.logits.data(), dtype_,
                                a.targets.as<int32_t>(), N, V, Vp);
  return static_cast<float>(backend_.sum(a.losses.as<float>(), N) / N);
}

GPT2::BlockActs GPT2::block_acts(int l) {
  Activations& a = acts_;
  const size_t N = static_cast<size_t>(a.B) * a.T, C = config_.channels, BTC = N * C;
  const size_t s = checkpointing_ ? 0 : l;  // the slot of the block internals
  BlockActs b;
  b.residual = l == 0 ? a.encoded.as<float>() : block_output(a.residual3, l - 1, BTC);  // (B,T,C)
  const size_t g = dtype_size(dtype_);  // the GEMM operands' element size
  b.ln1 = a.ln1.as<char>() + s * BTC * g;                                                    // (B,T,C)
  b.ln1_mean = a.ln1_mean.as<float>() + s * N;                                               // (B,T)
  b.ln1_rstd = a.ln1_rstd.as<float>() + s * N;
  b.qkv = a.qkv.as<char>() + s * BTC * 3 * g;                                                // (B,T,3C)
  b.atty = a.atty.as<char>() + s * BTC * g;                                                  // (B,T,C)
  b.att = a.att.as<float>() + s * kernels::attention_saved_numel(attention_saved_, a.B, config_.num_heads, a.T);  // Note [Attention's saved state]
  b.residual2 = a.residual2.as<float>() + s * BTC;
  b.ln2 = a.ln2.as<char>() + s * BTC * g;
  b.ln2_mean = a.ln2_mean.as<float>() + s * N;
  b.ln2_rstd = a.ln2_rstd.as<float>() + s * N;
  b.fch = a.fch.as<char>() + s * BTC * 4 * g;                                                // (B,T,4C)
  b.fch_gelu = a.fch_gelu.as<char>() + s * BTC * 4 * g;
  b.residual3 = block_output(a.residual3, l, BTC);  // always kept (Note [CPU checkpointing]: a slot)
  return b;
}

void GPT2::block_forward(int l) {
  const int u = 1 + l, B = acts_.B, T = acts_.T, C = config_.channels, NH = config_.num_heads, N = B * T;
  const size_t BTC = static_cast<size_t>(N) * C;
  BlockActs b = block_acts(l);
  float* tmp = acts_.tmp_c.as<float>();
  // ln1, ln2 and fch_gelu in the compute dtype (Note [GEMM operands in the compute dtype]), and
  // qkv and atty (Note [Attention's inputs and output in the compute dtype]), and fch (Note [The
  // MLP's hidden activation in the compute dtype]).
  backend_.layernorm_forward(b.ln1, dtype_, b.ln1_mean, b.ln1_rstd, b.residual, p(u, kLn1w), p(u, kLn1b), dtype_, N, C);
  backend_.linear_forward(b.qkv, dtype_, b.ln1, dtype_, p(u, kQkvw), p(u, kQkvb), dtype_, N, C, 3 * C);
  backend_.attention_forward(b.atty, b.att, b.qkv, B, T, C, NH, dtype_);
  backend_.linear_forward(tmp, DType::f32, b.atty, dtype_, p(u, kAttprojw), p(u, kAttprojb), dtype_, N, C, C);
  backend_.residual_forward(b.residual2, b.residual, tmp, BTC);
  backend_.layernorm_forward(b.ln2, dtype_, b.ln2_mean, b.ln2_rstd, b.residual2, p(u, kLn2w), p(u, kLn2b), dtype_, N, C);
  backend_.linear_forward(b.fch, dtype_, b.ln2, dtype_, p(u, kFcw), p(u, kFcb), dtype_, N, C, 4 * C);
  backend_.gelu_forward(b.fch_gelu, dtype_, b.fch, dtype_, BTC * 4);
  backend_.linear_forward(tmp, DType::f32, b.fch_gelu, dtype_, p(u, kFcprojw), p(u, kFcprojb), dtype_, N, 4 * C, C);
  backend_.residual_forward(b.residual3, b.residual2, tmp, BTC);
}

void GPT2::backward(float grad_scale) {
  ZERONE_ASSERT(have_targets_ && acts_.B > 0, "backward() needs a forward() with targets first");
  Activations& a = acts_;
  const int B = a.B, T = a.T, L = config_.num_layers, C = config_.channels, NH = config_.num_heads;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size, N = B * T;
  const size_t BTC = static_cast<size_t>(N) * C;
  const int32_t* inputs = a.inputs.as<int32_t>();
  const int32_t* targets = a.targets.as<int32_t>();
  float* dresidual = a.dresidual.as<float>();  // (B,T,C) gradient wrt the residual stream
  float* dbuf = a.dbuf_c.as<float>();          // (B,T,C)

  const int uf = L + 1;
  hooks_->before_backward(uf);
  // (B,T,Vp) over the logits, in the compute dtype (Note [Logits in the compute dtype]).
  void* dlogits = a.logits.data();
  backend_.crossentropy_backward(dlogits, dtype_, a.logits.data(), dtype_, a.lse.as<float>(), targets, grad_scale / N, N,
                                 V, Vp);
  accumulate_grads(uf, {});
  // The tied head writes wte's gradient first; the embedding's backward adds to it below.
  const bool accumulate_wte = accumulate_grads(0, {kWte});
  backend_.linear_backward(dbuf, g(0, kWte), nullptr, dlogits, dtype_, a.lnf.data(), dtype_, p(0, kWte), dtype_, N, C,
                           Vp, accumulate_wte);
  const float* last = L == 0 ? a.encoded.as<float>() : block_output(a.residual3, L - 1, BTC);
  backend_.fill_zero(dresidual, BTC * sizeof(float));
  backend_.layernorm_backward(dresidual, g(uf, kLnfw), g(uf, kLnfb), dbuf, last, p(uf, kLnfw), dtype_,
                        a.lnf_mean.as<float>(), a.lnf_rstd.as<float>(), N, C);
  hooks_->after_backward(uf);

  for (int l = L - 1; l >= 0; --l) {
    const int u = 1 + l;
    hooks_->before_backward(u);
    // Note [Activation checkpointing]: the block's internals are recomputed from its saved input
    // (the engine has gathered its parameters for backward), bit for bit what forward computed.
    if (checkpointing_) {
      restore_block_input(a.residual3, a.saved, l, BTC);
      block_forward(l);
    }
    const BlockActs b = block_acts(l);
    const float* residual = b.residual;
    const void *ln1 = b.ln1, *ln2 = b.ln2, *fch_gelu = b.fch_gelu, *qkv = b.qkv, *atty = b.atty;  // compute dtype
    const void* fch = b.fch;                                                                        // compute dtype
    const float *ln1_mean = b.ln1_mean, *ln1_rstd = b.ln1_rstd, *att = b.att;
    const float *residual2 = b.residual2, *ln2_mean = b.ln2_mean, *ln2_rstd = b.ln2_rstd;
    float* dfch = a.dfch.as<float>();  // (B,T,4C)
    float* dqkv = a.dqkv.as<float>();  // (B,T,3C)
    const bool acc = accumulate_grads(u, {kQkvw, kQkvb, kAttprojw, kAttprojb, kFcw, kFcb, kFcprojw, kFcprojb});

    // residual3 = residual2 + fcproj: dresidual flows to both unchanged.
    backend_.linear_backward(dfch, g(u, kFcprojw), g(u, kFcprojb), dresidual, DType::f32, fch_gelu, dtype_,
                             p(u, kFcprojw), dtype_, N, 4 * C, C, acc);
    // Note [GELU's backward in the linear's]: dfch (the GELU output's gradient) is spent here.
    backend_.linear_backward_through_gelu(dbuf, g(u, kFcw), g(u, kFcb), dfch, fch, dtype_, ln2, dtype_, p(u, kFcw),
                                          dtype_, N, C, 4 * C, acc);
    backend_.layernorm_backward(dresidual, g(u, kLn2w), g(u, kLn2b), dbuf, residual2, p(u, kLn2w), dtype_, ln2_mean,
                          ln2_rstd, N, C);
    // residual2 = residual + attproj
    backend_.linear_backward(dbuf, g(u, kAttprojw), g(u, kAttprojb), dresidual, DType::f32, atty, dtype_,
                             p(u, kAttprojw), dtype_, N, C, C, acc);
    backend_.attention_backward(dqkv, dbuf, qkv, atty, att, B, T, C, NH, dtype_);
    backend_.linear_backward(dbuf, g(u, kQkvw), g(u, kQkvb), dqkv, DType::f32, ln1, dtype_, p(u, kQkvw), dtype_, N, C,
                             3 * C, acc);
    backend_.layernorm_backward(dresidual, g(u, kLn1w), g(u, kLn1b), dbuf, residual, p(u, kLn1w), dtype_, ln1_mean,
                          ln1_rstd, N, C);
    hooks_->after_backward(u);
  }

  hooks_->before_backward(0);
  backend_.embedding_backward(g(0, kWte), g(0, kWpe), dresidual, inputs, B, T, C, Vp);
  hooks_->after_backward(0);
}

// forward() and backward()'s calls, each block's once (every block makes the same calls).
void GPT2::count_scratch(kernels::ScratchCount& count, int B, int T) const {
  const int L = config_.num_layers, C = config_.channels, NH = config_.num_heads, N = B * T;
  const int Vp = config_.padded_vocab_size;
  const DType f32 = DType::f32;
  if (L > 0) {  // block_forward, then backward's block
    count.linear_forward(dtype_, dtype_, true, dtype_, N, C, 3 * C);  // qkv
    count.attention_forward(B, T, NH, NH, C / NH, dtype_);
    count.linear_forward(f32, dtype_, true, dtype_, N, C, C);  // attproj
    count.linear_forward(dtype_, dtype_, true, dtype_, N, C, 4 * C);  // fc
    count.linear_forward(f32, dtype_, true, dtype_, N, 4 * C, C);  // fcproj
    count.linear_backward(true, true, f32, dtype_, dtype_, N, 4 * C, C);  // fcproj
    count.linear_backward_through_gelu(true, true, dtype_, dtype_, N, C, 4 * C);  // fc
    count.norm_backward(N, C);
    count.linear_backward(true, true, f32, dtype_, dtype_, N, C, C);  // attproj
    count.attention_backward(B, T, NH, NH, C / NH, dtype_);
    count.linear_backward(true, true, f32, dtype_, dtype_, N, C, 3 * C);  // qkv
  }
  count.linear_forward(dtype_, dtype_, false, dtype_, N, C, Vp);  // the head
  count.sums(static_cast<size_t>(N));                             // the loss
  count.linear_backward(true, false, dtype_, dtype_, dtype_, N, C, Vp);
  count.norm_backward(N, C);  // lnf
}

}  // namespace zerone::nn
