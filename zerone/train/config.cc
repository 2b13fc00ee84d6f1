#include "zerone/train/config.h"

#include "zerone/comm/comm_choice.h"
#include "zerone/kernels/backend.h"

#include <cmath>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <functional>
#include <variant>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/io/file.h"
#include "zerone/train/lr_schedule.h"
#include "zerone/train/settings.h"

namespace zerone::train {

using json = nlohmann::json;

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The allowed values of each setting, shared by validate() (flags) and the JSON reader (keys), so
// that a value out of range is refused the same way whichever way it came.
struct IntRange {
  int64_t lo, hi;
  std::string text() const {
    return hi == std::numeric_limits<int64_t>::max() ? str_cat("an integer >= ", lo) : str_cat("an integer in ", lo, "..", hi);
  }
};
struct FloatRange {
  double lo, hi;
  bool lo_open, hi_open;
  static FloatRange of(const Setting& s) { return {s.lo, s.hi, s.lo_open, s.hi_open}; }
  bool contains(double x) const {
    return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
  std::string text() const {
    if (std::isinf(hi)) return str_cat("a number ", lo_open ? "> " : ">= ", lo);
    return str_cat("a number in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]");
  }
};
// Note [DeepSpeed config keys]: every key of a config file is honoured (it sets a zerone setting),
// accepted and listed in one notice (it only tunes something zerone does not have and cannot
// change results), or refused with an error naming it (it would change results or the memory the
// user relies on, and zerone does not implement it yet; or it is unknown). The table "DeepSpeed config
// keys" in docs/CONFIG.md is the user-facing copy of these lists.

// The treatment of every key of DeepSpeed's documented config (docs/_pages/config-json.md and the
// config classes it points to), by dotted path; the reader below implements it, and
// deepspeed_keys() publishes it (docs/CONFIG.md's table, tests/train/config_test.cc).
const std::vector<DeepSpeedKey> kDeepSpeedKeys = [] {
  using K = DeepSpeedKeyTreatment;
  std::vector<DeepSpeedKey> t;
  auto add = [&](K k, std::initializer_list<const char*> paths) {
    for (const char* p : paths) t.push_back({p, k});
  };
  add(K::honoured, {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                    "gradient_clipping", "optimizer", "optimizer.type", "optimizer.params", "scheduler", "scheduler.type",
                    "scheduler.params", "fp16", "fp16.enabled", "fp16.loss_scale", "fp16.initial_scale_power",
                    "fp16.loss_scale_window", "fp16.hysteresis", "fp16.min_loss_scale", "bf16", "bf16.enabled",
                    "bfloat16", "bfloat16.enabled", "zero_optimization", "zero_optimization.stage",
                    "zero_optimization.reduce_bucket_size", "zero_optimization.allgather_bucket_size",
                    "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.prefetch_bucket_size",
                    "zero_optimization.stage3_param_persistence_threshold",
                    "zero_optimization.param_persistence_threshold", "zero_optimization.sub_group_size",
                    "zero_optimization.offload_optimizer", "zero_optimization.offload_optimizer.device",
                    "zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_optimizer.buffer_count",
                    "zero_optimization.offload_optimizer.pin_memory", "zero_optimization.offload_optimizer.pipeline",
                    "zero_optimization.offload_optimizer.pipeline_read",
                    "zero_optimization.offload_optimizer.pipeline_write", "zero_optimization.offload_optimizer.ratio",
                    "zero_optimization.offload_param", "zero_optimization.offload_param.device",
                    "zero_optimization.offload_param.nvme_path", "zero_optimization.offload_param.pin_memory",
                    "zero_optimization.cpu_offload", "zero_optimization.cpu_offload_params", "aio", "aio.block_size",
                    "aio.queue_depth", "aio.thread_count", "aio.intra_op_parallelism", "aio.single_submit",
                    "aio.overlap_events", "activation_checkpointing", "activation_checkpointing.cpu_checkpointing",
                    "checkpoint", "tensorboard", "tensorboard.enabled", "tensorboard.output_path",
                    "tensorboard.job_name", "csv_monitor", "csv_monitor.enabled", "csv_monitor.output_path",
                    "csv_monitor.job_name", "communication_data_type", "data_types", "data_types.grad_accum_dtype",
                    "zero_optimization.zero_hpz_partition_size", "zero_optimization.zero_quantized_weights",
                    "zero_optimization.zero_quantized_gradients",
                    // Note [Streaming save] (zero/engine.h): --save gathers one unit at a time.
                    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                    "zero_optimization.gather_16bit_weights_on_model_save",
                    "zero_optimization.stage3_gather_fp16_weights_on_model_save"});
  // Tune machinery zerone does not have (logging, profiling, caches, buffers, checkpoint engines):
  // accepted and listed in one notice, whatever the value.
  add(K::notice, {"steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state", "comment",
                  "prescale_gradients", "gradient_predivide_factor", "zero_allow_untested_optimizer",
                  "zero_force_ds_cpu_optimizer", "flops_profiler", "comms_logger", "monitor_config", "compile", "timers",
                  "nebula", "eigenvalue", "pipeline", "dataloader_drop_last", "sparse_gradients", "legacy_fusion",
                  "seq_parallel_communication_data_type", "disable_allgather", "fp32_allreduce", "graph_harvesting",
                  "use_data_before_expert_parallelism", "fp16.auto_cast", "bf16.immediate_grad_update",
                  "bf16.check_grad_overflow", "bfloat16.immediate_grad_update", "bfloat16.check_grad_overflow",
                  "zero_optimization.round_robin_gradients", "zero_optimization.stage3_max_live_parameters",
                  "zero_optimization.max_live_parameters", "zero_optimization.stage3_max_reuse_distance",
                  "zero_optimization.max_reuse_distance", "zero_optimization.elastic_checkpoint",
                  "zero_optimization.ignore_unused_parameters", "zero_optimization.legacy_stage1",
                  "zero_optimization.memory_efficient_linear", "zero_optimization.use_multi_rank_bucket_allreduce",
                  "zero_optimization.cpu_offload_use_pin_memory", "zero_optimization.log_trace_cache_warnings",
                  "zero_optimization.stage3_module_granularity_threshold",
                  "zero_optimization.module_granularity_threshold", "zero_optimization.use_all_reduce_for_fetch_params",
                  "zero_optimization.stage3_model_persistence_threshold", "zero_optimization.model_persistence_threshold",
                  "zero_optimization.pipeline_loading_checkpoint",
                  "zero_optimization.override_module_apply", "zero_optimization.mics_hierarchical_params_gather",
                  "zero_optimization.offload_optimizer.fast_init", "zero_optimization.offload_optimizer.super_offload",
                  "zero_optimization.offload_optimizer.cpuadam_cores_perc",
                  "zero_optimization.offload_param.buffer_count", "zero_optimization.offload_param.buffer_size",
                  "zero_optimization.offload_param.max_in_cpu", "activation_checkpointing.partition_activations",
                  "activation_checkpointing.contiguous_memory_optimization", "activation_checkpointing.number_checkpoints",
                  "activation_checkpointing.synchronize_checkpoint_boundary", "activation_checkpointing.profile",
                  "checkpoint.tag_validation", "checkpoint.load_universal", "checkpoint.use_node_local_storage",
                  "checkpoint.parallel_write"});
  // zerone always does this: true is honoured, false only costs speed in DeepSpeed (a notice).
  add(K::always_on, {"zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients",
                     "zero_optimization.reduce_scatter", "zero_optimization.allgather_partitions",
                     "zero_optimization.grad_hooks", "zero_optimization.load_from_fp32_weights"});
  // Capabilities zerone lacks that change results: off (or disabled) is a notice, on is an error.
  add(K::error_when_on, {"elasticity", "amp", "curriculum_learning", "data_efficiency", "autotuning",
                         "progressive_layer_drop", "quantize_training", "hybrid_engine", "compression_training",
                         "torch_autocast", "wandb", "comet", "zero_optimization.zero_quantized_nontrainable_weights",
                         "zero_optimization.mics_shard_size",
                         "fp16.consecutive_hysteresis", "fp16.fp16_master_weights_and_grads",
                         "bf16.bf16_master_weights_and_grads", "bf16.bf16_optimizer_states",
                         "bfloat16.bf16_master_weights_and_grads", "bfloat16.bf16_optimizer_states", "aio.use_gds"});
  add(K::error, {"sparse_attention"});
  return t;
}();

DeepSpeedKeyTreatment treatment_of(const std::string& path) {
  for (const DeepSpeedKey& k : kDeepSpeedKeys)
    if (k.path == path) return k.treatment;
  return DeepSpeedKeyTreatment::unknown;
}
bool is_notice_key(const std::string& path) { return treatment_of(path) == DeepSpeedKeyTreatment::notice; }

const std::vector<std::string>& deepspeed_key_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const DeepSpeedKey& k : kDeepSpeedKeys) n.push_back(k.path);
    return n;
  }();
  return names;
}

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// Reads one config file into a TrainConfig: typed, range-checked values; "auto" leaves a setting
// alone; a flag given on the command line wins.
class ConfigReader {
 public:
  ConfigReader(const std::string& path, TrainConfig& cfg) : path_(path), cfg_(cfg), on_command_line_(cfg.given) {}

