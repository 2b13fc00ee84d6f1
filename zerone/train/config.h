// Training configuration: the flags of DESIGN §4, also settable from a JSON file whose keys follow
// DeepSpeed's (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
// gradient_clipping, bf16/bfloat16/fp16, optimizer, scheduler, zero_optimization, ...) plus zerone's
// own keys for the rest ("model", "init", "data", "val_data", "steps", "seq", "seed", ...). A flag
// given on the command line wins over the file; "auto" (Hugging Face Trainer's placeholder) leaves
// a setting to its flag or default. docs/CONFIG.md's "DeepSpeed config keys" lists how each key is treated:
// honoured, accepted with a notice (it tunes something zerone does not have and cannot change
// results), or an error (it would change results and is not implemented).
//
// Ownership: plain values. Failure: the functions below throw Error naming the file, key or flag.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "zerone/io/aio.h"
#include "zerone/zero/partition.h"

namespace zerone::train {

// Note [Defaults stated once]: a setting that configures a library (the engine's ZeroConfig, the
// swap's AioConfig) takes its default from that library's struct, so the library and the flag
// cannot disagree; the settings table's ranges read the same structs' limits.
inline const zero::ZeroConfig kZeroDefaults{};
inline const io::AioConfig kAioDefaults{};

struct TrainConfig {
  std::string model;            // spec or preset; empty: from --init, or the default run's model
  std::string init;             // weights to start from: llm.c file, Hugging Face or zerone checkpoint directory
  std::string data;             // glob of token shards; empty: the built-in Markov corpus
  std::string val_data;         // glob; empty: none (built-in corpus: a held-out stream)
  std::string save;             // write an llm.c checkpoint here at the end
  std::string metrics;          // JSONL file, one line per optimizer step
  std::string config_file;      // the --config path, an input: no output may overwrite it
  std::string precision;        // fp32 | bf16 | fp16; empty: bf16 where the CPU has native bf16, else fp32
  int64_t train_batch_size = 0; // DeepSpeed's train_batch_size; 0: micro_batch x grad_accum x world
  int micro_batch = 4;
  int seq = 64;
  int grad_accum = 1;
  int steps = 100;              // the default run uses its own count unless --steps is given
  float lr = 3e-4f;
  int warmup = 0;               // steps (DeepSpeed schedules: warmup_num_steps)
  // constant | cosine (decays to lr * min_lr_frac at the last step) | warmup-lr | warmup-decay |
  // warmup-cosine (DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR; see lr_schedule.h).
  std::string lr_schedule = "constant";
  float min_lr_frac = 0.0f;     // cosine floor; warmup-cosine: cos_min_ratio (default 1e-4 there)
  int total_steps = 0;          // warmup-decay, warmup-cosine: total_num_steps; 0: steps
  float warmup_min_lr = 0.0f;   // warmup-lr, warmup-decay: the lr warmup starts from
  float warmup_min_ratio = 0.0f;// warmup-cosine: warmup starts from lr * this
  std::string warmup_type = "log";  // DeepSpeed schedules: log | linear
  float weight_decay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  std::string optimizer = "adamw";  // adamw | sgd (DeepSpeed optimizer.type Adam/AdamW or SGD)
  float momentum = 0.0f, dampening = 0.0f;  // SGD (torch.optim.SGD's meaning)
  bool nesterov = false;                    // SGD
  int epochs = 0;               // image data: passes over --data (sets the steps); 0: --steps counts
  float grad_clip = 0.0f;       // 0: no clipping
  uint64_t seed = 1337;
  bool no_shuffle = false;
  int threads = 0;              // 0: OpenMP's default
  int val_every = 0;            // steps between validations; 0: only at the end
  int val_batches = 8;
  int zero_stage = 0;
  // ZeRO buckets and stage-3 knobs, in elements (DeepSpeed's names and defaults).
  // 0: "auto", scaled to the model (Note [Auto sizes] in zero/planner.cc).
  int64_t reduce_bucket_size = 0;
  int64_t allgather_bucket_size = static_cast<int64_t>(kZeroDefaults.allgather_bucket_numel);
  int64_t stage3_prefetch_bucket_size = static_cast<int64_t>(kZeroDefaults.prefetch_numel);
  int64_t stage3_param_persistence_threshold = static_cast<int64_t>(kZeroDefaults.persistence_threshold);
  // fp16 loss scaling (DeepSpeed's fp16.* keys): loss_scale 0 = dynamic.
  double loss_scale = 0.0;
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1.0;
  bool profile = false;         // report where step time goes (GEMM, attention, ...)
  // Recompute each block's forward in its backward (Note [Activation checkpointing] in nn/model.h).
  bool activation_checkpointing = false;
  // With it, the saved block inputs live in the host place (Note [CPU checkpointing] in nn/model.h;
  // DeepSpeed's activation_checkpointing.cpu_checkpointing).
  bool cpu_checkpointing = false;
  // ZeRO-Offload's one-step delayed parameter update (Note [Delayed parameter update] in zero/step_scheduler.cc).
  bool delayed_update = false;
  // Update each unit as soon as its gradients are final (Note [Early optimizer step] in zero/step_scheduler.cc).
  bool early_step = true;
  // Free each gradient shard at its update where the step allows it (Note [Transient gradients]
  // in zero/partition.h; transient_gradients_blocker says where it does not).
  bool transient_gradients = true;
  // Where stages 2-3 keep the micro-steps' gradient sums with the optimizer offloaded: "device",
  // "host", or "auto" (Note [Gradient sums on the device] in zero/partition.h; fit_grad_sums).
  std::string grad_accumulators = "auto";
  // Note [Collective timeout] (comm/communicator.h): seconds a rank waits in one collective before
  // the job ends naming the ranks that did not arrive (torch.distributed's timeout, 600 s).
  double comm_timeout_s = 600.0;
  // ZeRO++ (zero/zeropp.h; DeepSpeed's zero_hpz_partition_size, zero_quantized_weights,
  // zero_quantized_gradients), stage 3: hpZ group size (1: off), qwZ, qgZ bits (0: off, 8 or 4).
  int hpz_partition_size = 1;
  bool quantized_weights = false;
  int quantized_gradients = 0;
  // Offload (docs/OFFLOAD.md; DeepSpeed's zero_optimization.offload_* and aio keys).
  double device_mem_limit = 0.0;        // GiB per rank of the device arena; 0: no cap
  std::string device;                   // cpu | sim | cuda; empty: kernels::default_device()
  std::string cuda_attention = "flash";  // flash | plain: the cuda backend's attention kernels
  std::string comm;                     // nccl | mpi; empty: comm::choose_comm_library's default
  std::string offload_optimizer = "none";  // none | cpu | nvme (stages 1-3)
  std::string offload_param = "none";      // none | cpu (stage 3)
  std::string nvme_path;                // parent of the run's swap directories
  int64_t sub_group_size = 0;  // optimizer elements per swap sub-group; 0: "auto" (Note [Auto sizes])
  int offload_buffer_count = kZeroDefaults.offload_buffer_count;  // offload_optimizer.buffer_count: staging buffers
  double offload_optimizer_ratio = kZeroDefaults.offload_optimizer_ratio;  // offloaded share of the sub-groups
  // With nvme: the swapped share of the offloaded sub-groups, the rest in host memory.
  double offload_optimizer_nvme_ratio = kZeroDefaults.offload_optimizer_nvme_ratio;
  bool pipeline_read = true, pipeline_write = true;  // overlap swap I/O with the optimizer step
  bool pin_memory = false;              // mlock the staging buffers
  int64_t aio_block_size = static_cast<int64_t>(kAioDefaults.block_bytes);  // aio.block_size (bytes)
  int aio_queue_depth = kAioDefaults.queue_depth;                          // aio.queue_depth
  int aio_intra_op_parallelism = kAioDefaults.intra_op_parallelism;        // aio.intra_op_parallelism (old name thread_count)
  bool aio_single_submit = kAioDefaults.single_submit;                     // aio.single_submit
  bool aio_overlap_events = kAioDefaults.overlap_events;                   // aio.overlap_events
  // Checkpoints (zerone/train/checkpoint.h; config block "checkpoint").
  std::string checkpoint_dir;           // root of step-N/ directories and `latest`
  int checkpoint_every = 0;             // save after every N steps (0: only at the end and on a stop signal)
  int keep_last = 0;                    // keep the newest K checkpoints (0: all)
  bool resume = false;                  // continue from checkpoint_dir's latest checkpoint, if any
  bool checkpoint_async = false;        // write in the background; the step stalls only for a copy
  // Seeing a run (train/metrics.h, zerone/report): MFU's peak, the report and DeepSpeed's monitors.
  double peak_tflops = 0.0;             // per rank; 0: the GEMM peak measured at start-up
  std::string report;                   // HTML report written from --metrics at the end
  std::string tensorboard_dir;          // TensorBoard event files (tensorboard.output_path/job_name)
  std::string csv_monitor_dir;          // one CSV per metric (csv_monitor.output_path/job_name)

