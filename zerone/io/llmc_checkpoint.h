// llm.c GPT-2 checkpoints (train_gpt2.c's format).
//
// Header: 256 int32 — [0] magic 20240326, [1] version (3: f32 parameters, 5: bf16 parameters),
// [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp. Then the 16 parameter tensors, each concatenated
// over layers: wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw,
// fcprojb, lnfw, lnfb. zerone's units hold the same tensors per layer; these functions scatter and
// gather between the two layouts and convert f32 <-> bf16 (RNE) as needed.
//
// Thread-safety: independent calls are safe; a model must not be in use while loaded into.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/nn/gpt2.h"

namespace zerone::io {

inline constexpr int32_t kLlmcCheckpointMagic = 20240326;

// Reads and validates the header (Error naming the path for a missing file, bad magic/version,
// inconsistent sizes or a truncated file). Returns the model shape it describes.
// `what` names the flag in messages ("--init").
nn::GPT2Config read_llmc_config(const std::string& path, const std::string& what = "");
// Loads parameters into `model`, whose config must equal the file's (Error otherwise; also for a
// NaN or infinite value, which only a corrupt file holds). With only_unit >= 0, loads that unit
// alone (its storage must be allocated); the rest are untouched.
void load_llmc_checkpoint(const std::string& path, nn::GPT2& model, int only_unit = -1);
// Writes `model`'s parameters as version 3 (f32) or 5 (bf16), atomically. `model` holds full
// parameters, or `load(u)` brings unit u in (in unit order; each unit's tensors are written at
// their offsets in llm.c's tensor-major order), so a converter holds one unit at a time.
void save_llmc_checkpoint(const std::string& path, const nn::GPT2& model, DType file_dtype,
                          const std::function<void(int unit)>& load = nullptr);

// The body of a checkpoint without the header: config.num_parameters() values of `dtype` in llm.c
// order. scatter copies them into the model's units (converting to its dtype); gather is the inverse.
void scatter_llmc_order(const void* values, DType dtype, nn::GPT2& model, int only_unit = -1);
void gather_llmc_order(const nn::GPT2& model, DType dtype, void* values);
// Same for f32 buffers laid out like `model`'s units (e.g. gradients): unit_buffers[u] points at
// unit u's flat buffer; writes num_parameters() floats in llm.c order into `out`.
void gather_llmc_order_f32(const nn::GPT2& model, const std::vector<const float*>& unit_buffers, float* out);

}  // namespace zerone::io