  void read(const json& root);

 private:
  [[noreturn]] void fail(const std::string& key, const json& v, const std::string& expected) const {
    throw Error(str_cat("config '", path_, "': key '", key, "' is ", v.dump(), ", expected ", expected));
  }
  [[noreturn]] void fail_text(const std::string& key, const std::string& text) const {
    throw Error(str_cat("config '", path_, "': key '", key, "' ", text));
  }
  [[noreturn]] void not_implemented(const std::string& key, const json& v, const std::string& what) const {
    fail_text(key, str_cat("is ", v.dump(), ": ", what, " is not implemented in zerone yet"));
  }

  // Whether the file sets `flag` (the command line did not); records that it did, through `key`.
  bool claim(const std::string& flag, const std::string& key) {
    if (on_command_line_.count(flag)) return false;
    cfg_.given.insert(flag);
    cfg_.config_keys[flag] = key;
    return true;
  }
  void no_effect(const std::string& key) { no_effect_.push_back(key); }

  int64_t integer(const json& v, const std::string& key, IntRange r) const {
    const std::string expected = r.text();
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(r.hi) || static_cast<int64_t>(u) < r.lo) fail(key, v, expected);
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) {
      int64_t x = v.get<int64_t>();
      if (x < r.lo || x > r.hi) fail(key, v, expected);
      return x;
    }
    if (v.is_number_float()) {  // 5e8 is an integer in DeepSpeed's configs; 2.7 is not
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e18 && d >= static_cast<double>(r.lo) &&
          d <= static_cast<double>(r.hi))
        return static_cast<int64_t>(d);
    }
    fail(key, v, expected);
  }
  double number(const json& v, const std::string& key, const FloatRange& r) const {
    if (!v.is_number() || !r.contains(v.get<double>())) fail(key, v, r.text());
    return v.get<double>();
  }
  bool boolean(const json& v, const std::string& key) const {
    if (!v.is_boolean()) fail(key, v, "true or false");
    return v.get<bool>();
  }
  std::string text(const json& v, const std::string& key) const {
    if (!v.is_string()) fail(key, v, "a string");
    return v.get<std::string>();
  }
  const json& object(const json& v, const std::string& key) const {
    if (!v.is_object()) fail(key, v, "an object");
    return v;
  }

  static const Setting& setting(const std::string& flag) {
    const Setting* s = find_setting(flag);
    ZERONE_ASSERT(s != nullptr, "no settings row for ", flag);
    return *s;
  }
  static IntRange range_of(const Setting& s) {
    return {static_cast<int64_t>(s.lo), s.hi >= 9e18 ? kInt64Max : static_cast<int64_t>(s.hi)};
  }
  // Sets the setting whose table row names `key` (zerone's key or a DeepSpeed alias), by the row's
  // type. Returns false when no row names it.
  bool set_by_key(const json& v, const std::string& key) {
    const Setting* s = find_setting_by_key(key);
    if (s == nullptr) return false;
    std::visit([&](auto member) { set_field(v, key, *s, cfg_.*member); }, s->field);
    return true;
  }
  template <typename F>
  void set_field(const json& v, const std::string& key, const Setting& s, F& field) {
    if constexpr (std::is_same_v<F, std::string>) {
      set_string(v, key, s.flag, field);
    } else if constexpr (std::is_same_v<F, bool>) {
      set_bool(v, key, s.flag, field);
    } else if constexpr (std::is_same_v<F, uint64_t>) {
      if (!v.is_number_unsigned()) fail(key, v, "an integer in 0..18446744073709551615");
      const uint64_t x = v.get<uint64_t>();
      if (claim(s.flag, key)) field = x;
    } else if constexpr (std::is_integral_v<F>) {
      set_int(v, key, s.flag, field);
    } else {
      set_number(v, key, s.flag, field);
    }
  }
  // "key 'X' is unknown", with the nearest real key when one is close.
  [[noreturn]] void unknown(const std::string& key, const std::string& expected = "") const {
    std::string text = "is unknown";
    if (!expected.empty()) text += str_cat(" (expected ", expected, ")");
    if (std::string near = nearest_setting_key(key, deepspeed_key_names()); !near.empty() && near != key)
      text += str_cat("; did you mean '", near, "'?");
    fail_text(key, text);
  }

  // Typed setters: "auto" leaves the setting to its flag or default; the value is checked even
  // when the command line wins, so a broken file is always reported.
  template <typename T>
  void set_int(const json& v, const std::string& key, const std::string& flag, T& field) {
    const Setting& s = setting(flag);
    if (s.multiple_of > 0 && !is_auto(v) && integer(v, key, range_of(s)) % s.multiple_of != 0)
      fail(key, v, range_text(s));
    set_int_in(v, key, flag, field, range_of(s));
  }
  template <typename T>
  void set_int_in(const json& v, const std::string& key, const std::string& flag, T& field, IntRange r) {
    if (is_auto(v)) return;
    int64_t x = integer(v, key, r);
    if (claim(flag, key)) field = static_cast<T>(x);
  }
  template <typename T>
  void set_number(const json& v, const std::string& key, const std::string& flag, T& field) {
    if (is_auto(v)) return;
    double x = number(v, key, FloatRange::of(setting(flag)));
    if (claim(flag, key)) field = static_cast<T>(x);
  }
  void set_string(const json& v, const std::string& key, const std::string& flag, std::string& field) {
    const Setting& s = setting(flag);
    if (s.type == SettingType::choice && is_auto(v)) return;
    std::string x = text(v, key);
    if (s.type == SettingType::choice && std::find(s.choices.begin(), s.choices.end(), x) == s.choices.end()) {
      std::string quoted;
      for (size_t i = 0; i < s.choices.size(); ++i)
        quoted += str_cat(i == 0 ? "" : i + 1 == s.choices.size() ? " or " : ", ", "\"", s.choices[i], "\"");
      fail(key, v, quoted);
    }
    if (claim(flag, key)) field = x;
  }
  void set_bool(const json& v, const std::string& key, const std::string& flag, bool& field) {
    if (is_auto(v)) return;
    bool x = boolean(v, key);
    if (claim(flag, key)) field = x;
  }

  // An "enabled" switch: nullopt for "auto" (from the flag or default).
  std::optional<bool> enabled_switch(const json& block, const std::string& key) {
    if (!block.contains("enabled")) return false;  // DeepSpeed's default for every block
    const json& e = block["enabled"];
    if (is_auto(e)) return std::nullopt;
    return boolean(e, key + ".enabled");
  }

  void read_precision_block(const std::string& key, const json& v);
  void read_optimizer(const json& v);
  void read_sgd(const json& params);  // optimizer.params of type SGD
  void read_scheduler(const json& v);
  void read_zero(const json& v);
  // zero_optimization.offload_optimizer / offload_param and the top-level aio block (issue 8).
  void read_offload(const std::string& key, const json& v);
  // "checkpoint": zerone's dir/every/keep_last/async/resume and DeepSpeed's own keys.
  void read_checkpoint(const json& v);
  // "tensorboard" / "csv_monitor": DeepSpeed's {enabled, output_path, job_name}; the directory is
  // output_path/job_name (job_name "DeepSpeedJobName" by default, as DeepSpeed's).
  void read_monitor(const std::string& key, const json& v) {
    std::optional<bool> on = false;
    std::string output_path, job_name = "DeepSpeedJobName";
    for (auto& [mk, mv] : object(v, key).items()) {
      const std::string full = key + "." + mk;
      if (mk == "enabled") on = is_auto(mv) ? std::optional<bool>(false) : std::optional<bool>(boolean(mv, full));
      else if (mk == "output_path") output_path = text(mv, full);
      else if (mk == "job_name") job_name = text(mv, full);
      else fail_text(full, "is unknown (expected enabled, output_path, job_name)");
    }
    if (!on.value_or(false)) return;
    if (job_name.empty()) fail_text(key + ".job_name", "is empty: it names the directory under output_path");
    const std::string dir = output_path.empty() ? job_name : output_path + (output_path.back() == '/' ? "" : "/") + job_name;
    const std::string flag = key == "tensorboard" ? "--tensorboard" : "--csv-monitor";
    if (claim(flag, key)) (key == "tensorboard" ? cfg_.tensorboard_dir : cfg_.csv_monitor_dir) = dir;
  }
  void resolve_precision();

  const std::string path_;
  TrainConfig& cfg_;
  const std::set<std::string> on_command_line_;
  std::vector<std::string> no_effect_;
  // Precision as the file states it: nullopt = not stated (absent or "auto").
  std::optional<bool> bf16_, fp16_;
  std::string bf16_key_;  // "bf16" or "bfloat16"
  std::optional<std::string> precision_key_;
};

