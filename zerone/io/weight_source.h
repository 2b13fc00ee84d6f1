// A weight source: what `--init` (train, sample) and `zerone convert`'s source is, and how unit u
// of a model is loaded from it. One place detects the format and reads it, for every command.
//
// Formats (detected in this order):
//   Hugging Face directory  a directory with config.json and model.safetensors, or a sharded set
//                           with model.safetensors.index.json (hf_checkpoint.h); its config.json
//                           gives the model (GPT-2 or LLaMA), torch_dtype the stored dtype.
//   zerone checkpoint       a checkpoint directory (manifest.json), or a --checkpoint-dir root with
//                           a `latest` pointer (sharded_checkpoint.h): a training checkpoint or a
//                           weights-only one from `zerone convert --to zerone`. Only its "param"
//                           tensor (or "master", below) is read: it gives weights, never a resume.
//   llm.c checkpoint        any other path: a GPT-2 file in train_gpt2.c's format (v3 f32, v5 bf16).
//
// Note [Reading at another precision]: each unit is converted to the dtype of the model it is
// loaded into. A zerone checkpoint of a bf16/fp16 run also holds the f32 master weights; an f32
// model is filled from those rather than from the rounded parameters, so that `convert --dtype
// f32` and an f32 run started from the checkpoint lose nothing.
//
// Ownership: a WeightSource owns its open files (the checkpoint reader, the safetensors headers);
// the model given to bind() must outlive it. Thread-safety: one thread; load_unit may be called
// in any order and any number of times. Failure: every function throws Error naming the path (and
// `what`, the flag or command it came from) for an unreadable, malformed or mismatched source;
// nothing is partly loaded into a unit without an Error.
#pragma once

#include <memory>
#include <string>

#include "zerone/core/dtype.h"
#include "zerone/nn/model.h"

namespace zerone::io {

class CheckpointReader;
class HfCheckpointReader;

enum class WeightFormat { hf_directory, zerone_checkpoint, llmc_checkpoint };
// "Hugging Face directory", "zerone checkpoint", "llm.c checkpoint".
const char* weight_format_name(WeightFormat format);

class WeightSource {
 public:
  // Detects and opens `path` (headers, config.json or the manifest are read; no weights).
  // `what` names it in messages ("--init", "convert"). Throws Error for a path that does not exist,
  // a directory that is neither a Hugging Face directory nor a zerone checkpoint, or a malformed
  // header / config / manifest.
  WeightSource(const std::string& path, const std::string& what);
  ~WeightSource();
  WeightSource(const WeightSource&) = delete;
  WeightSource& operator=(const WeightSource&) = delete;

  WeightFormat format() const { return format_; }
  const char* format_name() const { return weight_format_name(format_); }
  const std::string& path() const { return path_; }
  // The model spec the source describes, as stored (a zerone manifest may spell it as a preset:
  // canonicalize with nn::make_model(spec())->spec()).
  const std::string& spec() const { return spec_; }
  // The dtype the weights are stored in (a Hugging Face directory's torch_dtype, f32 if absent).
  DType stored_dtype() const { return stored_dtype_; }
  // How the source was read, when worth saying (a mistral read as LLaMA); empty otherwise.
  const std::string& notice() const { return notice_; }
  // The zerone checkpoint's reader (for checks of its manifest), or nullptr for other formats.
  const CheckpointReader* checkpoint() const { return checkpoint_.get(); }
  // The directory holding the tokenizer that came with the weights (a Hugging Face directory with
  // tokenizer.json or tokenizer.model), or empty.
  std::string tokenizer_dir() const;

  // Checks the source against `model` (the shape every later load_unit fills) once: a zerone
  // manifest's units, every Hugging Face tensor present with its exact shape and none extra, an
  // llm.c header equal to the model's config. `model` must outlive this source. Throws Error
  // naming the first mismatch.
  void bind(const nn::Model& model);
  // Fills unit `u` of `model` (shaped as the bound model, in any dtype, its storage allocated),
  // converting to its dtype (Note [Reading at another precision]). bind() must have been called.
  void load_unit(nn::Model& model, int u) const;
  // bind(model), then every unit, on the model's device (through host memory where the host
  // cannot address it: nn::Model::write_params_from_host).
  void load(nn::Model& model);

 private:
  WeightFormat format_ = WeightFormat::llmc_checkpoint;
  std::string path_, what_, spec_, notice_;
  DType stored_dtype_ = DType::f32;
  std::unique_ptr<CheckpointReader> checkpoint_;
  std::unique_ptr<HfCheckpointReader> hf_;
  bool bound_ = false;
};

}  // namespace zerone::io
