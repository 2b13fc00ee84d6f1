// The final --save: the trained weights as a Hugging Face directory or an llm.c file, consolidated
// from every rank's shards one unit at a time (DeepSpeed's stage3_gather_16bit_weights_on_model_save).
//
// Note [Streaming save]: every rank walks the units in order, holding one unit's full parameters
// at a time (ZeroEngine::HeldUnit: stage 3 all-gathers a sharded unit, then releases it); rank 0
// writes each unit as it comes (the safetensors header is laid out from the shapes first, then the
// tensors follow in order; an llm.c file is written at each tensor's offset). No rank ever holds
// the whole model beyond what its stage keeps anyway: the shards, plus one unit. The files appear
// atomically (io/file.h); a failure on rank 0 ends the job (Note [Errors under MPI]) and leaves
// nothing half-written.
//
// Thread-safety: the training thread, between steps. Collective: every rank calls it.
#pragma once

#include <cstdint>
#include <string>

#include "zerone/io/hf_checkpoint.h"
#include "zerone/nn/model.h"
#include "zerone/zero/engine.h"

namespace zerone::train {

struct SavedWeights {
  // This rank's parameter memory (the ledger's "param" bytes on the device and the host) at its
  // largest during the save, and the whole model's parameters in the compute dtype.
  int64_t peak_param_bytes = 0;
  int64_t model_param_bytes = 0;
};

// Writes `model`'s weights to `path`: a Hugging Face directory when `hf` (with `extras`, Note
// [What an export carries] in io/hf_checkpoint.h), else an llm.c GPT-2 file (fp16 widens to f32,
// exactly: llm.c has no fp16 version). Only `lead` writes. Throws Error naming the path on a write
// failure (rank 0) or a failed collective.
SavedWeights save_weights(const std::string& path, bool hf, const io::HfSaveExtras& extras, nn::Model& model,
                          zero::ZeroEngine& engine, bool lead);

}  // namespace zerone::train