void ConfigReader::read(const json& root) {
  if (!root.is_object()) throw Error(str_cat("config '", path_, "': expected a JSON object at the top level"));
  for (auto& [key, v] : root.items()) {
    // train_batch_size 0 means "derived" on the command line only.
    if (key == "train_batch_size") set_int_in(v, key, "--train-batch-size", cfg_.train_batch_size, {1, kInt32Max});
    else if (key == "precision") {
      precision_key_ = text(v, key);
    } else if (key == "optimizer" && v.is_string()) set_by_key(v, key);  // zerone's --optimizer
    else if (key == "activation_checkpointing" && !v.is_object()) set_by_key(v, key);  // zerone's flag
    else if (key == "bf16" || key == "bfloat16" || key == "fp16") read_precision_block(key, v);
    else if (key == "optimizer") read_optimizer(v);
    else if (key == "zero_optimization") read_zero(v);
    else if (key == "aio") read_offload(key, v);
    else if (key == "checkpoint") read_checkpoint(v);
    else if (key == "scheduler") continue;  // after the optimizer, whose lr it may replace
    else if (key == "activation_checkpointing") {
      // The block turns checkpointing on, as Megatron-DeepSpeed's --checkpoint-activations does
      // with it; zerone checkpoints every block (DeepSpeed's checkpoint per layer).
      if (claim("--activation-checkpointing", key)) cfg_.activation_checkpointing = true;
      for (auto& [ak, av] : object(v, key).items()) {
        const std::string full = "activation_checkpointing." + ak;
        if (ak == "partition_activations") {
          if (boolean(av, full)) no_effect(full + " (it partitions across model-parallel ranks; zerone has none)");
        } else if (ak == "cpu_checkpointing") {
          if (boolean(av, full) && claim("--cpu-checkpointing", full)) cfg_.cpu_checkpointing = true;
        } else if (ak == "contiguous_memory_optimization" || ak == "synchronize_checkpoint_boundary" || ak == "profile") {
          boolean(av, full);
          no_effect(full);
        } else if (ak == "number_checkpoints") {
          if (!av.is_null()) integer(av, full, IntRange{1, kInt32Max});
          no_effect(full + " (zerone checkpoints every block)");
        } else {
          fail_text(full, "is unknown (expected partition_activations, cpu_checkpointing, contiguous_memory_optimization, "
                          "number_checkpoints, synchronize_checkpoint_boundary, profile)");
        }
      }
    } else if (key == "communication_data_type") {
      // zerone reduces gradients in f32.
      if (!v.is_null() && !(v.is_string() && (v == "fp32" || v == "float32")))
        not_implemented(key, v, "communication in a precision other than fp32");
    } else if (key == "data_types") {
      for (auto& [dk, dv] : object(v, key).items()) {
        std::string full = "data_types." + dk;
        if (dk != "grad_accum_dtype") fail_text(full, "is unknown (expected grad_accum_dtype)");
        // zerone accumulates gradients in f32.
        if (!dv.is_null() && !(dv.is_string() && (dv == "fp32" || dv == "float32")))
          not_implemented(full, dv, "gradient accumulation in a precision other than fp32");
      }
    } else if (treatment_of(key) == DeepSpeedKeyTreatment::error_when_on && key != "wandb" && key != "comet") {
      std::optional<bool> on = v.is_object() ? enabled_switch(v, key) : std::optional<bool>(boolean(v, key));
      if (on.value_or(false)) not_implemented(key + ".enabled", true, key);
      no_effect(key);
    } else if (key == "sparse_attention") {
      not_implemented(key, v, "sparse attention");
    } else if (key == "tensorboard" || key == "csv_monitor") {
      read_monitor(key, v);
    } else if (key == "wandb" || key == "comet") {
      // Both log to a hosted service through its Python client; zerone has neither.
      for (auto& [mk, mv] : object(v, key).items())
        if (mk == "enabled" && boolean(mv, key + ".enabled"))
          fail_text(key + ".enabled", str_cat("is true: zerone cannot log to ", key == "wandb" ? "Weights & Biases" : "Comet",
                                              " (its client is a Python library talking to a service); use \"tensorboard\" or "
                                              "\"csv_monitor\" (--tensorboard DIR, --csv-monitor DIR), whose files it can import"));
    } else if (is_notice_key(key)) {
      no_effect(key);
    } else if (!set_by_key(v, key)) {
      unknown(key);
    }
  }
  if (root.contains("scheduler")) read_scheduler(root["scheduler"]);
  resolve_precision();
  if (!no_effect_.empty()) {
    std::string list;
    for (const std::string& k : no_effect_) list += (list.empty() ? "" : ", ") + k;
    cfg_.notices.push_back(str_cat("config keys with no effect here: ", list));
  }
}

