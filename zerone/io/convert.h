// `zerone convert`: model weights from one format to another, streaming one unit at a time.
//
// Sources (detected and read by io/weight_source.h, as --init's): a zerone checkpoint (a step
// directory, or a --checkpoint-dir root with `latest`), an llm.c GPT-2 checkpoint file, a Hugging
// Face model directory (config.json + safetensors). Destinations: a Hugging Face directory (hf), an llm.c file (llmc: GPT-2 only, v3
// f32 or v5 bf16), or a weights-only zerone checkpoint directory (zerone; --init takes it).
//
// Note [Streaming conversion]: the model is built without storage; each unit is read from the
// source (converted to the destination dtype), written, and freed before the next, so peak memory
// is about one unit in the destination dtype plus one tensor of buffers, whatever the model size.
// From a zerone checkpoint of a bf16/fp16 run, --dtype f32 reads the f32 master weights, not the
// rounded parameters. Conversions that only move bytes (same dtype) are lossless both ways.
//
// Thread-safety: one conversion per call; nothing shared.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "zerone/io/fault_env.h"

namespace zerone::nn {
class Model;
}

namespace zerone::io {

struct ConvertOptions {
  std::string src, dst;
  std::string to;     // "hf", "llmc", "zerone"; empty: llmc when dst ends in ".bin", else hf
  std::string dtype;  // "fp32", "bf16", "fp16" (also f32/f16); empty: the source's
  // Called before each unit is read; throws to stop (a stop signal). The destination is then not
  // written and no temporary is left.
  std::function<void()> check_interrupt;
  // The test hooks (crash points of the zerone checkpoint writer, Note [Crash points]); the
  // program's main() passes FaultEnv::from_environment(). Default: injects nothing.
  FaultEnv fault_env;
};

struct ConvertResult {
  std::string source_kind, destination_kind;  // "zerone checkpoint", "llm.c checkpoint", "Hugging Face directory"
  std::string model_spec, dtype;
  uint64_t parameters = 0;
  std::string notice;  // how the source was read, when worth saying (a mistral read as LLaMA)
};

// Converts; the destination is written atomically (a file or a directory renamed into place).
// Throws Error naming the path for an undetectable source, an existing destination that would be
// replaced by something else, a model the destination format cannot hold, or any read/write failure.
ConvertResult convert_checkpoint(const ConvertOptions& options);

// Note [f16 range]: f16 holds magnitudes up to 65504; a larger weight rounds to infinity, which
// trains as a divergence and is refused when read back. Unit `u` of `model` was just loaded in
// f16: if it holds an infinity or NaN, `load` fills the same unit of an f32 copy of the model
// from the same source, and the first tensor beyond the range is named with its largest
// magnitude. Throws Error starting with `what` (e.g. "--init 'DIR'"). No cost unless a value overflowed.
void check_unit_fits_f16(const nn::Model& model, int u, const std::function<void(nn::Model&, int)>& load,
                         const std::string& what);

}  // namespace zerone::io
