#include "zerone/io/convert.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include <nlohmann/json.hpp>

#include "zerone/core/error.h"
#include "zerone/io/file.h"
#include "zerone/io/hf_checkpoint.h"
#include "zerone/io/llmc_checkpoint.h"
#include "zerone/io/sharded_checkpoint.h"
#include "zerone/io/weight_source.h"
#include "zerone/nn/gpt2.h"
#include "zerone/nn/llama.h"
#include "zerone/nn/model.h"

namespace zerone::io {
namespace {

std::string strip_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

const char* kind_name(const std::string& to) {
  return weight_format_name(to == "hf" ? WeightFormat::hf_directory : to == "llmc" ? WeightFormat::llmc_checkpoint
                                                                                   : WeightFormat::zerone_checkpoint);
}

}  // namespace

void check_unit_fits_f16(const nn::Model& model, int u, const std::function<void(nn::Model&, int)>& load,
                         const std::string& what) {
  const nn::FlatParam& unit = model.units()[u];
  if (unit.dtype() != DType::f16) return;
  const auto* bits = static_cast<const uint16_t*>(unit.data());
  bool overflowed = false;
  for (size_t i = 0; i < unit.numel() && !overflowed; ++i) overflowed = (bits[i] & 0x7c00) == 0x7c00;
  if (!overflowed) return;
  std::unique_ptr<nn::Model> wide = nn::make_model(model.spec(), DType::f32, 64, /*allocate=*/false);
  nn::FlatParam& wide_unit = wide->units()[u];
  wide_unit.allocate_params();
  load(*wide, u);
  for (size_t t = 0; t < wide_unit.tensors().size(); ++t) {
    const nn::TensorSpec& spec = wide_unit.tensors()[t];
    const float* x = static_cast<const float*>(wide_unit.param(t));
    double largest = 0.0;
    for (size_t i = 0; i < spec.numel(); ++i) largest = std::max(largest, static_cast<double>(std::fabs(x[i])));
    ZERONE_CHECK(largest < 65520.0, what, ": tensor ", spec.name, " of unit ", unit.name(), " holds values up to ",
                 largest, " in magnitude, beyond the f16 range (largest 65504): use bf16 or f32");
  }
  throw Error(str_cat(what, ": unit ", unit.name(), " holds non-finite values (the source is corrupt)"));
}

ConvertResult convert_checkpoint(const ConvertOptions& o) {
  std::string to = o.to;
  const std::string dst = strip_slashes(o.dst);
  if (to.empty()) to = dst.size() > 4 && dst.compare(dst.size() - 4, 4, ".bin") == 0 ? "llmc" : "hf";
  ZERONE_CHECK(to == "hf" || to == "llmc" || to == "zerone", "convert: --to '", to, "': expected hf, llmc or zerone");
  WeightSource source(o.src, "convert");
  const DType dtype = o.dtype.empty() ? source.stored_dtype() : parse_dtype(o.dtype);
  std::unique_ptr<nn::Model> model = nn::make_model(source.spec(), dtype, 64, /*allocate=*/false);
  ZERONE_CHECK(to != "llmc" || dynamic_cast<nn::GPT2*>(model.get()) != nullptr, "convert: '", o.src, "' holds ",
               model->spec(), ", which an llm.c checkpoint (GPT-2 only) cannot hold: use --to hf or --to zerone");
  // Hugging Face tensor names exist for the transformers only (the image classifiers of
  // nn/sequential.h have none).
  ZERONE_CHECK(to != "hf" || dynamic_cast<nn::GPT2*>(model.get()) != nullptr || dynamic_cast<nn::Llama*>(model.get()) != nullptr,
               "convert: '", o.src, "' holds ", model->spec(),
               ", which a Hugging Face directory (GPT-2 or LLaMA) cannot hold: use --to zerone");
  ZERONE_CHECK(to != "llmc" || dtype != DType::f16, "convert: llm.c checkpoints hold fp32 or bf16: use --dtype fp32 or bf16");
  ZERONE_CHECK(!same_file(o.src, dst) && !same_file(strip_slashes(o.src), dst), "convert: the destination '", o.dst,
               "' is the source");

  // Opened and checked once (Note [Streaming conversion]); each unit then reads only its own bytes.
  source.bind(*model);
  const auto load = [&source](nn::Model& m, int u) { source.load_unit(m, u); };
  int resident = -1;
  auto load_unit = [&](int u) {
    if (resident == u) return;
    if (o.check_interrupt) o.check_interrupt();
    if (resident >= 0) model->units()[resident].release_params();
    model->units()[u].allocate_params();
    load(*model, u);
    check_unit_fits_f16(*model, u, load, str_cat("convert: '", o.src, "'"));
    resident = u;
  };

  // Temporaries of conversions (and atomic writes) that were killed (Note [Stale temporaries]).
  {
    const size_t slash = dst.rfind('/');
    const std::string parent = slash == std::string::npos ? "." : dst.substr(0, std::max<size_t>(slash, 1));
    remove_stale_temporaries(parent, slash == std::string::npos ? dst : dst.substr(slash + 1));
    if (to == "hf" && is_directory(dst))
      for (const char* name : {"model.safetensors", "config.json"}) remove_stale_temporaries(dst, name);
  }
  if (to == "hf") {
    check_hf_output(dst, "convert destination");
    HfSaveExtras extras;  // Note [What an export carries]
    if (source.format() == WeightFormat::hf_directory) extras.source_dir = o.src;
    save_hf_checkpoint(dst, *model, load_unit, extras);
  } else if (to == "llmc") {
    check_atomic_output(dst, "convert destination");
    save_llmc_checkpoint(dst, dynamic_cast<const nn::GPT2&>(*model), dtype, load_unit);
  } else {
    // A weights-only checkpoint directory, written beside its final name and renamed into place.
    struct stat st;
    ZERONE_CHECK(::lstat(dst.c_str(), &st) != 0, "convert: the destination '", dst,
                 "' exists; a zerone checkpoint is written as a new directory");
    const std::string tmp = str_cat(dst, ".tmp.", ::getpid());
    remove_tree(tmp);
    ZERONE_CHECK(::mkdir(tmp.c_str(), 0755) == 0, "convert: cannot create '", tmp, "': ", std::strerror(errno));
    try {
      CheckpointManifest m;
      m.model = model->spec();
      m.dtype = dtype;
      m.units = checkpoint_units(*model);
      CheckpointFileWriter writer(tmp, "rank-00000.bin", 0, o.fault_env);
      for (int u = 0; u < model->num_units(); ++u) {
        load_unit(u);
        writer.append(u, "param", dtype, 0, model->units()[u].numel(), model->units()[u].data());
      }
      m.files.push_back(writer.finish());
      const std::string text = manifest_to_json(m).dump(1) + "\n";
      write_file_atomically(tmp + "/manifest.json", [&](std::FILE* f) { write_all(f, text.data(), text.size(), tmp); });
      ZERONE_CHECK(::rename(tmp.c_str(), dst.c_str()) == 0, "convert: cannot rename '", tmp, "' to '", dst, "': ",
                   std::strerror(errno));
    } catch (...) {
      remove_tree(tmp);
      throw;
    }
  }
  ConvertResult r;
  r.notice = source.notice();
  r.source_kind = source.format_name();
  r.destination_kind = kind_name(to);
  r.model_spec = model->spec();
  r.dtype = dtype_name(dtype);
  r.parameters = model->num_parameters();
  return r;
}

}  // namespace zerone::io