void ConfigReader::read_checkpoint(const json& v) {
  for (auto& [ck, cv] : object(v, "checkpoint").items()) {
    const std::string full = "checkpoint." + ck;
    if (set_by_key(cv, full)) continue;  // zerone's dir, every, keep_last, async, resume
    if (ck == "tag_validation") {
      // DeepSpeed checks that every rank saves under the same tag; zerone's ranks save one step together.
      const std::string t = text(cv, full);
      if (t != "Ignore" && t != "Warn" && t != "Fail" && t != "ignore" && t != "warn" && t != "fail")
        fail(full, cv, "Ignore, Warn or Fail");
      no_effect(full + " (every rank saves the same step)");
    } else if (ck == "load_universal") {
      boolean(cv, full);
      no_effect(full + " (every zerone checkpoint loads at any world size and stage)");
    } else if (ck == "use_node_local_storage") {
      boolean(cv, full);
      no_effect(full + " (ranks write into --checkpoint-dir, which must be shared between hosts)");
    } else if (ck == "parallel_write") {
      object(cv, full);
      no_effect(full + " (every rank writes its own file in parallel)");
    } else {
      unknown(full, "dir, every, keep_last, async, resume, or DeepSpeed's tag_validation, load_universal, "
                    "use_node_local_storage, parallel_write");
    }
  }
}

void ConfigReader::read_precision_block(const std::string& key, const json& v) {
  object(v, key);
  if (key != "fp16") {
    if (!bf16_key_.empty()) fail_text(key, str_cat("repeats '", bf16_key_, "' (bfloat16 is DeepSpeed's old name for bf16)"));
    bf16_key_ = key;
  }
  (key == "fp16" ? fp16_ : bf16_) = enabled_switch(v, key);
  for (auto& [fk, fv] : v.items()) {
    const std::string full = key + "." + fk;
    if (fk == "enabled") continue;
    if (key == "fp16") {
      if (fk == "consecutive_hysteresis") {
        // zerone restores the hysteresis only when the scale grows: DeepSpeed's false.
        if (!is_auto(fv) && boolean(fv, full)) not_implemented(full, fv, "consecutive hysteresis");
      } else if (fk == "fp16_master_weights_and_grads") {
        if (!is_auto(fv) && boolean(fv, full)) not_implemented(full, fv, "fp16 master weights");
      } else if (fk == "auto_cast") no_effect(full);
      else if (!set_by_key(fv, full)) unknown(full);
    } else {
      if (fk == "immediate_grad_update" || fk == "check_grad_overflow") no_effect(full);
      else if (fk == "bf16_master_weights_and_grads" || fk == "bf16_optimizer_states") {
        if (!is_auto(fv) && boolean(fv, full)) not_implemented(full, fv, "bf16 master weights or optimizer states");
      } else unknown(full);
    }
  }
}

// Note [Precision from a config]: DeepSpeed trains in fp32 unless bf16 (or its old name bfloat16)
// or fp16 is enabled, and refuses both at once. A file that states precision (an enabled switch
// that is not "auto") is obeyed: bf16.enabled false and no fp16 is fp32, not zerone's default
// (bf16 where the CPU has it). --precision on the command line wins over the file.
void ConfigReader::resolve_precision() {
  if (bf16_.value_or(false) && fp16_.value_or(false))
    throw Error(str_cat("config '", path_, "': ", bf16_key_, ".enabled and fp16.enabled are both true: choose one"));
  std::optional<std::string> stated;
  if (bf16_.value_or(false)) stated = "bf16";
  else if (fp16_.value_or(false)) stated = "fp16";
  else if (bf16_.has_value() || fp16_.has_value()) stated = "fp32";
  if (precision_key_ && stated && *precision_key_ != *stated)
    throw Error(str_cat("config '", path_, "': key 'precision' is \"", *precision_key_, "\" but the ",
                        bf16_.has_value() ? bf16_key_ : "fp16", " block says ", *stated));
  std::string key = precision_key_ ? "precision"
                    : bf16_.value_or(false) || !fp16_.has_value() ? bf16_key_ + ".enabled"
                                                                   : "fp16.enabled";
  if (precision_key_) stated = precision_key_;
  if (stated && claim("--precision", key)) cfg_.precision = *stated;
}

