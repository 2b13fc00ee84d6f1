// LLaMA family (LLaMA-2/3, TinyLlama, Mistral-style GQA): token embedding, L pre-norm blocks of
// RMSNorm -> grouped-query attention with rotary positions -> RMSNorm -> SwiGLU MLP, a final
// RMSNorm and a language-model head (tied to the embedding or not). No biases. Hugging Face's
// LlamaForCausalLM computes the same function (its rotate-half RoPE, f32 RMSNorm). Parameters live
// in FlatParam units, as for GPT-2:
//
//   unit 0        "embedding"  wte (V, C)
//   unit 1..L     "block.l"    attn_norm (C), wqkv ((NH+2*NKV)*hs, C) = [q; k; v] projections,
//                              wo (C, NH*hs), mlp_norm (C), w_gate_up (2F, C) = [gate; up], w_down (C, F)
//   unit L+1      "final"      norm (C), lm_head (V, C) unless tied (the head then reads wte)
//
// q/k/v and gate/up are fused row-wise so each is one GEMM; Hugging Face's separate q_proj, k_proj,
// v_proj, gate_proj, up_proj are row ranges of them (io maps names and ranges).
// Precision and hooks as GPT-2 (gpt2.h). Thread-safety: one thread drives a model.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/memory.h"
#include "zerone/kernels/types.h"
#include "zerone/nn/flat_param.h"
#include "zerone/nn/model.h"

namespace zerone::nn {

struct LlamaConfig {
  int num_layers = 16;        // L
  int channels = 2048;        // C (hidden_size)
  int num_heads = 32;         // NH
  int num_kv_heads = 8;       // NKV (num_key_value_heads), divides NH
  int head_dim = 64;          // hs (C / NH unless the config says otherwise)
  int ffn = 8192;             // F (intermediate_size)
  int vocab_size = 128256;    // V
  int max_seq_len = 131072;   // context length (max_position_embeddings)
  float rope_theta = 500000.0f;
  kernels::RopeScaling rope_scaling;  // factor 0: none
  float rms_norm_eps = 1e-5f;
  bool tie_word_embeddings = true;

  size_t num_parameters() const;
  std::string to_string() const;  // the spec string that parses back to this config
  bool operator==(const LlamaConfig& o) const;
};

// A preset ("tinyllama-1.1b", "llama-3.2-1b", "llama-2-7b", "llama-2-13b", "llama-3-8b") or
// "llama:layers=2,dim=64,heads=4,kv_heads=2,ffn=128,vocab=300,ctx=64" with optional
// head_dim, theta, eps, tied=0|1, and llama3 scaling rope_factor, rope_low, rope_high, rope_orig.
// Omitted keys take Llama-3.2-1B's values, except the rotary scaling: none unless rope_factor is
// given (to_string() writes it whenever there is one). Throws Error naming the bad part.
LlamaConfig parse_llama_spec(const std::string& spec);
bool is_llama_spec(const std::string& spec);

enum LlamaBlockTensor { kAttnNorm, kWqkv, kWo, kMlpNorm, kWGateUp, kWDown, kLlamaBlockTensors };
enum LlamaFinalTensor { kNorm, kLmHead };

class Llama : public UnitModel {
 public:
  Llama(const LlamaConfig& config, DType compute_dtype, size_t align_numel = 64, bool allocate = true);

  const LlamaConfig& config() const { return config_; }
  std::string spec() const override { return config_.to_string(); }
  size_t num_parameters() const override { return config_.num_parameters(); }
  int vocab_size() const override { return config_.vocab_size; }
  int max_seq_len() const override { return config_.max_seq_len; }

  // N(0, 0.02) for matrices and the embedding (Hugging Face's initializer_range), norm weights 1;
  // deterministic in (seed, unit, tensor, element), rounded to the compute dtype.
  void init_unit(int unit, uint64_t seed) override;

  // As GPT2::forward / backward (mean cross-entropy over B*T, gradients of grad_scale * loss).
  float forward(const int32_t* inputs, const int32_t* targets, int B, int T) override;
  void backward(float grad_scale) override;
  // (B,T,V) in the compute dtype (Note [Logits in the compute dtype], kernels/backend.h).
  const void* logits() const override { return acts_.logits.data(); }
  int logits_stride() const override { return config_.vocab_size; }
  DType logits_dtype() const override { return dtype_; }

  std::vector<int> units_touched(int u) const override {
    return u == num_units() - 1 && config_.tie_word_embeddings ? std::vector<int>{u, 0} : std::vector<int>{u};
  }
  // `att_saved`: what the device backend keeps of attention (Note [Attention's saved state]).
  static size_t activation_bytes(const LlamaConfig& config, DType dtype, int B, int T, bool checkpointing = false,
                                 bool saved_inputs_on_host = false,
                                 kernels::AttentionSaved att_saved = kernels::AttentionSaved::probabilities);
  size_t activation_bytes(int B, int T) const override {
    return activation_bytes(config_, dtype_, B, T, checkpointing_, saved_inputs_on_host(), attention_saved());
  }
  size_t host_activation_bytes(int B, int T) const override {
    return saved_inputs_numel(saved_inputs_on_host(), config_.num_layers, static_cast<size_t>(B) * T * config_.channels) * 4;
  }
  static std::vector<size_t> unit_numels(const LlamaConfig& config);

 protected:
  void count_scratch(kernels::ScratchCount& count, int B, int T) const override;

 private:
  struct Activations {
    int B = 0, T = 0;
    bool checkpointing = false, on_host = false;
    Buffer encoded, h1, rstd1, qkv, atty, att, residual2, h2, rstd2, gate_up, act, residual3, hf, rstdf, logits,
        losses, lse, tmp_c;
    Buffer dresidual, dbuf_c, datty, dqkv, dgate_up, dact;  // backward temporaries (dlogits are written over logits)
    // In a 16-bit run, dresidual and dqkv rounded by the ops that make them (Note [Gradients rounded
    // where they are made], kernels/backend.h); empty in f32.
    Buffer dresidual_rounded, dqkv_rounded;
    Buffer inputs, targets;
    Buffer inv_freq;  // (hs/2) the rotary frequencies, on the device
    Buffer saved;  // host copies of the saved block inputs (Note [CPU checkpointing])
  };
  void ensure_activations(int B, int T);
  // One block's activations: its input, internals (slot l, or slot 0 with checkpointing) and output.
  // h1, h2, act, qkv, atty and gate_up are in the compute dtype (dtype_; llama_activation_buffers
  // in llama.cc says why each).
  struct BlockActs {
    const float* residual;
    void *h1, *h2, *act, *qkv, *atty, *gate_up;  // in the compute dtype
    float *rstd1, *att, *residual2, *rstd2, *residual3;
  };
  BlockActs block_acts(int l);
  void block_forward(int l);
  const void* head() const { return config_.tie_word_embeddings ? p(0, 0) : p(num_units() - 1, kLmHead); }

  LlamaConfig config_;
  std::vector<float> inv_freq_;  // (hs/2) rotary frequencies, computed on the host (copied to Activations)
  Activations acts_;
  bool have_targets_ = false;
};

}  // namespace zerone::nn
