#include "zerone/train/config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <functional>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/io/file.h"

namespace zerone::train {

using json = nlohmann::json;

namespace {

// DeepSpeed keys that do not change training here; accepted so existing configs load.
const std::set<std::string> kIgnoredKeys = {"steps_per_print", "wall_clock_breakdown", "train_batch_size",
                                            "prescale_gradients", "gradient_predivide_factor", "comment"};

template <typename T>
T get_as(const json& value, const std::string& path, const std::string& key, const char* expected) {
  try {
    return value.get<T>();
  } catch (const json::exception&) {
    throw Error(str_cat("config '", path, "': key '", key, "' is ", value.dump(), ", expected ", expected));
  }
}

// The offload sub-objects of zero_optimization and the top-level aio block (issue 8). Each key
// sets the flag it names unless that flag was given on the command line (`flag_given`).
void apply_offload_json(const std::string& path, const std::string& key, const json& o,
                        const std::function<bool(const std::string&)>& flag_given, TrainConfig& cfg) {
  ZERONE_CHECK(o.is_object(), "config '", path, "': key '", key, "' must be an object");
  for (auto& [k, v] : o.items()) {
    const std::string full = key + "." + k;
    auto as_bool = [&](const char* flag, bool& field) {
      if (!flag_given(flag)) field = get_as<bool>(v, path, full, "true or false");
    };
    auto as_int = [&](const char* flag, auto& field) {
      using T = std::remove_reference_t<decltype(field)>;
      if (!flag_given(flag)) field = get_as<T>(v, path, full, "an integer");
    };
    auto as_string = [&](const char* flag, std::string& field) {
      if (!flag_given(flag)) field = get_as<std::string>(v, path, full, "a string");
    };
    const bool opt = key == "zero_optimization.offload_optimizer", param = key == "zero_optimization.offload_param";
    if ((opt || param) && k == "device") as_string(opt ? "--offload-optimizer" : "--offload-param", opt ? cfg.offload_optimizer : cfg.offload_param);
    else if ((opt || param) && k == "nvme_path") as_string("--nvme-path", cfg.nvme_path);
    else if (opt && k == "buffer_count") as_int("--offload-buffer-count", cfg.offload_buffer_count);
    else if ((opt || param) && k == "pin_memory") as_bool("--pin-memory", cfg.pin_memory);
    else if (opt && k == "pipeline_read") as_bool("--pipeline-read", cfg.pipeline_read);
    else if (opt && k == "pipeline_write") as_bool("--pipeline-write", cfg.pipeline_write);
    else if (opt && k == "pipeline") {  // DeepSpeed's shorthand for both
      if (!flag_given("--pipeline-read")) cfg.pipeline_read = get_as<bool>(v, path, full, "true or false");
      if (!flag_given("--pipeline-write")) cfg.pipeline_write = get_as<bool>(v, path, full, "true or false");
    } else if (opt && k == "ratio") {
      double ratio = get_as<double>(v, path, full, "a number");
      ZERONE_CHECK(ratio == 1.0, "config '", path, "': ", full, " ", ratio,
                   " (partial optimizer offload) is not implemented: only 1.0, the whole optimizer, is");
    } else if (param && (k == "buffer_count" || k == "buffer_size" || k == "max_in_cpu")) {
      // They size DeepSpeed's NVMe parameter buffers; zerone sizes its parameter staging from
      // stage3_prefetch_bucket_size instead (Note [Parameter swap]), so with device nvme they
      // would do nothing and are refused below; with none|cpu DeepSpeed ignores them too.
      ZERONE_CHECK(get_as<int64_t>(v, path, full, "an integer") >= 0, "config '", path, "': ", full, " is negative");
      ZERONE_CHECK(!(o.contains("device") && o["device"] == "nvme"), "config '", path, "': ", full,
                   " is not used by zerone's NVMe parameter swap, which stages as many shards as "
                   "stage3_prefetch_bucket_size lets it prefetch; remove it or set that instead");
    } else if (key == "aio" && k == "block_size") as_int("--aio-block-size", cfg.aio_block_size);
    else if (key == "aio" && k == "queue_depth") as_int("--aio-queue-depth", cfg.aio_queue_depth);
    else if (key == "aio" && (k == "intra_op_parallelism" || k == "thread_count"))
      as_int("--aio-intra-op-parallelism", cfg.aio_intra_op_parallelism);
    else if (key == "aio" && k == "single_submit") as_bool("--aio-single-submit", cfg.aio_single_submit);
    else if (key == "aio" && k == "overlap_events") as_bool("--aio-overlap-events", cfg.aio_overlap_events);
    else if (key == "aio" && k == "use_gds") {
      ZERONE_CHECK(!get_as<bool>(v, path, full, "true or false"), "config '", path, "': ", full,
                   " true (GPUDirect Storage) needs a GPU build");
    } else throw Error(str_cat("config '", path, "': unknown key '", full, "'"));
  }
}

}  // namespace

void apply_json_config(const std::string& path, TrainConfig& cfg) {
  const std::set<std::string> on_command_line = cfg.given;
  // Whether the command line set `flag` (then the file's value is ignored); otherwise the file
  // sets it, so it counts as given from here on.
  auto flag_given = [&](const std::string& flag) {
    if (on_command_line.count(flag)) return true;
    cfg.given.insert(flag);
    return false;
  };
  const std::string text = io::read_text_file(path, "--config");
  json root;
  try {
    root = json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw Error(str_cat("config '", path, "' is not valid JSON: ", e.what()));
  }
  ZERONE_CHECK(root.is_object(), "config '", path, "': expected a JSON object at the top level");

  auto set_int = [&](const json& v, const std::string& key, const char* flag, int& field) {
    if (!flag_given(flag)) field = get_as<int>(v, path, key, "an integer");
  };
  auto set_float = [&](const json& v, const std::string& key, const char* flag, float& field) {
    if (!flag_given(flag)) field = get_as<float>(v, path, key, "a number");
  };
  auto set_string = [&](const json& v, const std::string& key, const char* flag, std::string& field) {
    if (!flag_given(flag)) field = get_as<std::string>(v, path, key, "a string");
  };
  auto object_of = [&](const json& v, const std::string& key) -> const json& {
    ZERONE_CHECK(v.is_object(), "config '", path, "': key '", key, "' must be an object");
    return v;
  };

  for (auto& [key, v] : root.items()) {
    if (key == "train_micro_batch_size_per_gpu") set_int(v, key, "--micro-batch", cfg.micro_batch);
    else if (key == "gradient_accumulation_steps") set_int(v, key, "--grad-accum", cfg.grad_accum);
    else if (key == "gradient_clipping") set_float(v, key, "--grad-clip", cfg.grad_clip);
    else if (key == "model") set_string(v, key, "--model", cfg.model);
    else if (key == "init") set_string(v, key, "--init", cfg.init);
    else if (key == "data") set_string(v, key, "--data", cfg.data);
    else if (key == "val_data") set_string(v, key, "--val-data", cfg.val_data);
    else if (key == "save") set_string(v, key, "--save", cfg.save);
    else if (key == "metrics") set_string(v, key, "--metrics", cfg.metrics);
    else if (key == "precision") set_string(v, key, "--precision", cfg.precision);
    else if (key == "seq" || key == "seq_len") set_int(v, key, "--seq", cfg.seq);
    else if (key == "steps" || key == "train_iters") set_int(v, key, "--steps", cfg.steps);
    else if (key == "seed") {
      if (!flag_given("--seed")) cfg.seed = get_as<uint64_t>(v, path, key, "a non-negative integer");
    } else if (key == "no_shuffle") {
      if (!flag_given("--no-shuffle")) cfg.no_shuffle = get_as<bool>(v, path, key, "true or false");
    } else if (key == "profile") {
      if (!flag_given("--profile")) cfg.profile = get_as<bool>(v, path, key, "true or false");
    } else if (key == "threads") set_int(v, key, "--threads", cfg.threads);
    else if (key == "val_every") set_int(v, key, "--val-every", cfg.val_every);
    else if (key == "val_batches") set_int(v, key, "--val-batches", cfg.val_batches);
    else if (key == "bf16" || key == "fp16") {
      const json& o = object_of(v, key);
      for (auto& [fk, fv] : o.items()) {
        std::string full = key + "." + fk;
        if (fk == "enabled") {
          if (get_as<bool>(fv, path, full, "true or false") && !flag_given("--precision")) cfg.precision = key;
        } else if (key == "fp16" && fk == "loss_scale") {
          if (!flag_given("--loss-scale")) cfg.loss_scale = get_as<double>(fv, path, full, "a number");
        } else if (key == "fp16" && fk == "initial_scale_power") set_int(fv, full, "--initial-scale-power", cfg.initial_scale_power);
        else if (key == "fp16" && fk == "loss_scale_window") set_int(fv, full, "--loss-scale-window", cfg.loss_scale_window);
        else if (key == "fp16" && fk == "hysteresis") set_int(fv, full, "--hysteresis", cfg.hysteresis);
        else if (key == "fp16" && fk == "min_loss_scale") {
          if (!flag_given("--min-loss-scale")) cfg.min_loss_scale = get_as<double>(fv, path, full, "a number");
        } else if (fk == "auto_cast" || fk == "immediate_grad_update") {
          continue;  // no effect here
        } else {
          throw Error(str_cat("config '", path, "': unknown key '", full, "'"));
        }
      }
    } else if (key == "optimizer") {
      const json& o = object_of(v, key);
      if (o.contains("type")) {
        std::string type = get_as<std::string>(o["type"], path, "optimizer.type", "a string");
        ZERONE_CHECK(type == "AdamW" || type == "Adam" || type == "adamw", "config '", path, "': optimizer.type '",
                     type, "' is not supported, expected AdamW");
      }
      if (o.contains("params")) {
        const json& p = object_of(o["params"], "optimizer.params");
        for (auto& [pk, pv] : p.items()) {
          std::string full = "optimizer.params." + pk;
          if (pk == "lr") set_float(pv, full, "--lr", cfg.lr);
          else if (pk == "eps") set_float(pv, full, "--eps", cfg.eps);
          else if (pk == "weight_decay") set_float(pv, full, "--weight-decay", cfg.weight_decay);
          else if (pk == "betas") {
            ZERONE_CHECK(pv.is_array() && pv.size() == 2, "config '", path, "': key '", full,
                         "' must be a list of two numbers");
            if (!flag_given("--beta1")) cfg.beta1 = get_as<float>(pv[0], path, full, "a number");
            if (!flag_given("--beta2")) cfg.beta2 = get_as<float>(pv[1], path, full, "a number");
          } else ZERONE_CHECK(false, "config '", path, "': unknown key '", full, "' (expected lr, betas, eps, weight_decay)");
        }
      }
    } else if (key == "scheduler") {
      const json& o = object_of(v, key);
      if (o.contains("params")) {
        const json& p = object_of(o["params"], "scheduler.params");
        if (p.contains("warmup_num_steps")) set_int(p["warmup_num_steps"], "scheduler.params.warmup_num_steps", "--warmup", cfg.warmup);
      }
    } else if (key == "zero_optimization") {
      const json& o = object_of(v, key);
      for (auto& [zk, zv] : o.items()) {
        std::string full = "zero_optimization." + zk;
        auto set_i64 = [&](const char* flag, int64_t& field) {
          if (!flag_given(flag)) field = get_as<int64_t>(zv, path, full, "an integer");
        };
        if (zk == "stage") set_int(zv, full, "--zero-stage", cfg.zero_stage);
        else if (zk == "reduce_bucket_size") set_i64("--reduce-bucket-size", cfg.reduce_bucket_size);
        else if (zk == "allgather_bucket_size") set_i64("--allgather-bucket-size", cfg.allgather_bucket_size);
        else if (zk == "stage3_prefetch_bucket_size") set_i64("--stage3-prefetch-bucket-size", cfg.stage3_prefetch_bucket_size);
        else if (zk == "stage3_param_persistence_threshold")
          set_i64("--stage3-param-persistence-threshold", cfg.stage3_param_persistence_threshold);
        else if (zk == "overlap_comm" || zk == "contiguous_gradients" || zk == "reduce_scatter" ||
                 zk == "allgather_partitions" || zk == "round_robin_gradients")
          continue;  // always on in zerone
        else if (zk == "offload_optimizer" || zk == "offload_param") apply_offload_json(path, full, zv, flag_given, cfg);
        else if (zk == "sub_group_size") set_i64("--sub-group-size", cfg.sub_group_size);
        else ZERONE_CHECK(false, "config '", path, "': unknown key '", full, "'");
      }
    } else if (key == "aio") {
      apply_offload_json(path, key, v, flag_given, cfg);
    } else if (kIgnoredKeys.count(key) == 0) {
      throw Error(str_cat("config '", path, "': unknown key '", key, "'"));
    }
  }
}

void validate(const TrainConfig& c) {
  auto finite = [](float x) { return std::isfinite(x); };
  ZERONE_CHECK(c.micro_batch >= 1 && c.micro_batch <= 65536, "--micro-batch ", c.micro_batch, " is out of range: expected 1..65536");
  ZERONE_CHECK(c.seq >= 1 && c.seq <= 1048576, "--seq ", c.seq, " is out of range: expected 1..1048576");
  ZERONE_CHECK(c.grad_accum >= 1 && c.grad_accum <= 1048576, "--grad-accum ", c.grad_accum, " is out of range: expected 1..1048576");
  ZERONE_CHECK(c.steps >= 1 && c.steps <= 100000000, "--steps ", c.steps, " is out of range: expected 1..100000000");
  ZERONE_CHECK(finite(c.lr) && c.lr > 0.0f && c.lr <= 10.0f, "--lr ", c.lr, " is out of range: expected 0 < lr <= 10");
  ZERONE_CHECK(c.warmup >= 0, "--warmup ", c.warmup, " is negative");
  ZERONE_CHECK(c.lr_schedule == "constant" || c.lr_schedule == "cosine", "--lr-schedule '", c.lr_schedule,
               "': expected constant or cosine");
  ZERONE_CHECK(finite(c.min_lr_frac) && c.min_lr_frac >= 0.0f && c.min_lr_frac <= 1.0f, "--min-lr-frac ", c.min_lr_frac,
               " is out of range: expected 0..1");
  ZERONE_CHECK(finite(c.weight_decay) && c.weight_decay >= 0.0f && c.weight_decay < 10.0f, "--weight-decay ",
               c.weight_decay, " is out of range: expected 0 <= wd < 10");
  ZERONE_CHECK(finite(c.beta1) && c.beta1 >= 0.0f && c.beta1 < 1.0f, "--beta1 ", c.beta1, " is out of range: expected 0 <= beta1 < 1");
  ZERONE_CHECK(finite(c.beta2) && c.beta2 >= 0.0f && c.beta2 < 1.0f, "--beta2 ", c.beta2, " is out of range: expected 0 <= beta2 < 1");
  ZERONE_CHECK(finite(c.eps) && c.eps > 0.0f && c.eps < 1.0f, "--eps ", c.eps, " is out of range: expected 0 < eps < 1");
  ZERONE_CHECK(finite(c.grad_clip) && c.grad_clip >= 0.0f, "--grad-clip ", c.grad_clip, " is out of range: expected >= 0 (0 disables)");
  ZERONE_CHECK(c.threads >= 0 && c.threads <= 4096, "--threads ", c.threads, " is out of range: expected 0..4096");
  ZERONE_CHECK(c.val_every >= 0, "--val-every ", c.val_every, " is negative");
  ZERONE_CHECK(c.val_batches >= 1, "--val-batches ", c.val_batches, " must be at least 1");
  ZERONE_CHECK(c.precision.empty() || c.precision == "fp32" || c.precision == "bf16" || c.precision == "fp16",
               "--precision '", c.precision, "': expected fp32, bf16 or fp16");
  ZERONE_CHECK(std::isfinite(c.loss_scale) && c.loss_scale >= 0, "--loss-scale ", c.loss_scale,
               " is out of range: expected >= 0 (0 selects dynamic scaling)");
  ZERONE_CHECK(c.initial_scale_power >= 0 && c.initial_scale_power <= 64, "--initial-scale-power ",
               c.initial_scale_power, " is out of range: expected 0..64");
  ZERONE_CHECK(c.loss_scale_window >= 1, "--loss-scale-window ", c.loss_scale_window, " must be at least 1");
  ZERONE_CHECK(c.hysteresis >= 1, "--hysteresis ", c.hysteresis, " must be at least 1");
  ZERONE_CHECK(std::isfinite(c.min_loss_scale) && c.min_loss_scale > 0, "--min-loss-scale ", c.min_loss_scale,
               " must be positive");
  ZERONE_CHECK(c.zero_stage >= 0 && c.zero_stage <= 3, "--zero-stage ", c.zero_stage, " is out of range: expected 0..3");
  ZERONE_CHECK(c.reduce_bucket_size >= 1 && c.reduce_bucket_size <= (int64_t{1} << 31) - 1, "--reduce-bucket-size ",
               c.reduce_bucket_size, " is out of range: expected 1..2147483647 elements");
  ZERONE_CHECK(c.allgather_bucket_size >= 1 && c.allgather_bucket_size <= (int64_t{1} << 31) - 1,
               "--allgather-bucket-size ", c.allgather_bucket_size, " is out of range: expected 1..2147483647 elements");
  ZERONE_CHECK(c.stage3_prefetch_bucket_size >= 0, "--stage3-prefetch-bucket-size ", c.stage3_prefetch_bucket_size,
               " is negative");
  ZERONE_CHECK(c.stage3_param_persistence_threshold >= 0, "--stage3-param-persistence-threshold ",
               c.stage3_param_persistence_threshold, " is negative");
  ZERONE_CHECK(std::isfinite(c.device_mem_limit) && c.device_mem_limit >= 0.0, "--device-mem-limit ",
               c.device_mem_limit, " is out of range: expected a number of GiB >= 0 (0: no limit)");
  for (auto [flag, value] : {std::pair{"--offload-optimizer", &c.offload_optimizer}, {"--offload-param", &c.offload_param}})
    ZERONE_CHECK(*value == "none" || *value == "cpu" || *value == "nvme", flag, " '", *value, "': expected none, cpu or nvme");
  ZERONE_CHECK(c.offload_optimizer == "none" || c.zero_stage >= 1, "--offload-optimizer ", c.offload_optimizer,
               " needs --zero-stage 1, 2 or 3 (stage 0 keeps no optimizer shard to offload)");
  ZERONE_CHECK(c.offload_param == "none" || c.zero_stage == 3, "--offload-param ", c.offload_param,
               " needs --zero-stage 3 (only stage 3 shards the parameters)");
  const bool nvme = c.offload_optimizer == "nvme" || c.offload_param == "nvme";
  ZERONE_CHECK(!nvme || !c.nvme_path.empty(), "--offload-", c.offload_optimizer == "nvme" ? "optimizer" : "param",
               " nvme needs --nvme-path DIR (a directory on a local disk)");
  ZERONE_CHECK(nvme || c.nvme_path.empty(),
               "--nvme-path is given but nothing is offloaded to nvme (--offload-optimizer nvme or --offload-param nvme)");
  ZERONE_CHECK(c.sub_group_size >= 1 && c.sub_group_size <= (int64_t{1} << 40), "--sub-group-size ", c.sub_group_size,
               " is out of range: expected 1..2^40 elements");
  ZERONE_CHECK(c.offload_buffer_count >= 1 && c.offload_buffer_count <= 64, "--offload-buffer-count ",
               c.offload_buffer_count, " is out of range: expected 1..64 staging buffers");
  ZERONE_CHECK(c.aio_block_size >= 4096 && c.aio_block_size <= (int64_t{1} << 30) && c.aio_block_size % 4096 == 0,
               "--aio-block-size ", c.aio_block_size, " is out of range: expected a multiple of 4096 in 4096..2^30 bytes");
  ZERONE_CHECK(c.aio_queue_depth >= 1 && c.aio_queue_depth <= 4096, "--aio-queue-depth ", c.aio_queue_depth,
               " is out of range: expected 1..4096");
  ZERONE_CHECK(c.aio_intra_op_parallelism >= 1 && c.aio_intra_op_parallelism <= 64, "--aio-intra-op-parallelism ",
               c.aio_intra_op_parallelism, " is out of range: expected 1..64");
}

std::vector<std::pair<std::string, std::string>> consistency_settings(const TrainConfig& c) {
  return {{"--model", c.model},
          {"--init", c.init},
          {"--data", c.data},
          {"--val-data", c.val_data},
          {"--save", c.save},
          {"--metrics", c.metrics},
          {"--precision", c.precision},
          {"--micro-batch", str_cat(c.micro_batch)},
          {"--seq", str_cat(c.seq)},
          {"--grad-accum", str_cat(c.grad_accum)},
          {"--steps", str_cat(c.steps)},
          {"--lr", str_cat(c.lr)},
          {"--warmup", str_cat(c.warmup)},
          {"--lr-schedule", c.lr_schedule},
          {"--min-lr-frac", str_cat(c.min_lr_frac)},
          {"--weight-decay", str_cat(c.weight_decay)},
          {"--beta1", str_cat(c.beta1)},
          {"--beta2", str_cat(c.beta2)},
          {"--eps", str_cat(c.eps)},
          {"--grad-clip", str_cat(c.grad_clip)},
          {"--seed", str_cat(c.seed)},
          {"--no-shuffle", str_cat(c.no_shuffle)},
          {"--val-every", str_cat(c.val_every)},
          {"--val-batches", str_cat(c.val_batches)},
          {"--zero-stage", str_cat(c.zero_stage)},
          {"--reduce-bucket-size", str_cat(c.reduce_bucket_size)},
          {"--allgather-bucket-size", str_cat(c.allgather_bucket_size)},
          {"--stage3-prefetch-bucket-size", str_cat(c.stage3_prefetch_bucket_size)},
          {"--stage3-param-persistence-threshold", str_cat(c.stage3_param_persistence_threshold)},
          {"--loss-scale", str_cat(c.loss_scale)},
          {"--initial-scale-power", str_cat(c.initial_scale_power)},
          {"--loss-scale-window", str_cat(c.loss_scale_window)},
          {"--hysteresis", str_cat(c.hysteresis)},
          {"--min-loss-scale", str_cat(c.min_loss_scale)},
          {"--device-mem-limit", str_cat(c.device_mem_limit)},
          {"--offload-optimizer", c.offload_optimizer},
          {"--offload-param", c.offload_param},
          {"--sub-group-size", str_cat(c.sub_group_size)},
          {"--offload-buffer-count", str_cat(c.offload_buffer_count)}};
}

float learning_rate(const TrainConfig& c, int step, int total) {
  if (c.warmup > 0 && step <= c.warmup) return c.lr * static_cast<float>(step) / static_cast<float>(c.warmup);
  if (c.lr_schedule == "cosine" && total > c.warmup) {
    double progress = static_cast<double>(step - c.warmup) / static_cast<double>(total - c.warmup);
    double coeff = 0.5 * (1.0 + std::cos(3.14159265358979323846 * progress));
    double min_lr = c.lr * c.min_lr_frac;
    return static_cast<float>(min_lr + coeff * (c.lr - min_lr));
  }
  return c.lr;
}

}  // namespace zerone::train