// Note [DeepSpeed's Adam]: DeepSpeed's "Adam" and "AdamW" (any case) are one optimizer (FusedAdam,
// DeepSpeedCPUAdam, or torch's with torch_adam) whose weight decay is decoupled (AdamW) unless the
// type is Adam and params.adam_w_mode is false: then weight decay is L2 regularisation added to the
// gradient, which zerone does not implement (an error unless weight_decay is 0, where both agree).
// Absent params take DeepSpeed's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0
// (0.01 for torch_adam AdamW, torch's default).
// DeepSpeed passes an SGD's params to torch.optim.SGD: lr, momentum, dampening, weight_decay,
// nesterov (torch's defaults: momentum 0, dampening 0, weight_decay 0, nesterov false; lr has no
// default in torch, DeepSpeed's config then needs it: zerone takes --lr's).
void ConfigReader::read_sgd(const json& p) {
  if (claim("--optimizer", "optimizer.type")) cfg_.optimizer = "sgd";
  for (auto& [pk, pv] : p.items()) {
    const std::string full = "optimizer.params." + pk;
    if (pk == "lr") set_number(pv, full, "--lr", cfg_.lr);
    else if (pk == "momentum") set_number(pv, full, "--momentum", cfg_.momentum);
    else if (pk == "dampening") set_number(pv, full, "--dampening", cfg_.dampening);
    else if (pk == "weight_decay") set_number(pv, full, "--weight-decay", cfg_.weight_decay);
    else if (pk == "nesterov") {
      if (!is_auto(pv) && claim("--nesterov", full)) cfg_.nesterov = boolean(pv, full);
    } else if (pk == "maximize") {
      if (boolean(pv, full)) not_implemented(full, pv, "SGD that maximizes");
    } else if (pk == "foreach" || pk == "differentiable") {
      boolean(pv, full);  // implementation choices of torch's; the numbers are the same
    } else {
      fail_text(full, "is unknown (expected lr, momentum, dampening, weight_decay, nesterov)");
    }
  }
}

void ConfigReader::read_optimizer(const json& v) {
  const json& o = object(v, "optimizer");
  if (!o.contains("type")) fail_text("optimizer", "has no 'type' (expected Adam or AdamW)");
  std::string type = text(o["type"], "optimizer.type");
  std::string lower;
  for (char c : type) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const json empty = json::object();
  const json& p = o.contains("params") ? object(o["params"], "optimizer.params") : empty;
  for (auto& [pk, pv] : o.items())
    if (pk != "type" && pk != "params") fail_text("optimizer." + pk, "is unknown (expected type, params)");
  if (lower == "sgd") {
    read_sgd(p);
    return;
  }
  if (lower != "adam" && lower != "adamw") not_implemented("optimizer.type", o["type"], str_cat("optimizer ", type, " (zerone has Adam, AdamW and SGD)"));
  if (claim("--optimizer", "optimizer.type")) cfg_.optimizer = "adamw";
  bool adam_w_mode = true, torch_adam = false;
  for (auto& [pk, pv] : p.items()) {
    const std::string full = "optimizer.params." + pk;
    if (pk == "lr") set_number(pv, full, "--lr", cfg_.lr);
    else if (pk == "eps") set_number(pv, full, "--eps", cfg_.eps);
    else if (pk == "weight_decay") set_number(pv, full, "--weight-decay", cfg_.weight_decay);
    else if (pk == "betas") {
      if (is_auto(pv)) continue;
      if (!pv.is_array() || pv.size() != 2) fail(full, pv, "a list of two numbers");
      set_number(pv[0], full + "[0]", "--beta1", cfg_.beta1);
      set_number(pv[1], full + "[1]", "--beta2", cfg_.beta2);
    } else if (pk == "adam_w_mode") adam_w_mode = boolean(pv, full);
    else if (pk == "torch_adam") torch_adam = boolean(pv, full);
    else if (pk == "bias_correction") {
      if (!boolean(pv, full)) not_implemented(full, pv, "Adam without bias correction");
    } else if (pk == "amsgrad") {
      if (boolean(pv, full)) not_implemented(full, pv, "AMSGrad");
    } else if (pk == "max_grad_norm") {
      fail_text(full, "is not an optimizer parameter in DeepSpeed: use the top-level key gradient_clipping");
    } else {
      fail_text(full, "is unknown (expected lr, betas, eps, weight_decay, bias_correction, amsgrad, adam_w_mode, torch_adam)");
    }
  }
  const bool decoupled = lower == "adamw" || adam_w_mode;
  if (!p.contains("lr") && claim("--lr", "optimizer (DeepSpeed's default lr)")) cfg_.lr = 1e-3f;
  if (!p.contains("weight_decay") && torch_adam && decoupled &&
      claim("--weight-decay", "optimizer (torch AdamW's default weight_decay)"))
    cfg_.weight_decay = 0.01f;
  if (!decoupled && cfg_.weight_decay != 0.0f)
    throw Error(str_cat("config '", path_, "': optimizer.type \"", type, "\" with optimizer.params.adam_w_mode false is ",
                        "Adam with L2 regularisation (weight decay ", cfg_.weight_decay, " added to the gradient), ",
                        "which is not implemented in zerone yet; zerone's AdamW decays weights decoupled: use ",
                        "type AdamW or weight_decay 0"));
}

