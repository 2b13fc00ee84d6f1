// Training configuration: the flags of DESIGN §4, also settable from a JSON file whose keys follow
// DeepSpeed's (train_micro_batch_size_per_gpu, gradient_accumulation_steps, gradient_clipping,
// bf16.enabled, fp16.enabled, optimizer.params.{lr,betas,eps,weight_decay},
// scheduler.params.warmup_num_steps, zero_optimization.stage) plus zerone's own keys for the rest
// ("model", "init", "data", "val_data", "steps", "seq", "seed", ...). A flag given on the command line
// wins over the file.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace zerone::train {

struct TrainConfig {
  std::string model;            // spec or preset; empty: from --init, or the default run's model
  std::string init;             // llm.c checkpoint to start from
  std::string data;             // glob of token shards; empty: the built-in Markov corpus
  std::string val_data;         // glob; empty: none (built-in corpus: a held-out stream)
  std::string save;             // write an llm.c checkpoint here at the end
  std::string metrics;          // JSONL file, one line per optimizer step
  std::string precision;        // fp32 | bf16; empty: bf16 where the CPU has native bf16, else fp32
  int micro_batch = 4;
  int seq = 64;
  int grad_accum = 1;
  int steps = 100;              // the default run uses its own count unless --steps is given
  float lr = 3e-4f;
  int warmup = 0;
  std::string lr_schedule = "constant";  // constant | cosine (decays to lr * min_lr_frac at the last step)
  float min_lr_frac = 0.0f;
  float weight_decay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float grad_clip = 0.0f;       // 0: no clipping
  uint64_t seed = 1337;
  bool no_shuffle = false;
  int threads = 0;              // 0: OpenMP's default
  int val_every = 0;            // steps between validations; 0: only at the end
  int val_batches = 8;
  int zero_stage = 0;
  // ZeRO buckets and stage-3 knobs, in elements (DeepSpeed's names and defaults).
  int64_t reduce_bucket_size = 500'000'000;
  int64_t allgather_bucket_size = 500'000'000;
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  // fp16 loss scaling (DeepSpeed's fp16.* keys): loss_scale 0 = dynamic.
  double loss_scale = 0.0;
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1.0;
  bool profile = false;         // report where step time goes (GEMM, attention, ...)
  // Offload (README "Offload"; DeepSpeed's zero_optimization.offload_* and aio keys).
  double device_mem_limit = 0.0;        // GiB per rank of the device arena; 0: no cap
  std::string offload_optimizer = "none";  // none | cpu | nvme (stages 1-3)
  std::string offload_param = "none";      // none | cpu (stage 3)
  std::string nvme_path;                // parent of the run's swap directories
  int64_t sub_group_size = 1'000'000'000;  // optimizer elements per swap sub-group
  int offload_buffer_count = 4;         // offload_optimizer.buffer_count: staging buffers
  bool pipeline_read = true, pipeline_write = true;  // overlap swap I/O with the optimizer step
  bool pin_memory = false;              // mlock the staging buffers
  int64_t aio_block_size = 1 << 20;     // aio.block_size (bytes)
  int aio_queue_depth = 8;              // aio.queue_depth
  int aio_intra_op_parallelism = 1;     // aio.intra_op_parallelism (old name thread_count)
  bool aio_single_submit = false;       // aio.single_submit
  bool aio_overlap_events = true;       // aio.overlap_events

  // Flags the user set (on the command line or through the JSON file), by flag name ("--lr").
  // Defaults that depend on the kind of run (the default run's model, batch and schedule) fill
  // only the settings not named here.
  std::set<std::string> given;
  bool is_given(const std::string& flag) const { return given.count(flag) > 0; }
};

// Fills `cfg` from the JSON file at `path`, skipping keys whose flag is already in cfg.given (set
// on the command line, which wins) and adding the flags it sets to cfg.given. Throws Error naming
// the file and key for unreadable JSON, unknown keys or wrongly typed values.
void apply_json_config(const std::string& path, TrainConfig& cfg);

// Checks every value's range; throws Error naming the flag and what was expected.
void validate(const TrainConfig& cfg);

// Every setting that must agree across ranks, as (flag, value) pairs in a fixed order, for the
// start-up consistency check. Output paths are included: only rank 0 writes them, so a flag given
// to another rank alone would silently do nothing.
std::vector<std::pair<std::string, std::string>> consistency_settings(const TrainConfig& cfg);

// Learning rate at 1-based `step` of `total` steps: linear warmup over cfg.warmup steps, then
// constant or cosine decay to lr * min_lr_frac.
float learning_rate(const TrainConfig& cfg, int step, int total);

}  // namespace zerone::train
