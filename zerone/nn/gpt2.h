// GPT-2: token + position embedding, L pre-norm transformer blocks, final LayerNorm, a language
// model head tied to the token embedding. The layer arithmetic follows llm.c's train_gpt2.c (the
// readable spec); the parameters live in FlatParam units:
//
//   unit 0        "embedding"  wte (Vp, C), wpe (maxT, C)
//   unit 1..L     "block.l"    ln1w, ln1b (C), qkvw (3C, C), qkvb (3C), attprojw (C, C), attprojb (C),
//                              ln2w, ln2b (C), fcw (4C, C), fcb (4C), fcprojw (C, 4C), fcprojb (C)
//   unit L+1      "final"      lnfw, lnfb (C)      (the head reads wte from unit 0)
//
// Precision: parameters are stored in `compute_dtype` (f32, bf16 or f16); activations and gradients are
// f32; matmuls run in the compute dtype with f32 accumulation (see kernels/cpu/ops.h).
//
// A Model (model.h): UnitHooks let the ZeRO engine act around each unit (gather parameters before
// use, release them, reduce a unit's gradients as soon as they are complete). Thread-safety: one
// thread drives a model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <initializer_list>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/memory.h"
#include "zerone/nn/flat_param.h"
#include "zerone/nn/model.h"

namespace zerone::nn {

struct GPT2Config {
  int max_seq_len = 1024;         // maxT, the context length
  int vocab_size = 50257;         // V
  int padded_vocab_size = 50304;  // Vp, V rounded up to a multiple of 128
  int num_layers = 12;            // L
  int num_heads = 12;             // NH
  int channels = 768;             // C

  // Total trainable parameters (padded vocabulary rows included, FlatParam padding excluded).
  size_t num_parameters() const;
  std::string to_string() const;  // the spec string that parses back to this config
  bool operator==(const GPT2Config&) const = default;
};

// Parses a model spec: a preset ("gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b") or
// "gpt2:layers=4,dim=128,heads=4,vocab=512,ctx=256" (keys may be omitted: defaults are the 124M
// values; "padded_vocab" overrides the rounding). Throws Error naming the bad part.
GPT2Config parse_model_spec(const std::string& spec);
int pad_vocab(int vocab_size);

// Tensor indices inside a block unit.
enum BlockTensor { kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb, kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb,
                   kBlockTensors };
enum EmbeddingTensor { kWte, kWpe };
enum FinalTensor { kLnfw, kLnfb };

class GPT2 : public UnitModel {
 public:
  // align_numel: FlatParam padding granularity (world_size * 64). Without `allocate` the units
  // hold no storage yet: the ZeRO engine materializes them one at a time (Note [Materializing
  // units] in zero/engine.h), so no rank ever holds the whole model at stage 3.
  GPT2(const GPT2Config& config, DType compute_dtype, size_t align_numel = 64, bool allocate = true);

  const GPT2Config& config() const { return config_; }
  std::string spec() const override { return config_.to_string(); }
  size_t num_parameters() const override { return config_.num_parameters(); }
  int vocab_size() const override { return config_.vocab_size; }
  int max_seq_len() const override { return config_.max_seq_len; }

  // GPT-2 initialisation, deterministic in (seed, unit, tensor, element): N(0, 0.02) for matrices
  // and embeddings, N(0, 0.02/sqrt(2L)) for the residual projections (attprojw, fcprojw), zero biases,
  // LayerNorm weights 1, padded vocabulary rows 0. Values are rounded to the compute dtype; the
  // optimizer's f32 master weights start from these stored values (as DeepSpeed's bf16 optimizer).
  // init_weights (Model) runs this for every unit; the unit's parameters must be allocated.
  void init_unit(int unit, uint64_t seed) override;

  // Forward pass over inputs (B,T) (token ids < V, validated by the caller). With targets (B,T)
  // returns the mean cross-entropy loss over B*T and keeps what backward needs; without targets
  // computes logits only and returns 0. B, T may change between calls (buffers are resized).
  float forward(const int32_t* inputs, const int32_t* targets, int B, int T) override;
  // Logits (B,T,Vp) of the last forward (valid until backward, which overwrites them), in the
  // compute dtype (Note [Logits in the compute dtype], kernels/backend.h).
  const void* logits() const override { return acts_.logits.data(); }
  int logits_stride() const override { return config_.padded_vocab_size; }
  DType logits_dtype() const override { return dtype_; }
  // Per-token losses (B,T) of the last forward with targets.
  const float* losses() const { return acts_.losses.as<float>(); }

  // The units whose parameters (and gradients) unit `u`'s forward/backward touches: {u}, and for
  // the final unit also the embedding (the tied head reads wte and accumulates its gradient).
  std::vector<int> units_touched(int u) const override {
    return u == num_units() - 1 ? std::vector<int>{u, 0} : std::vector<int>{u};
  }

  // Backward of the last forward with targets. Accumulates into every unit's gradient the
  // gradient of (grad_scale * mean loss), so grad accumulation uses grad_scale = 1/accum.
  void backward(float grad_scale) override;

  // Bytes of activations (and backward temporaries) that forward/backward at (B, T) allocate;
  // the same table sizes the buffers, so `zerone estimate` and the ledger agree.
  // `att_saved`: what the device backend keeps of attention (Note [Attention's saved state]);
  // `dtype`: the compute dtype (Note [GEMM operands in the compute dtype], kernels/backend.h).
  static size_t activation_bytes(const GPT2Config& config, DType dtype, int B, int T, bool checkpointing = false,
                                 bool saved_inputs_on_host = false,
                                 kernels::AttentionSaved att_saved = kernels::AttentionSaved::probabilities);
  size_t activation_bytes(int B, int T) const override {
    return activation_bytes(config_, dtype_, B, T, checkpointing_, saved_inputs_on_host(), attention_saved());
  }
  size_t host_activation_bytes(int B, int T) const override {
    return saved_inputs_numel(saved_inputs_on_host(), config_.num_layers, static_cast<size_t>(B) * T * config_.channels) * 4;
  }
  // Real elements of each unit, in unit order (no allocation).
  static std::vector<size_t> unit_numels(const GPT2Config& config);

 protected:
  void count_scratch(kernels::ScratchCount& count, int B, int T) const override;

 private:
  struct Activations {
    int B = 0, T = 0;
    bool checkpointing = false, on_host = false;
    Buffer encoded, ln1, ln1_mean, ln1_rstd, qkv, atty, att, residual2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu,
        residual3, lnf, lnf_mean, lnf_rstd, logits, losses, lse, tmp_c;
    Buffer dresidual, dbuf_c, dqkv, dfch;  // backward temporaries (dlogits are written over logits)
    Buffer inputs, targets;                // copies of the last forward's token ids
    Buffer saved;  // host copies of the saved block inputs (Note [CPU checkpointing])
  };
  void ensure_activations(int B, int T);
  // One block's activations: its input, internals (slot l, or slot 0 with checkpointing) and output.
  // ln1, ln2, fch_gelu, qkv, atty and fch are in the compute dtype (dtype_; activation_buffers in
  // gpt2.cc says why each).
  struct BlockActs {
    const float* residual;
    void *ln1, *ln2, *fch_gelu, *qkv, *atty, *fch;  // in the compute dtype
    float *ln1_mean, *ln1_rstd, *att, *residual2, *ln2_mean, *ln2_rstd, *residual3;
  };
  BlockActs block_acts(int l);
  // Block l's forward (parameters of unit 1 + l in place) from its saved input.
  void block_forward(int l);

  GPT2Config config_;
  Activations acts_;
  bool have_targets_ = false;
};

}  // namespace zerone::nn