void ConfigReader::read_scheduler(const json& v) {
  const json& o = object(v, "scheduler");
  if (on_command_line_.count("--lr-schedule")) {
    cfg_.notices.push_back(str_cat("--lr-schedule ", cfg_.lr_schedule, " replaces the scheduler of config '", path_, "'"));
    return;
  }
  if (!o.contains("type")) fail_text("scheduler", "has no 'type' (expected WarmupLR, WarmupDecayLR or WarmupCosineLR)");
  const std::string type = text(o["type"], "scheduler.type");
  std::string schedule;
  std::set<std::string> params;
  if (type == "WarmupLR") {
    schedule = "warmup-lr";
    params = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"};
  } else if (type == "WarmupDecayLR") {
    schedule = "warmup-decay";
    params = {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"};
  } else if (type == "WarmupCosineLR") {
    schedule = "warmup-cosine";
    params = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type", "last_batch_iteration"};
  } else if (type == "OneCycle" || type == "LRRangeTest") {
    not_implemented("scheduler.type", o["type"], str_cat("the ", type, " schedule"));
  } else {
    fail("scheduler.type", o["type"], "WarmupLR, WarmupDecayLR or WarmupCosineLR");
  }
  for (auto& [k, kv] : o.items())
    if (k != "type" && k != "params") fail_text("scheduler." + k, "is unknown (expected type, params)");
  if (claim("--lr-schedule", "scheduler.type")) cfg_.lr_schedule = schedule;
  const json empty = json::object();
  const json& p = o.contains("params") ? object(o["params"], "scheduler.params") : empty;
  for (auto& [pk, pv] : p.items()) {
    const std::string full = "scheduler.params." + pk;
    if (!params.count(pk)) {
      std::string list;
      for (const std::string& name : params) list += (list.empty() ? "" : ", ") + name;
      fail_text(full, str_cat("is not a parameter of ", type, " (expected ", list, ")"));
    }
    if (pk == "warmup_min_lr") set_number(pv, full, "--warmup-min-lr", cfg_.warmup_min_lr);
    else if (pk == "warmup_max_lr") set_number(pv, full, "--lr", cfg_.lr);
    else if (pk == "warmup_num_steps") set_int(pv, full, "--warmup", cfg_.warmup);
    else if (pk == "total_num_steps") set_int_in(pv, full, "--total-steps", cfg_.total_steps, {1, 100000000});
    else if (pk == "warmup_min_ratio") set_number(pv, full, "--warmup-min-ratio", cfg_.warmup_min_ratio);
    else if (pk == "cos_min_ratio") set_number(pv, full, "--min-lr-frac", cfg_.min_lr_frac);
    else if (pk == "warmup_type") {
      if (is_auto(pv)) continue;
      std::string t = text(pv, full);
      if (t != "log" && t != "linear") fail(full, pv, "\"log\" or \"linear\"");
      if (claim("--warmup-type", full)) cfg_.warmup_type = t;
    } else if (pk == "last_batch_iteration") {
      if (!is_auto(pv) && integer(pv, full, {-1, kInt32Max}) != -1)
        not_implemented(full, pv, "starting a schedule part-way (last_batch_iteration other than -1)");
    }
  }
  // DeepSpeed's defaults for absent parameters.
  if (!p.contains("warmup_num_steps") && claim("--warmup", "scheduler (DeepSpeed's default warmup_num_steps)"))
    cfg_.warmup = 1000;
  if (type == "WarmupDecayLR" && !p.contains("warmup_max_lr") && claim("--lr", "scheduler (DeepSpeed's default warmup_max_lr)"))
    cfg_.lr = 1e-3f;
  if (type != "WarmupLR" && !p.contains("total_num_steps"))
    fail_text("scheduler.params", str_cat("has no total_num_steps, which ", type, " requires (\"auto\": --total-steps, default --steps)"));
}

void ConfigReader::read_offload(const std::string& key, const json& v) {
  const json& o = object(v, key);
  for (auto& [k, kv] : o.items()) {
    const std::string full = key + "." + k;
    if (k == "nvme_path" && kv.is_null()) {
      continue;  // DeepSpeed's configs write null for "none"
    } else if (full == "zero_optimization.offload_optimizer.pipeline") {  // DeepSpeed's shorthand for both
      set_bool(kv, full, "--pipeline-read", cfg_.pipeline_read);
      set_bool(kv, full, "--pipeline-write", cfg_.pipeline_write);
    } else if (full == "aio.use_gds") {
      if (!is_auto(kv) && boolean(kv, full)) not_implemented(full, kv, "GPUDirect Storage (it needs a GPU build)");
    } else if (is_notice_key(full)) {
      // Note [Buffering knobs]: DeepSpeed's sizes of its own buffer pools (offload_param's
      // buffer_count, buffer_size, max_in_cpu; fast_init) tune memory and speed, never results:
      // zerone stages as many shards as stage3_prefetch_bucket_size lets it prefetch (Note
      // [Parameter swap]). Checked for type, then listed in the notice, with any offload device.
      if (!is_auto(kv) && !kv.is_null() && (k == "buffer_count" || k == "buffer_size" || k == "max_in_cpu"))
        integer(kv, full, {0, kInt64Max});
      no_effect(full);
    } else if (!set_by_key(kv, full)) {
      unknown(full);
    }
  }
}

void ConfigReader::read_zero(const json& v) {
  for (auto& [zk, zv] : object(v, "zero_optimization").items()) {
    const std::string full = "zero_optimization." + zk;
    if (zk == "zero_quantized_gradients") {  // DeepSpeed's boolean: true is int8 (--quantized-gradients 4 for int4)
      if (!is_auto(zv)) {
        const bool on = boolean(zv, full);
        if (claim("--quantized-gradients", full)) cfg_.quantized_gradients = on ? 8 : 0;
      }
    } else if (zk == "load_from_fp32_weights") {
      // false: DeepSpeed rebuilds the fp32 master weights from the 16-bit parameters on a resume;
      // zerone always resumes the saved master weights, which changes results.
      if (!is_auto(zv) && !boolean(zv, full))
        not_implemented(full, zv, "resuming the master weights from the 16-bit parameters");
      no_effect(full);
    } else if (treatment_of(full) == DeepSpeedKeyTreatment::always_on) {
      if (!is_auto(zv) && !boolean(zv, full)) no_effect(full + " false (zerone always does this)");
    } else if (zk == "zero_quantized_nontrainable_weights") {
      if (!is_auto(zv) && boolean(zv, full)) not_implemented(full, zv, zk);
      no_effect(full);
    } else if (zk == "cpu_offload" || zk == "cpu_offload_params") {
      // DeepSpeed's names from before offload_optimizer / offload_param: true is device "cpu".
      const bool opt = zk == "cpu_offload";
      if (is_auto(zv) || !boolean(zv, full)) {
        no_effect(full);
      } else {
        const std::string block = str_cat("zero_optimization.", opt ? "offload_optimizer" : "offload_param");
        const json& b = v.contains(opt ? "offload_optimizer" : "offload_param") ? v[opt ? "offload_optimizer" : "offload_param"]
                                                                                  : json();
        if (b.is_object() && b.contains("device") && b["device"].is_string() && b["device"] != "cpu")
          fail_text(full, str_cat("is true, but ", block, ".device is ", b["device"].dump(), ": give one of them"));
        if (claim(opt ? "--offload-optimizer" : "--offload-param", full)) (opt ? cfg_.offload_optimizer : cfg_.offload_param) = "cpu";
      }
    } else if (zk == "stage3_gather_16bit_weights_on_model_save" || zk == "gather_16bit_weights_on_model_save" ||
               zk == "stage3_gather_fp16_weights_on_model_save") {
      // true: --save writes the gathered (consolidated) weights, unit by unit; false: DeepSpeed
      // writes none at stage 3, which validate() holds against a --save.
      if (!is_auto(zv)) cfg_.no_gathered_save_key = boolean(zv, full) ? "" : full;
    } else if (zk == "mics_shard_size") {
      if (!is_auto(zv) && integer(zv, full, {-1, kInt32Max}) > 0) not_implemented(full, zv, "MiCS sharding");
      no_effect(full);
    } else if (zk == "offload_optimizer" || zk == "offload_param") {
      if (!zv.is_null()) read_offload(full, zv);
    } else if (is_notice_key(full)) {
      no_effect(full);
    } else if (!set_by_key(zv, full)) {
      unknown(full);
    }
  }
}

}  // namespace

const std::vector<DeepSpeedKey>& deepspeed_keys() { return kDeepSpeedKeys; }
DeepSpeedKeyTreatment deepspeed_key_treatment(const std::string& path) { return treatment_of(path); }

void apply_json_config(const std::string& path, TrainConfig& cfg) {
  const std::string text = io::read_text_file(path, "--config", size_t{64} << 20);
  json root;
  try {
    root = json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw Error(str_cat("config '", path, "' is not valid JSON: ", e.what()));
  }
  ConfigReader(path, cfg).read(root);
}

std::string setting_name(const TrainConfig& cfg, const std::string& flag) {
  auto it = cfg.config_keys.find(flag);
  return it == cfg.config_keys.end() ? flag : str_cat("key '", it->second, "'");
}

