#include "zerone/io/weight_source.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "zerone/core/error.h"
#include "zerone/io/file.h"
#include "zerone/io/hf_checkpoint.h"
#include "zerone/io/llmc_checkpoint.h"
#include "zerone/io/sharded_checkpoint.h"
#include "zerone/nn/gpt2.h"

namespace zerone::io {

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::hf_directory: return "Hugging Face directory";
    case WeightFormat::zerone_checkpoint: return "zerone checkpoint";
    case WeightFormat::llmc_checkpoint: return "llm.c checkpoint";
  }
  return "?";
}

WeightSource::WeightSource(const std::string& path, const std::string& what) : path_(path), what_(what) {
  if (is_hf_directory(path)) {
    format_ = WeightFormat::hf_directory;
    spec_ = read_hf_spec(path, &notice_);
    const auto config =
        nlohmann::json::parse(read_text_file(path + "/config.json", "config.json", 64 << 20), nullptr, false);
    if (config.is_object() && config.contains("torch_dtype") && config["torch_dtype"].is_string()) {
      const std::string t = config["torch_dtype"];
      if (t == "bfloat16") stored_dtype_ = DType::bf16;
      if (t == "float16") stored_dtype_ = DType::f16;
    }
    return;
  }
  if (is_directory(path)) {
    struct stat latest;
    ZERONE_CHECK(is_checkpoint_directory(path) || ::stat((path + "/latest").c_str(), &latest) == 0, what, " '", path,
                 "' is a directory, but neither a Hugging Face model directory (config.json) nor a zerone checkpoint ",
                 "(manifest.json, or a 'latest' pointer); ", what, " also takes an llm.c checkpoint file");
    format_ = WeightFormat::zerone_checkpoint;
    checkpoint_ = std::make_unique<CheckpointReader>(path);
    spec_ = checkpoint_->manifest().model;
    stored_dtype_ = checkpoint_->manifest().dtype;
    return;
  }
  // Anything else is read as an llm.c file; a path that does not exist is named there.
  format_ = WeightFormat::llmc_checkpoint;
  spec_ = read_llmc_config(path, what).to_string();
  size_t bytes = 0;
  FileDescriptor fd = open_regular_file(path, what, &bytes);
  int32_t head[2];
  read_exactly(fd.get(), head, sizeof head, 0, path);
  stored_dtype_ = head[1] == 3 ? DType::f32 : DType::bf16;
}

WeightSource::~WeightSource() = default;

std::string WeightSource::tokenizer_dir() const {
  if (format_ != WeightFormat::hf_directory) return "";
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (::access((path_ + "/" + name).c_str(), F_OK) == 0) return path_;
  return "";
}

void WeightSource::bind(const nn::Model& model) {
  switch (format_) {
    case WeightFormat::hf_directory:
      hf_ = std::make_unique<HfCheckpointReader>(path_, model);
      break;
    case WeightFormat::zerone_checkpoint:
      checkpoint_->check_layout(model);
      break;
    case WeightFormat::llmc_checkpoint: {
      const auto* gpt2 = dynamic_cast<const nn::GPT2*>(&model);
      ZERONE_CHECK(gpt2 != nullptr, what_, " '", path_, "' is an llm.c GPT-2 checkpoint, but the model is ", model.spec());
      const nn::GPT2Config held = read_llmc_config(path_, what_);
      ZERONE_CHECK(held == gpt2->config(), "checkpoint '", path_, "' holds model ", held.to_string(),
                   " but the run's model is ", gpt2->config().to_string());
      break;
    }
  }
  bound_ = true;
}

void WeightSource::load_unit(nn::Model& model, int u) const {
  ZERONE_ASSERT(bound_, "WeightSource::load_unit before bind()");
  const DType dtype = model.compute_dtype();
  nn::FlatParam& unit = model.units()[u];
  switch (format_) {
    case WeightFormat::hf_directory:
      hf_->load_unit(model, u);
      break;
    case WeightFormat::zerone_checkpoint: {
      // Note [Reading at another precision]: f32 from the f32 master weights where a bf16/fp16 run kept them.
      const bool master = dtype == DType::f32 && stored_dtype_ != DType::f32 && checkpoint_->has_tensor("master");
      checkpoint_->read(u, master ? "master" : "param", 0, unit.numel(), dtype, unit.data());
      break;
    }
    case WeightFormat::llmc_checkpoint:
      load_llmc_checkpoint(path_, dynamic_cast<nn::GPT2&>(model), u);
      break;
  }
}

void WeightSource::load(nn::Model& model) {
  bind(model);
  // Note [Materializing on a device] (nn/model.h): through host memory on a device the host cannot touch.
  for (int u = 0; u < model.num_units(); ++u) model.write_params_from_host(u, [&] { load_unit(model, u); });
}

}  // namespace zerone::io
