// Hugging Face model directories: config.json + model.safetensors (or a sharded set with its
// index), as transformers' GPT2LMHeadModel and LlamaForCausalLM store them, read and written for
// zerone's GPT-2 and LLaMA models.
//
// Note [Hugging Face tensor map]: each zerone tensor is one or more row ranges of Hugging Face
// tensors, possibly transposed:
//   GPT-2  transformer.wte.weight (V, C) = wte rows [0, V) (zerone pads the vocabulary to Vp; the
//          padded rows stay zero); transformer.wpe.weight; h.{l}.ln_1/ln_2/ln_f weight and bias;
//          attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj are Conv1D layers stored (in, out): the
//          transpose of zerone's (out, in) matrices. The head is tied (no lm_head tensor). Names are
//          read with or without the "transformer." prefix (GPT2Model files lack it); the causal-mask
//          buffers attn.bias / attn.masked_bias of old files are ignored.
//   LLaMA  model.embed_tokens.weight; layers.{l}.self_attn.{q,k,v}_proj.weight are the row ranges
//          [0, NH*hs), [NH*hs, (NH+NKV)*hs), [(NH+NKV)*hs, R) of zerone's fused wqkv (both use the
//          rotate-half RoPE convention, so no permutation); o_proj = wo; mlp.{gate,up}_proj are the
//          halves of w_gate_up; down_proj = w_down; input_layernorm / post_attention_layernorm /
//          model.norm; lm_head.weight unless tie_word_embeddings.
// Reading converts F32/BF16/F16 tensors to the model's dtype; writing stores the model's dtype, and
// config.json's torch_dtype says which.
//
// Thread-safety: independent calls are safe; a model must not be in use while loaded into.
#pragma once

#include <functional>

#include <memory>
#include <string>

#include "zerone/nn/model.h"

namespace zerone::io {

// Whether `path` is a Hugging Face model directory (holds config.json).
bool is_hf_directory(const std::string& path);

// The zerone model spec config.json describes (model_type gpt2 or llama). Throws Error naming the
// file and key for an unknown model_type, a missing or wrongly typed key, or a feature zerone
// does not implement (biases in LLaMA attention, a rope_scaling type other than llama3, ...).
// A model_type read as another (mistral without a sliding window is a LLaMA) sets `notice`.
std::string read_hf_spec(const std::string& dir, std::string* notice = nullptr);

// A Hugging Face directory opened for `model` (which must outlive it): the safetensors headers are
// parsed and checked against the model once — every tensor the model needs present with its exact
// shape, no tensor it does not use (except the causal-mask buffers), so that a checkpoint of
// another architecture is never half-loaded; Error naming the tensor otherwise. load_unit then
// reads only that unit's bytes, as the engine materializes it. One thread.
class HfCheckpointReader {
 public:
  HfCheckpointReader(const std::string& dir, const nn::Model& model);
  ~HfCheckpointReader();
  // Fills unit `u` of `model` (the one given to the constructor; its storage allocated).
  void load_unit(nn::Model& model, int u) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every unit (or only `only_unit`) of `model` from `dir`: an HfCheckpointReader used once.
void load_hf_checkpoint(const std::string& dir, nn::Model& model, int only_unit = -1);

// Makes unit u's parameters present in the model being saved (and may free others): streaming
// writers call it in unit order before reading a unit, so a converter holds one unit at a time.
using UnitLoader = std::function<void(int unit)>;

// What a saved directory carries beside the weights (Note [What an export carries]).
struct HfSaveExtras {
  // The Hugging Face directory the weights came from (--init, convert's source), or empty: its
  // tokenizer files are copied, its config's bos/eos token ids kept, and its generation_config.json
  // copied.
  std::string source_dir;
};

// Note [What an export carries]: as transformers' save_pretrained (with the tokenizer's), a saved
// directory holds config.json (bos_token_id / eos_token_id from the source's config, or GPT-2's
// <|endoftext|> 50256 for its 50257-token vocabulary), model.safetensors, generation_config.json
// (the source's, else {"_from_model_config": true} with the config's bos/eos ids), and the source's
// tokenizer files that exist (kHfTokenizerFiles), so that the directory samples and loads as it is.
extern const char* const kHfTokenizerFiles[];
extern const size_t kNumHfTokenizerFiles;

// Writes config.json, model.safetensors, generation_config.json and the tokenizer files into `dir`
// (created if missing; its parent must exist), each file atomically, in the layout transformers
// loads unchanged, in the model's dtype. `model` must hold full parameters, or `load` brings each
// unit in as it is reached (Note [Streaming save] in zero/engine.h). A directory this call created
// is removed again if it fails; Error names the file.
void save_hf_checkpoint(const std::string& dir, const nn::Model& model, const UnitLoader& load = nullptr,
                        const HfSaveExtras& extras = {});

// Start-up check of a --save directory: the parent exists and is writable, and `dir` is a
// directory or does not exist yet.
void check_hf_output(const std::string& dir, const std::string& what);

}  // namespace zerone::io