void resolve_batch_sizes(TrainConfig& c, int world) {
  if (c.train_batch_size == 0) return;
  const int64_t total = c.train_batch_size;
  const bool micro_given = c.is_given("--micro-batch"), accum_given = c.is_given("--grad-accum");
  // DeepSpeed's _set_batch_related_parameters: the missing one is derived by integer division.
  if (micro_given && !accum_given) {
    c.grad_accum = static_cast<int>(total / c.micro_batch / world);
    c.given.insert("--grad-accum");
  } else if (!micro_given) {
    if (!accum_given) c.grad_accum = 1;
    c.micro_batch = static_cast<int>(total / world / c.grad_accum);
    c.given.insert("--micro-batch");
    c.given.insert("--grad-accum");
  }
  ZERONE_CHECK(c.micro_batch >= 1 && c.grad_accum >= 1 &&
                   total == static_cast<int64_t>(c.micro_batch) * c.grad_accum * world,
               "train_batch_size ", total, " is not micro-batch ", c.micro_batch, " x gradient accumulation ",
               c.grad_accum, " x world size ", world, " (= ", static_cast<int64_t>(c.micro_batch) * c.grad_accum * world,
               "): give train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x ranks, or ",
               "leave one of the three out to have it derived");
}

void validate(const TrainConfig& c) {
  // Each setting's own range or choices (the table), then what settings require of each other.
  for (const Setting& s : settings()) check_setting(s, c);
  LrScheduleKind kind = parse_lr_schedule(c.lr_schedule);
  if (kind == LrScheduleKind::warmup_cosine) {
    // DeepSpeed divides by total_num_steps - warmup_num_steps once the warmup is over.
    const int64_t warmup = std::max(2, c.warmup), total = c.total_steps > 0 ? c.total_steps : c.steps;
    ZERONE_CHECK(total != warmup || c.steps < warmup + 2, setting_name(c, "--total-steps"), " ", total,
                 " equals the warmup steps (", warmup, " after DeepSpeed's minimum of 2): WarmupCosineLR's decay ",
                 "would divide by zero");
  }
  ZERONE_CHECK(c.no_gathered_save_key.empty() || c.save.empty() || c.zero_stage != 3, "--save '", c.save,
               "' writes the weights gathered from every rank, but '", c.no_gathered_save_key,
               "' is false (DeepSpeed then saves no consolidated weights at stage 3): set it true, or drop --save and ",
               "convert a --checkpoint-dir checkpoint with `zerone convert`");
  check_memory_settings(c);
  ZERONE_CHECK(!c.is_given("--epochs") || c.epochs >= 1, setting_name(c, "--epochs"), " ", c.epochs,
               " is out of range: expected 1..1000000 passes over --data (0 would train nothing)");
  ZERONE_CHECK(!(c.is_given("--epochs") && c.is_given("--steps")), setting_name(c, "--epochs"), " and ",
               setting_name(c, "--steps"), " both say how long to train: give one");
  for (const char* flag : {"--checkpoint-every", "--keep-last", "--checkpoint-async", "--resume"})
    ZERONE_CHECK(!c.is_given(flag) || !c.checkpoint_dir.empty(), setting_name(c, flag),
                 " needs --checkpoint-dir (where checkpoints are written and found)");
  check_device_settings(c);
  // Note [Choosing NCCL] (comm/comm_choice.h): an explicit --comm nccl that cannot run fails here,
  // before anything starts; whether ranks share a GPU is known only once they run (run_training).
  if (c.comm == "nccl")
    (void)comm::choose_comm_library(c.comm, kernels::device_or_default(c.device), comm::nccl_compiled_in(), 1, {});
  ZERONE_CHECK(c.offload_optimizer == "none" || c.zero_stage >= 1, "--offload-optimizer ", c.offload_optimizer,
               " needs --zero-stage 1, 2 or 3 (stage 0 keeps no optimizer shard to offload)");
  ZERONE_CHECK(c.offload_param == "none" || c.zero_stage == 3, "--offload-param ", c.offload_param,
               " needs --zero-stage 3 (only stage 3 shards the parameters)");
  const bool nvme = c.offload_optimizer == "nvme" || c.offload_param == "nvme";
  ZERONE_CHECK(!nvme || !c.nvme_path.empty(), "--offload-", c.offload_optimizer == "nvme" ? "optimizer" : "param",
               " nvme needs --nvme-path DIR (a directory on a local disk)");
  ZERONE_CHECK(nvme || c.nvme_path.empty(),
               "--nvme-path is given but nothing is offloaded to nvme (--offload-optimizer nvme or --offload-param nvme)");
}

void check_device_settings(const std::string& device, const std::string& cuda_attention_given_as) {
  if (!device.empty()) (void)kernels::parse_device_kind(device);  // throws naming --device
  ZERONE_CHECK(cuda_attention_given_as.empty() || device.empty() || device == "cuda", cuda_attention_given_as,
               " picks the attention kernels of --device cuda, but the device is ", device);
}

void check_device_settings(const TrainConfig& c) {
  check_device_settings(c.device, c.is_given("--cuda-attention") ? setting_name(c, "--cuda-attention") : "");
}

void check_memory_settings(const TrainConfig& c) {
  ZERONE_CHECK(!c.cpu_checkpointing || c.activation_checkpointing, setting_name(c, "--cpu-checkpointing"),
               " keeps the inputs that activation checkpointing saves: give --activation-checkpointing too");
  // Settings of the other optimizer would do nothing.
  const bool sgd = c.optimizer == "sgd";
  const std::vector<const char*> other = sgd ? std::vector<const char*>{"--beta1", "--beta2", "--eps"}
                                             : std::vector<const char*>{"--momentum", "--dampening", "--nesterov"};
  for (const char* flag : other)
    ZERONE_CHECK(!c.is_given(flag), setting_name(c, flag), " applies to --optimizer ", sgd ? "adamw" : "sgd",
                 "; this run's optimizer is ", c.optimizer);
  ZERONE_CHECK(!c.nesterov || (c.momentum > 0.0f && c.dampening == 0.0f), setting_name(c, "--nesterov"),
               " needs a momentum above 0 and zero dampening (as torch.optim.SGD): --momentum ", c.momentum,
               ", --dampening ", c.dampening);
  // Note [Partial optimizer offload]: a part of nothing offloaded would do nothing.
  ZERONE_CHECK(c.offload_optimizer_ratio == 1.0 || c.offload_optimizer != "none", setting_name(c, "--offload-optimizer-ratio"),
               " ", c.offload_optimizer_ratio, " offloads a part of the optimizer, but --offload-optimizer is none: "
               "give --offload-optimizer cpu or nvme");
  // Note [Optimizer state on NVMe and in host memory]: a share of what is not swapped does nothing.
  ZERONE_CHECK(c.offload_optimizer_nvme_ratio == 1.0 || c.offload_optimizer == "nvme",
               setting_name(c, "--offload-optimizer-nvme-ratio"), " ", c.offload_optimizer_nvme_ratio,
               " splits the optimizer state between NVMe and host memory, but --offload-optimizer is ",
               c.offload_optimizer, ": give --offload-optimizer nvme");
}