  // Flags the user set (on the command line or through the JSON file), by flag name ("--lr").
  // Defaults that depend on the kind of run (the default run's model, batch and schedule) fill
  // only the settings not named here.
  std::set<std::string> given;
  bool is_given(const std::string& flag) const { return given.count(flag) > 0; }
  // Flags the config file set, with the key that set them ("--hysteresis" -> "fp16.hysteresis"),
  // so that messages name what the user wrote.
  std::map<std::string, std::string> config_keys;
  // DeepSpeed's zero_optimization.stage3_gather_16bit_weights_on_model_save (or its older names),
  // the key that set it false, or empty: DeepSpeed then writes no consolidated weights at stage 3,
  // and zerone refuses a --save that would (validate()); true is what --save always does.
  std::string no_gathered_save_key;
  // One-line notices for rank 0 to print at start-up ("config keys with no effect here: ...").
  std::vector<std::string> notices;
};

// How a DeepSpeed config key is treated (Note [DeepSpeed config keys] in config.cc).
enum class DeepSpeedKeyTreatment {
  honoured,       // sets a zerone setting, or its block is read
  notice,         // tunes something zerone does not have and cannot change results: one notice
  always_on,      // zerone always does it: true is honoured, false a notice
  error_when_on,  // off or disabled: a notice; on or enabled: an error (it would change results)
  error,          // always an error
  unknown,        // not a DeepSpeed key zerone knows: an error with "did you mean"
};
struct DeepSpeedKey {
  std::string path;  // dotted: "zero_optimization.offload_param.max_in_cpu"
  DeepSpeedKeyTreatment treatment;
};
// Every DeepSpeed key zerone knows, with its treatment.
const std::vector<DeepSpeedKey>& deepspeed_keys();
DeepSpeedKeyTreatment deepspeed_key_treatment(const std::string& path);

// Fills `cfg` from the JSON file at `path`, skipping keys whose flag is already in cfg.given (set
// on the command line, which wins) and adding the flags it sets to cfg.given. Throws Error naming
// the file and key for unreadable JSON, unknown keys or wrongly typed values.
void apply_json_config(const std::string& path, TrainConfig& cfg);

// DeepSpeed's batch arithmetic (its _set_batch_related_parameters and _batch_assertion): with
// train_batch_size set, derives whichever of micro-batch and accumulation was not given (neither:
// accumulation 1) and requires train_batch_size = micro_batch x grad_accum x world_size. Throws
// Error naming all three numbers and the world size otherwise. No-op when train_batch_size is 0.
void resolve_batch_sizes(TrainConfig& cfg, int world_size);

// Checks every value's range; throws Error naming the flag and what was expected.
void validate(const TrainConfig& cfg);

// The checks between settings that describe the model's memory, shared by validate() (train) and
// `zerone estimate`: --cpu-checkpointing needs --activation-checkpointing, the other optimizer's
// settings are refused, --offload-optimizer-ratio needs an optimizer offload. Throws Error naming
// the flag (or config key) and what was expected.
void check_memory_settings(const TrainConfig& cfg);

// The device settings, shared by validate() (train), `zerone estimate`, `zerone plan` and `zerone
// sample`: --device names a device (cpu, sim, cuda; empty: the default), and --cuda-attention,
// when given (`cuda_attention_given_as`: how it was spelt, flag or config key; empty: not given),
// applies to --device cuda or the default device. Throws Error naming the flag otherwise.
void check_device_settings(const std::string& device, const std::string& cuda_attention_given_as);
void check_device_settings(const TrainConfig& cfg);

// Every setting that must agree across ranks, as (flag, value) pairs in a fixed order, for the
// start-up consistency check. Output paths are included: only rank 0 writes them, so a flag given
// to another rank alone would silently do nothing.
std::vector<std::pair<std::string, std::string>> consistency_settings(const TrainConfig& cfg);

// Settings that would silently do nothing in this run: errors for those the user must fix
// (schedule parameters of another schedule, validation settings without validation data),
// notices appended to cfg.notices for the harmless ones (fp16 loss scaling without fp16, stage-3
// knobs below stage 3). `fp16`: the run computes in fp16; `has_validation_data`: it validates.
void check_settings_take_effect(TrainConfig& cfg, bool fp16, bool has_validation_data);

// Note [Transient gradients] (zero/partition.h): why this run keeps every gradient shard until the
// optimizer has run ("" when it can free each at its update: ZeRO stage 2-3, one micro-step a step,
// --early-step, no --grad-clip, not fp16 (`fp16`), no --delayed-update, no partial optimizer offload).
std::string transient_gradients_blocker(const TrainConfig& cfg, bool fp16);
// Note [Gradient sums on the device] (zero/partition.h): why --grad-accumulators device|host changes
// nothing for `cfg` ("" where it applies); `fp16` as for transient_gradients_blocker.
std::string grad_accumulators_blocker(const TrainConfig& cfg, bool fp16);

// How the user named a setting in messages: "--lr", or "key 'optimizer.params.lr'" when the config
// file set it.
std::string setting_name(const TrainConfig& cfg, const std::string& flag);


}  // namespace zerone::train