std::string transient_gradients_blocker(const TrainConfig& c, bool fp16) {
  if (c.zero_stage < 2) return "--zero-stage below 2 (the full gradients are the optimizer's input)";
  if (c.grad_accum > 1) return "--grad-accum above 1 (the micro-steps sum into the gradient shards)";
  if (!c.early_step) return "--early-step false (every update waits for the whole backward)";
  if (c.delayed_update) return "--delayed-update (the update reads a copy, one step later)";
  if (c.grad_clip > 0.0f) return "--grad-clip (the clip factor needs every gradient before any update)";
  if (fp16) return "fp16 loss scaling (the overflow check needs every gradient before any update)";
  if (c.offload_optimizer != "none" && c.offload_optimizer_ratio < 1.0)
    return str_cat(setting_name(c, "--offload-optimizer-ratio"), " below 1 (gradient shards in two places)");
  return "";
}

std::string grad_accumulators_blocker(const TrainConfig& c, bool fp16) {
  if (c.zero_stage < 2) return "--zero-stage below 2 (the full gradients are the optimizer's input, on the device)";
  if (c.offload_optimizer == "none") return "--offload-optimizer none (the sums are on the device with the optimizer)";
  if (c.offload_optimizer_ratio < 1.0)
    return str_cat(setting_name(c, "--offload-optimizer-ratio"), " below 1 (each sum follows its unit's optimizer)");
  if (c.transient_gradients && transient_gradients_blocker(c, fp16).empty())
    return "transient gradients (one micro-step a step: each shard goes from its reduction to its update, Note "
           "[Transient gradients])";
  return "";
}

void check_settings_take_effect(TrainConfig& c, bool fp16, bool has_validation_data) {
  const LrScheduleKind kind = parse_lr_schedule(c.lr_schedule);
  // Schedule parameters of a schedule this run does not use: the user expects an effect.
  struct ScheduleParam {
    const char* flag;
    std::set<LrScheduleKind> used_by;
  };
  const ScheduleParam schedule_params[] = {
      {"--min-lr-frac", {LrScheduleKind::cosine, LrScheduleKind::warmup_cosine}},
      {"--warmup-type", {LrScheduleKind::warmup_lr, LrScheduleKind::warmup_decay, LrScheduleKind::warmup_cosine}},
      {"--warmup-min-lr", {LrScheduleKind::warmup_lr, LrScheduleKind::warmup_decay}},
      {"--warmup-min-ratio", {LrScheduleKind::warmup_cosine}},
      {"--total-steps", {LrScheduleKind::warmup_decay, LrScheduleKind::warmup_cosine}},
  };
  for (const ScheduleParam& p : schedule_params) {
    if (!c.is_given(p.flag) || p.used_by.count(kind)) continue;
    std::string users;
    for (LrScheduleKind k : p.used_by) users += str_cat(users.empty() ? "" : " or ", lr_schedule_name(k));
    throw Error(str_cat(setting_name(c, p.flag), " applies only to --lr-schedule ", users, "; this run's schedule is ",
                        lr_schedule_name(kind)));
  }
  for (const char* flag : {"--val-every", "--val-batches"})
    ZERONE_CHECK(!c.is_given(flag) || has_validation_data, setting_name(c, flag),
                 " has nothing to validate on: give --val-data");

  auto list_given = [&](std::initializer_list<const char*> flags) {
    std::string names;
    for (const char* f : flags)
      if (c.is_given(f)) {
        auto key = c.config_keys.find(f);
        names += (names.empty() ? "" : ", ") + (key == c.config_keys.end() ? std::string(f) : key->second);
      }
    return names;
  };
  // Note [Early optimizer step] (zero/step_scheduler.cc): the step runs at the end with the delayed
  // update. With clipping or fp16 loss scaling it speculates where state is swapped to NVMe
  // (Note [Speculative early step]) and the optimizer is not partially offloaded (zero::speculates),
  // else steps at the end.
  if (c.is_given("--early-step") && c.early_step) {
    const bool nvme = c.offload_optimizer == "nvme" || c.offload_param == "nvme";
    std::string why = c.delayed_update          ? "--delayed-update (the update runs on its own thread)"
                      : (c.grad_clip > 0.0f || fp16) && !nvme
                          ? str_cat(c.grad_clip > 0.0f ? "--grad-clip" : "fp16 loss scaling",
                                    " without NVMe offload (it would speculate, which costs time and memory "
                                    "and hides no I/O when the state is in memory)")
                      : (c.grad_clip > 0.0f || fp16) && c.offload_optimizer_ratio < 1.0
                          ? str_cat(setting_name(c, "--offload-optimizer-ratio"), " below 1 and ",
                                    c.grad_clip > 0.0f ? "--grad-clip" : "fp16 loss scaling",
                                    " (a partial optimizer offload does not speculate, Note [Partial optimizer offload])")
                      : (c.grad_clip > 0.0f || fp16) && c.offload_optimizer == "nvme" && c.offload_optimizer_nvme_ratio < 1.0
                          ? str_cat(setting_name(c, "--offload-optimizer-nvme-ratio"), " below 1 and ",
                                    c.grad_clip > 0.0f ? "--grad-clip" : "fp16 loss scaling",
                                    " (state split between NVMe and host memory does not speculate)")
                                                : "";
    if (!why.empty())
      c.notices.push_back(str_cat(setting_name(c, "--early-step"), ": no effect with ", why,
                                  "; the optimizer steps at the end, with the same results"));
  }
  // Note [Transient gradients] (zero/partition.h).
  if (c.is_given("--transient-gradients") && c.transient_gradients) {
    if (std::string why = transient_gradients_blocker(c, fp16); !why.empty())
      c.notices.push_back(str_cat(setting_name(c, "--transient-gradients"), ": no effect with ", why,
                                  "; every gradient shard is kept until the optimizer step, with the same results"));
  }
  // Note [Gradient sums on the device] (zero/partition.h).
  if (c.is_given("--grad-accumulators") && c.grad_accumulators != "auto") {
    if (std::string why = grad_accumulators_blocker(c, fp16); !why.empty())
      c.notices.push_back(str_cat(setting_name(c, "--grad-accumulators"), " ", c.grad_accumulators, ": no effect with ",
                                  why, "; the results are the same"));
  }
  if (!fp16) {
    std::string names = list_given({"--loss-scale", "--initial-scale-power", "--loss-scale-window", "--hysteresis",
                                    "--min-loss-scale"});
    if (!names.empty()) c.notices.push_back(str_cat(names, ": no effect, loss scaling applies to fp16 only"));
  }
  if (c.zero_stage < 3) {
    std::string names = list_given({"--stage3-prefetch-bucket-size", "--stage3-param-persistence-threshold"});
    if (!names.empty()) c.notices.push_back(str_cat(names, ": no effect below ZeRO stage 3"));
  }
}

std::vector<std::pair<std::string, std::string>> consistency_settings(const TrainConfig& c) {
  return agreeing_settings(c);
}

}  // namespace zerone::train
