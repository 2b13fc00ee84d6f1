#include "zerone/train/settings.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "zerone/core/error.h"
#include "zerone/optim/swapped.h"

namespace zerone::train {

// Note [One settings table]: a setting used to be written in up to seven places (the struct, the
// train flags, the estimate flags, the JSON reader with its range, validate() with its range
// again, the consistency list and README), and they drifted: one knob had three names and two
// ranges. Now TrainConfig holds the value, this table says everything else, and every consumer
// iterates the table. What stays hand-written is what is not one setting's property: DeepSpeed
// blocks whose meaning spans settings (optimizer type and defaults, scheduler type, precision
// blocks, the old cpu_offload switches; config.cc) and checks between settings (validate()).

namespace {

constexpr double kI32 = 2147483647.0;
constexpr double kI64 = 9.2e18;  // beyond any count zerone takes; within int64_t
constexpr double kInf = std::numeric_limits<double>::infinity();

using G = SettingGroup;
using T = SettingType;
using C = TrainConfig;

std::vector<Setting> build_table() {
  std::vector<Setting> t = {
      // model
      {.flag = "--model", .key = "model", .group = G::model, .type = T::text, .field = &C::model,
       .help = "preset (gpt2-124m ... gpt2-1.5b, tinyllama-1.1b, llama-3.2-1b, llama-2-7b, llama-2-13b, llama-3-8b, mnist-mlp, "
               "mnist-cnn, cifar-cnn) or spec (gpt2:layers=..,dim=..,heads=..,vocab=..,ctx=.., llama:...,kv_heads=..,ffn=.., "
               "seq:in=CxHxW,...)",
       .default_text = "the default run's model, or --init's", .commands = kTrain | kEstimate},
      {.flag = "--init", .key = "init", .group = G::model, .type = T::text, .field = &C::init,
       .help = "weights to start from: an llm.c GPT-2 file (v3 f32 / v5 bf16), a Hugging Face model directory "
               "(config.json + safetensors), or a zerone checkpoint directory",
       .default_text = "none: initialized from --seed"},
      {.flag = "--precision", .key = "precision", .group = G::model, .type = T::choice, .field = &C::precision,
       .choices = {"fp32", "bf16", "fp16"},
       .help = "compute precision; bf16 and fp16 keep fp32 master weights, fp16 scales the loss",
       .default_text = "bf16 where the CPU has native bf16, else fp32", .commands = kTrain | kEstimate},
      {.flag = "--activation-checkpointing", .key = "activation_checkpointing", .group = G::model, .type = T::toggle,
       .field = &C::activation_checkpointing,
       .help = "recompute each block's forward in its backward: activation memory of one block, same results",
       .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--cpu-checkpointing", .key = "cpu_checkpointing", .aliases = {"activation_checkpointing.cpu_checkpointing"},
       .group = G::model, .type = T::toggle, .field = &C::cpu_checkpointing,
       .help = "with --activation-checkpointing: keep the saved block inputs in host memory (DeepSpeed's cpu_checkpointing)",
       .commands = kTrain | kEstimate, .changes_results = false},
      // data
      {.flag = "--data", .key = "data", .group = G::data, .type = T::text, .field = &C::data,
       .help = "glob of llm.c token shards, or a directory of IDX images (train-images-idx3-ubyte[.gz], ...)",
       .default_text = "the built-in Markov corpus (the default run)"},
      {.flag = "--val-data", .key = "val_data", .group = G::data, .type = T::text, .field = &C::val_data,
       .help = "glob of validation token shards, or an IDX directory",
       .default_text = "none (IDX: the t10k-* files beside --data's)"},
      {.flag = "--train-batch-size", .key = "train_batch_size", .aliases = {"train_batch_size"}, .group = G::data,
       .type = T::integer, .field = &C::train_batch_size, .lo = 0, .hi = kI32,
       .help = "sequences per optimizer step over all ranks (DeepSpeed's; derives --micro-batch or --grad-accum)",
       .default_text = "micro-batch x grad-accum x ranks"},
      {.flag = "--micro-batch", .key = "micro_batch", .aliases = {"train_micro_batch_size_per_gpu"}, .group = G::data,
       .type = T::integer, .field = &C::micro_batch, .lo = 1, .hi = 65536,
       .help = "sequences (or images) per rank per micro-step", .commands = kTrain | kEstimate},
      {.flag = "--seq", .key = "seq", .aliases = {"seq_len"}, .group = G::data, .type = T::integer, .field = &C::seq,
       .lo = 1, .hi = 1048576, .help = "tokens per sequence", .commands = kTrain | kEstimate},
      {.flag = "--grad-accum", .key = "grad_accum", .aliases = {"gradient_accumulation_steps"}, .group = G::data,
       .type = T::integer, .field = &C::grad_accum, .lo = 1, .hi = 1048576, .help = "micro-steps per optimizer step",
       .commands = kTrain | kEstimate},
      {.flag = "--steps", .key = "steps", .aliases = {"train_iters"}, .group = G::data, .type = T::integer,
       .field = &C::steps, .lo = 1, .hi = 100000000, .help = "optimizer steps (with --resume: the total)"},
      {.flag = "--epochs", .key = "epochs", .group = G::data, .type = T::integer, .field = &C::epochs, .lo = 0,
       .hi = 1000000, .help = "image data: passes over --data (instead of --steps)", .default_text = "0: --steps counts"},
      {.flag = "--seed", .key = "seed", .group = G::data, .type = T::integer, .field = &C::seed, .lo = 0, .hi = 1.8e19,
       .help = "seed of initialization, shuffling and dropout"},
      {.flag = "--no-shuffle", .key = "no_shuffle", .group = G::data, .type = T::toggle, .field = &C::no_shuffle,
       .help = "read batches in file order (llm.c's layout)"},
      {.flag = "--val-every", .key = "val_every", .group = G::data, .type = T::integer, .field = &C::val_every, .lo = 0,
       .hi = 100000000, .help = "validate every N steps", .default_text = "0: at the end (and each epoch)",
       .changes_results = false},
      {.flag = "--val-batches", .key = "val_batches", .group = G::data, .type = T::integer, .field = &C::val_batches,
       .lo = 1, .hi = 1000000, .help = "batches per validation", .changes_results = false},
      // optimizer and schedule
      {.flag = "--optimizer", .key = "optimizer", .group = G::optimizer, .type = T::choice, .field = &C::optimizer,
       .choices = {"adamw", "sgd"}, .help = "AdamW or torch.optim.SGD's rule (DeepSpeed: optimizer.type)",
       .commands = kTrain | kEstimate},
      {.flag = "--lr", .key = "lr", .aliases = {"optimizer.params.lr"}, .group = G::optimizer, .type = T::number,
       .field = &C::lr, .lo = 0, .hi = 10, .lo_open = true, .help = "peak learning rate"},
      {.flag = "--lr-schedule", .key = "lr_schedule", .group = G::optimizer, .type = T::choice, .field = &C::lr_schedule,
       .choices = {"constant", "cosine", "warmup-lr", "warmup-decay", "warmup-cosine"},
       .help = "the learning-rate schedule; warmup-* are DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR"},
      {.flag = "--warmup", .key = "warmup", .aliases = {"scheduler.params.warmup_num_steps"}, .group = G::optimizer,
       .type = T::integer, .field = &C::warmup, .lo = 0, .hi = 100000000, .help = "warmup steps"},
      {.flag = "--min-lr-frac", .key = "min_lr_frac", .aliases = {"scheduler.params.cos_min_ratio"}, .group = G::optimizer,
       .type = T::number, .field = &C::min_lr_frac, .lo = 0, .hi = 1,
       .help = "cosine, warmup-cosine: the floor as a fraction of --lr", .default_text = "0 (warmup-cosine: 1e-4)"},
      {.flag = "--warmup-type", .key = "warmup_type", .aliases = {"scheduler.params.warmup_type"}, .group = G::optimizer,
       .type = T::choice, .field = &C::warmup_type, .choices = {"log", "linear"},
       .help = "DeepSpeed schedules: the warmup's shape"},
      {.flag = "--warmup-min-lr", .key = "warmup_min_lr", .aliases = {"scheduler.params.warmup_min_lr"},
       .group = G::optimizer, .type = T::number, .field = &C::warmup_min_lr, .lo = 0, .hi = 10,
       .help = "warmup-lr, warmup-decay: the lr warmup starts from"},
      {.flag = "--warmup-min-ratio", .key = "warmup_min_ratio", .aliases = {"scheduler.params.warmup_min_ratio"},
       .group = G::optimizer, .type = T::number, .field = &C::warmup_min_ratio, .lo = 0, .hi = 1,
       .help = "warmup-cosine: warmup starts from --lr times this"},
      {.flag = "--total-steps", .key = "total_steps", .aliases = {"scheduler.params.total_num_steps"},
       .group = G::optimizer, .type = T::integer, .field = &C::total_steps, .lo = 0, .hi = 100000000,
       .help = "warmup-decay, warmup-cosine: the schedule's length", .default_text = "0: --steps"},
      {.flag = "--weight-decay", .key = "weight_decay", .aliases = {"optimizer.params.weight_decay"},
       .group = G::optimizer, .type = T::number, .field = &C::weight_decay, .lo = 0, .hi = 10, .hi_open = true,
       .help = "decoupled weight decay (AdamW: matrices and embeddings; SGD: every parameter, as torch)"},
      {.flag = "--beta1", .key = "beta1", .aliases = {"optimizer.params.betas[0]"}, .group = G::optimizer,
       .type = T::number, .field = &C::beta1, .lo = 0, .hi = 1, .hi_open = true, .help = "AdamW beta1"},
      {.flag = "--beta2", .key = "beta2", .aliases = {"optimizer.params.betas[1]"}, .group = G::optimizer,
       .type = T::number, .field = &C::beta2, .lo = 0, .hi = 1, .hi_open = true, .help = "AdamW beta2"},
      {.flag = "--eps", .key = "eps", .aliases = {"optimizer.params.eps"}, .group = G::optimizer, .type = T::number,
       .field = &C::eps, .lo = 0, .hi = 1, .lo_open = true, .hi_open = true, .help = "AdamW epsilon"},
      {.flag = "--momentum", .key = "momentum", .aliases = {"optimizer.params.momentum"}, .group = G::optimizer,
       .type = T::number, .field = &C::momentum, .lo = 0, .hi = 1, .help = "SGD momentum (0: none, no state)",
       .commands = kTrain | kEstimate},
      {.flag = "--dampening", .key = "dampening", .aliases = {"optimizer.params.dampening"}, .group = G::optimizer,
       .type = T::number, .field = &C::dampening, .lo = 0, .hi = 1, .help = "SGD dampening of the momentum"},
      {.flag = "--nesterov", .key = "nesterov", .aliases = {"optimizer.params.nesterov"}, .group = G::optimizer,
       .type = T::toggle, .field = &C::nesterov, .help = "SGD: Nesterov momentum (needs --momentum > 0, --dampening 0)"},
      {.flag = "--grad-clip", .key = "grad_clip", .aliases = {"gradient_clipping"}, .group = G::optimizer,
       .type = T::number, .field = &C::grad_clip, .lo = 0, .hi = kInf, .hi_open = true,
       .help = "clip the global gradient norm to this", .default_text = "0: off", .commands = kTrain | kEstimate},
      {.flag = "--loss-scale", .key = "loss_scale", .aliases = {"fp16.loss_scale"}, .group = G::optimizer,
       .type = T::number, .field = &C::loss_scale, .lo = 0, .hi = kInf, .hi_open = true,
       .help = "fp16: static loss scale", .default_text = "0: dynamic"},
      {.flag = "--initial-scale-power", .key = "initial_scale_power", .aliases = {"fp16.initial_scale_power"},
       .group = G::optimizer, .type = T::integer, .field = &C::initial_scale_power, .lo = 0, .hi = 64,
       .help = "fp16: the dynamic scale starts at 2^N"},
      {.flag = "--loss-scale-window", .key = "loss_scale_window", .aliases = {"fp16.loss_scale_window"},
       .group = G::optimizer, .type = T::integer, .field = &C::loss_scale_window, .lo = 1, .hi = kI32,
       .help = "fp16: steps without overflow before the scale doubles"},
      {.flag = "--hysteresis", .key = "hysteresis", .aliases = {"fp16.hysteresis"}, .group = G::optimizer,
       .type = T::integer, .field = &C::hysteresis, .lo = 1, .hi = kI32,
       .help = "fp16: overflows tolerated before the scale halves"},
      {.flag = "--min-loss-scale", .key = "min_loss_scale", .aliases = {"fp16.min_loss_scale"}, .group = G::optimizer,
       .type = T::number, .field = &C::min_loss_scale, .lo = 0, .hi = kInf, .lo_open = true, .hi_open = true,
       .help = "fp16: the lowest dynamic scale"},
      // ZeRO
      {.flag = "--zero-stage", .key = "zero_stage", .aliases = {"zero_optimization.stage"}, .group = G::zero,
       .type = T::integer, .field = &C::zero_stage, .lo = 0, .hi = 3,
       .help = "0: replicated; 1: optimizer state sharded; 2: + gradients; 3: + parameters",
       .default_text = "0 (estimate: every stage)", .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--reduce-bucket-size", .key = "reduce_bucket_size", .aliases = {"zero_optimization.reduce_bucket_size"},
       .group = G::zero, .type = T::integer, .field = &C::reduce_bucket_size, .lo = 0, .hi = kI32,
       .help = "gradient elements per all-reduce bucket (stage 0) or in flight before waiting (stages 2-3)",
       .default_text = "0: auto, the largest unit's elements",
       .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--allgather-bucket-size", .key = "allgather_bucket_size",
       .aliases = {"zero_optimization.allgather_bucket_size"}, .group = G::zero, .type = T::integer,
       .field = &C::allgather_bucket_size, .lo = 1, .hi = kI32, .help = "shard elements per all-gather",
       .changes_results = false},
      {.flag = "--stage3-prefetch-bucket-size", .key = "stage3_prefetch_bucket_size",
       .aliases = {"zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.prefetch_bucket_size"},
       .group = G::zero, .type = T::integer, .field = &C::stage3_prefetch_bucket_size, .lo = 0, .hi = kI64,
       .help = "stage 3: parameter elements gathered ahead", .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--stage3-param-persistence-threshold", .key = "stage3_param_persistence_threshold",
       .aliases = {"zero_optimization.stage3_param_persistence_threshold",
                   "zero_optimization.param_persistence_threshold"},
       .group = G::zero, .type = T::integer, .field = &C::stage3_param_persistence_threshold, .lo = 0, .hi = kI64,
       .help = "stage 3: units smaller than this many elements stay whole", .commands = kTrain | kEstimate,
       .changes_results = false},
      {.flag = "--early-step", .key = "early_step", .group = G::zero, .type = T::boolean, .field = &C::early_step,
       .help = "update each unit as soon as its gradients are final, during the rest of the backward (same numbers)",
       .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--transient-gradients", .key = "transient_gradients", .group = G::zero, .type = T::boolean,
       .field = &C::transient_gradients,
       .help = "stages 2-3: hold each gradient shard only until its update, where every step is one micro-step "
               "without clipping or fp16 scaling (same numbers, 4 bytes a parameter less)",
       .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--delayed-update", .key = "delayed_update", .group = G::zero, .type = T::toggle,
       .field = &C::delayed_update,
       .help = "ZeRO-Offload's one-step delayed parameter update on an optimizer thread (step s+1 uses the "
               "parameters of step s-1)",
       .commands = kTrain | kEstimate},
      {.flag = "--hpz-partition-size", .key = "hpz_partition_size", .aliases = {"zero_optimization.zero_hpz_partition_size"},
       .group = G::zero, .type = T::integer, .field = &C::hpz_partition_size, .lo = 1, .hi = 1048576,
       .help = "ZeRO++ hpZ (stage 3): a secondary copy of the parameters partitioned over groups of this many "
               "consecutive ranks (usually the ranks per host), so backward's gathers stay in the group (1: off)",
       .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--quantized-weights", .key = "quantized_weights", .aliases = {"zero_optimization.zero_quantized_weights"},
       .group = G::zero, .type = T::toggle, .field = &C::quantized_weights,
       .help = "ZeRO++ qwZ (stage 3): gather parameters as blockwise int8 with per-block scales",
       .commands = kTrain | kEstimate},
      {.flag = "--quantized-gradients", .key = "quantized_gradients", .group = G::zero, .type = T::integer,
       .field = &C::quantized_gradients, .lo = 0, .hi = 8,
       .help = "ZeRO++ qgZ (stage 3): reduce-scatter gradients as blockwise int8 or int4 all-to-alls, within then "
               "across hosts: 8 or 4 bits (0: off; DeepSpeed's zero_quantized_gradients true is 8)",
       .commands = kTrain | kEstimate},
      {.flag = "--comm-timeout", .key = "comm_timeout", .group = G::zero, .type = T::number, .field = &C::comm_timeout_s,
       .lo = 0, .hi = 1e7, .lo_open = true,
       .help = "seconds a rank waits for the others in a collective before the job ends, naming the ranks that did "
               "not arrive",
       .changes_results = false},
      {.flag = "--comm", .key = "comm", .group = G::zero, .type = T::choice, .field = &C::comm,
       .choices = {"nccl", "mpi"},
       .help = "the library of the collectives over device memory: nccl (one GPU per rank, --device cuda) or mpi "
               "(staged through pinned host memory where the device is a GPU)",
       .default_text = "nccl on cuda with more than one rank, each on its own GPU, and NCCL built; else mpi",
       .commands = kTrain | kEstimate, .changes_results = false},
      // offload
      {.flag = "--offload-optimizer", .key = "offload_optimizer", .aliases = {"zero_optimization.offload_optimizer.device"},
       .group = G::offload, .type = T::choice, .field = &C::offload_optimizer, .choices = {"none", "cpu", "nvme"},
       .help = "where fp32 master, moments and the optimizer step live (stages 1-3)", .commands = kTrain | kEstimate,
       .changes_results = false},
      {.flag = "--offload-param", .key = "offload_param", .aliases = {"zero_optimization.offload_param.device"},
       .group = G::offload, .type = T::choice, .field = &C::offload_param, .choices = {"none", "cpu", "nvme"},
       .help = "where stage 3's parameter shards live", .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--nvme-path", .key = "nvme_path",
       .aliases = {"zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_param.nvme_path"},
       .group = G::offload, .type = T::text, .field = &C::nvme_path,
       .help = "parent of the run's swap directories (a local disk; required with nvme)", .default_text = "none",
       .changes_results = false},
      {.flag = "--sub-group-size", .key = "sub_group_size", .aliases = {"zero_optimization.sub_group_size"},
       .group = G::offload, .type = T::integer, .field = &C::sub_group_size, .lo = 0, .hi = 1099511627776.0,
       .help = "optimizer elements swapped (and partially offloaded) at once",
       .default_text = "0: auto, staging at most an eighth of the offloaded state", .commands = kTrain | kEstimate,
       .changes_results = false},
      {.flag = "--offload-buffer-count", .key = "offload_buffer_count",
       .aliases = {"zero_optimization.offload_optimizer.buffer_count"}, .group = G::offload, .type = T::integer,
       .field = &C::offload_buffer_count, .lo = 1, .hi = optim::kMaxOffloadBufferCount, .help = "host staging buffers of the NVMe optimizer swap",
       .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--offload-optimizer-ratio", .key = "offload_optimizer_ratio",
       .aliases = {"zero_optimization.offload_optimizer.ratio"}, .group = G::offload, .type = T::number,
       .field = &C::offload_optimizer_ratio, .lo = 0, .hi = 1,
       .help = "share of the optimizer's sub-groups offloaded, the first ones", .commands = kTrain | kEstimate,
       .changes_results = false},
      {.flag = "--grad-accumulators", .key = "grad_accumulators", .group = G::offload, .type = T::choice,
       .field = &C::grad_accumulators, .choices = {"auto", "device", "host"},
       .help = "stages 2-3, optimizer offloaded: where the micro-steps' f32 gradient sums are kept (device: 4 bytes a "
               "parameter of the shard there, the sum copied to the host once a step, not twice a micro-step)",
       .default_text = "auto: device on a GPU with micro-steps to add, where it fits",
       .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--offload-optimizer-nvme-ratio", .key = "offload_optimizer_nvme_ratio", .group = G::offload,
       .type = T::number, .field = &C::offload_optimizer_nvme_ratio, .lo = 0, .hi = 1, .lo_open = true,
       .help = "with --offload-optimizer nvme: share of the offloaded sub-groups swapped, the first ones; the rest "
               "stay in host memory",
       .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--pipeline-read", .key = "pipeline_read", .aliases = {"zero_optimization.offload_optimizer.pipeline_read"},
       .group = G::offload, .type = T::boolean, .field = &C::pipeline_read,
       .help = "read the next sub-group while one steps", .changes_results = false},
      {.flag = "--pipeline-write", .key = "pipeline_write",
       .aliases = {"zero_optimization.offload_optimizer.pipeline_write"}, .group = G::offload, .type = T::boolean,
       .field = &C::pipeline_write, .help = "write a sub-group back while the next steps", .changes_results = false},
      {.flag = "--pin-memory", .key = "pin_memory",
       .aliases = {"zero_optimization.offload_optimizer.pin_memory", "zero_optimization.offload_param.pin_memory"},
       .group = G::offload, .type = T::boolean, .field = &C::pin_memory, .help = "mlock the staging buffers",
       .changes_results = false},
      {.flag = "--aio-block-size", .key = "aio_block_size", .aliases = {"aio.block_size"}, .group = G::offload,
       .type = T::integer, .field = &C::aio_block_size, .lo = io::AioConfig::kMinBlockBytes,
       .hi = io::AioConfig::kMaxBlockBytes, .multiple_of = io::AioConfig::kMinBlockBytes,
       .help = "bytes per swap I/O request", .changes_results = false},
      {.flag = "--aio-queue-depth", .key = "aio_queue_depth", .aliases = {"aio.queue_depth"}, .group = G::offload,
       .type = T::integer, .field = &C::aio_queue_depth, .lo = 1, .hi = io::AioConfig::kMaxQueueDepth,
       .help = "swap I/O requests in flight per io_uring ring", .changes_results = false},
      {.flag = "--aio-intra-op-parallelism", .key = "aio_intra_op_parallelism",
       .aliases = {"aio.intra_op_parallelism", "aio.thread_count"}, .group = G::offload, .type = T::integer,
       .field = &C::aio_intra_op_parallelism, .lo = 1, .hi = io::AioConfig::kMaxIntraOpParallelism, .help = "io_uring rings a swap transfer is spread over",
       .changes_results = false},
      {.flag = "--aio-single-submit", .key = "aio_single_submit", .aliases = {"aio.single_submit"}, .group = G::offload,
       .type = T::boolean, .field = &C::aio_single_submit, .help = "submit swap requests one at a time",
       .changes_results = false},
      {.flag = "--aio-overlap-events", .key = "aio_overlap_events", .aliases = {"aio.overlap_events"},
       .group = G::offload, .type = T::boolean, .field = &C::aio_overlap_events,
       .help = "submit new swap requests while others complete", .changes_results = false},
      {.flag = "--device-mem-limit", .key = "device_mem_limit", .group = G::offload, .type = T::number,
       .field = &C::device_mem_limit, .lo = 0, .hi = 1e9,
       .help = "GiB of device memory per rank; a plan beyond it is refused (estimate: says which stages fit)",
       .default_text = "0: no cap", .commands = kTrain | kEstimate, .cli_aliases = {"--device-mem"},
       .changes_results = false},
      // checkpoints
      {.flag = "--save", .key = "save", .group = G::checkpoints, .type = T::text, .field = &C::save,
       .help = "at the end, write the weights: a file is an llm.c GPT-2 checkpoint, a directory ('DIR/') a Hugging "
               "Face model directory (config.json + model.safetensors; GPT-2 or LLaMA)",
       .default_text = "none", .changes_results = false},
      {.flag = "--checkpoint-dir", .key = "checkpoint_dir", .aliases = {"checkpoint.dir"}, .group = G::checkpoints,
       .type = T::text, .field = &C::checkpoint_dir,
       .help = "sharded checkpoints (step-N/ and 'latest'), saved at the end and on a stop signal",
       .default_text = "none", .changes_results = false},
      {.flag = "--checkpoint-every", .key = "checkpoint_every", .aliases = {"checkpoint.every"}, .group = G::checkpoints,
       .type = T::integer, .field = &C::checkpoint_every, .lo = 0, .hi = 100000000,
       .help = "also save after every N steps", .changes_results = false},
      {.flag = "--keep-last", .key = "keep_last", .aliases = {"checkpoint.keep_last"}, .group = G::checkpoints,
       .type = T::integer, .field = &C::keep_last, .lo = 0, .hi = 1000000,
       .help = "keep only the newest K checkpoints", .default_text = "0: all", .changes_results = false},
      {.flag = "--resume", .key = "resume", .aliases = {"checkpoint.resume"}, .group = G::checkpoints, .type = T::toggle,
       .field = &C::resume,
       .help = "continue from the latest checkpoint in --checkpoint-dir at any world size, micro-batch, accumulation, "
               "stage and offload: the same global batch continues the run's trajectory; a notice names every "
               "setting that changes results and differs",
       .changes_results = false},
      {.flag = "--checkpoint-async", .key = "checkpoint_async", .aliases = {"checkpoint.async"}, .group = G::checkpoints,
       .type = T::toggle, .field = &C::checkpoint_async,
       .help = "write checkpoints in the background: the step stalls only to copy the state", .changes_results = false},
      // output
      {.flag = "--metrics", .key = "metrics", .group = G::output, .type = T::text, .field = &C::metrics,
       .help = "one JSON line per step (and the run's settings)", .default_text = "none", .changes_results = false},
      {.flag = "--report", .key = "report", .group = G::output, .type = T::text, .field = &C::report,
       .help = "an HTML report of the run at the end (needs --metrics)", .default_text = "none",
       .changes_results = false},
      {.flag = "--tensorboard", .key = "tensorboard_dir", .group = G::output, .type = T::text,
       .field = &C::tensorboard_dir, .help = "TensorBoard event files in this directory (DeepSpeed's tensorboard block)",
       .default_text = "none", .changes_results = false},
      {.flag = "--csv-monitor", .key = "csv_monitor_dir", .group = G::output, .type = T::text,
       .field = &C::csv_monitor_dir, .help = "one CSV per metric in this directory (DeepSpeed's csv_monitor block)",
       .default_text = "none", .changes_results = false},
      {.flag = "--peak-tflops", .key = "peak_tflops", .group = G::output, .type = T::number, .field = &C::peak_tflops,
       .lo = 0, .hi = 1e9, .help = "TFLOP/s per rank that MFU is measured against",
       .default_text = "0: the host's GEMM peak measured at start-up; on cuda a known GPU's dense 16-bit peak, else none", .changes_results = false},
      {.flag = "--profile", .key = "profile", .group = G::output, .type = T::toggle, .field = &C::profile,
       .help = "print where step time goes (GEMM, attention, elementwise, optimizer, comm, data, swap, host-device transfers; on a GPU each operation is timed on the device, the rest is its idle)",
       .ranks_must_agree = false, .changes_results = false},
      // run
      {.flag = "--device", .key = "device", .group = G::run, .type = T::choice, .field = &C::device,
       .choices = {"cpu", "sim", "cuda"},
       .help = "where compute runs: cpu, sim (a simulated device the host cannot touch) or cuda",
       .default_text = "cuda where a GPU and the CUDA backend are present, else cpu",
       .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--cuda-attention", .key = "cuda_attention", .group = G::run, .type = T::choice,
       .field = &C::cuda_attention, .choices = {"flash", "plain"},
       .help = "attention kernels of --device cuda: flash (no (B, NH, T, T) matrix in memory) or plain (keeps it; "
               "to bisect a GPU failure)",
       .default_text = "flash", .commands = kTrain | kEstimate, .changes_results = false},
      {.flag = "--threads", .key = "threads", .group = G::run, .type = T::integer, .field = &C::threads, .lo = 0,
       .hi = 4096, .help = "OpenMP threads per rank", .default_text = "0: the cores / ranks on this host",
       .ranks_must_agree = false, .changes_results = false},
  };
  return t;
}

template <typename F>
decltype(auto) with_field(const Setting& s, const TrainConfig& cfg, F&& f) {
  return std::visit([&](auto member) -> decltype(auto) { return f(cfg.*member); }, s.field);
}

std::string shortest(double x, bool is_float) {
  char buf[64];
  std::to_chars_result r = is_float ? std::to_chars(buf, buf + sizeof buf, static_cast<float>(x), std::chars_format::general)
                                    : std::to_chars(buf, buf + sizeof buf, x, std::chars_format::general);
  return std::string(buf, r.ptr);
}

std::string number_text(double x) {  // for ranges: 1e+09 -> 1000000000
  if (x == std::floor(x) && std::abs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
  return shortest(x, false);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const char* setting_group_title(SettingGroup g) {
  switch (g) {
    case G::model: return "Model";
    case G::data: return "Data and batches";
    case G::optimizer: return "Optimizer, schedule and loss scaling";
    case G::zero: return "ZeRO";
    case G::offload: return "Offload and device memory";
    case G::checkpoints: return "Checkpoints and saved weights";
    case G::output: return "Output";
    case G::run: return "Run";
  }
  return "";
}

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = [] {
    std::vector<Setting> t = build_table();
    const TrainConfig defaults;
    for (Setting& s : t)
      if (s.default_text.empty()) {
        s.default_text = setting_value_text(s, defaults);
        if (s.type == T::toggle) s.default_text = "off";
      }
    return t;
  }();
  return table;
}

const Setting* find_setting(std::string_view flag) {
  for (const Setting& s : settings()) {
    if (s.flag == flag) return &s;
    for (const std::string& a : s.cli_aliases)
      if (a == flag) return &s;
  }
  return nullptr;
}

const Setting* find_setting_by_key(std::string_view key) {
  for (const Setting& s : settings()) {
    if (s.key == key) return &s;
    for (const std::string& a : s.aliases)
      if (a == key) return &s;
  }
  return nullptr;
}

std::string nearest_setting_key(std::string_view key, const std::vector<std::string>& extra) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  auto consider = [&](const std::string& candidate) {
    // Compare like with like: a dotted key against dotted keys' last parts too.
    size_t d = edit_distance(key, candidate);
    if (const size_t dot = candidate.rfind('.'); key.find('.') == std::string_view::npos && dot != std::string::npos)
      d = std::min(d, edit_distance(key, std::string_view(candidate).substr(dot + 1)) + 1);
    if (d < best_d) {
      best_d = d;
      best = candidate;
    }
  };
  for (const Setting& s : settings()) {
    consider(s.key);
    for (const std::string& a : s.aliases) consider(a);
  }
  for (const std::string& e : extra) consider(e);
  // Close: at most a third of the key's letters differ (typos, another separator, a plural).
  return best_d <= std::max<size_t>(1, key.size() / 3) && best_d < key.size() ? best : "";
}

std::string setting_value_text(const Setting& s, const TrainConfig& cfg) {
  return with_field(s, cfg, [](const auto& v) -> std::string {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, std::string>) return v;
    else if constexpr (std::is_same_v<V, bool>) return v ? "true" : "false";
    else if constexpr (std::is_same_v<V, float>) return shortest(v, true);
    else if constexpr (std::is_same_v<V, double>) return shortest(v, false);
    else return std::to_string(v);
  });
}

std::string setting_value_json(const Setting& s, const TrainConfig& cfg) {
  return with_field(s, cfg, [](const auto& v) -> std::string {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, std::string>) return nlohmann::json(v).dump();
    else if constexpr (std::is_same_v<V, bool>) return v ? "true" : "false";
    else if constexpr (std::is_same_v<V, float>) return shortest(v, true);
    else if constexpr (std::is_same_v<V, double>) return shortest(v, false);
    else return std::to_string(v);
  });
}

bool setting_is_default(const Setting& s, const TrainConfig& cfg) {
  static const TrainConfig defaults;
  return setting_value_text(s, cfg) == setting_value_text(s, defaults);
}

std::string range_text(const Setting& s) {
  switch (s.type) {
    case T::integer: {
      std::string text = s.hi >= kI64 ? str_cat("an integer >= ", number_text(s.lo))
                                       : str_cat("an integer in ", number_text(s.lo), "..", number_text(s.hi));
      if (s.multiple_of > 0) text += str_cat(", a multiple of ", s.multiple_of);
      return text;
    }
    case T::number:
      if (std::isinf(s.hi)) return str_cat("a finite number ", s.lo_open ? "> " : ">= ", number_text(s.lo));
      return str_cat("a number in ", s.lo_open ? "(" : "[", number_text(s.lo), ", ", number_text(s.hi),
                     s.hi_open ? ")" : "]");
    case T::toggle:
    case T::boolean: return "true or false";
    case T::choice: {
      std::string text;
      for (size_t i = 0; i < s.choices.size(); ++i)
        text += str_cat(i == 0 ? "" : i + 1 == s.choices.size() ? " or " : ", ", s.choices[i]);
      return text;
    }
    case T::text: return "a string";
  }
  return "";
}

void check_setting(const Setting& s, const TrainConfig& cfg) {
  const std::string name = setting_name(cfg, s.flag);
  switch (s.type) {
    case T::integer: {
      const bool ok = with_field(s, cfg, [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool>) {
          ZERONE_CHECK(!(std::is_signed_v<V> && v < 0 && s.lo == 0), name, " ", v, " is negative");
          const double x = static_cast<double>(v);
          return x >= s.lo && x <= s.hi && (s.multiple_of == 0 || static_cast<int64_t>(v) % s.multiple_of == 0);
        }
        return true;
      });
      ZERONE_CHECK(ok, name, " ", setting_value_text(s, cfg), " is out of range: expected ", range_text(s));
      return;
    }
    case T::number: {
      const double x = with_field(s, cfg, [](const auto& v) -> double {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_floating_point_v<V>) return static_cast<double>(v);
        return 0.0;
      });
      const bool ok = std::isfinite(x) && (s.lo_open ? x > s.lo : x >= s.lo) && (s.hi_open ? x < s.hi : x <= s.hi);
      ZERONE_CHECK(ok, name, " ", setting_value_text(s, cfg), " is out of range: expected ", range_text(s));
      return;
    }
    case T::choice: {
      const std::string v = setting_value_text(s, cfg);
      // An empty value means "the default" (precision, device: decided at start-up).
      ZERONE_CHECK(v.empty() || std::find(s.choices.begin(), s.choices.end(), v) != s.choices.end(), name, " '", v,
                   "': expected ", range_text(s));
      return;
    }
    default: return;
  }
}

std::string effective_config_json(const TrainConfig& cfg, const std::string& resolved_precision) {
  nlohmann::ordered_json out;
  for (const Setting& s : settings()) {
    if (!(s.commands & kTrain)) continue;
    std::string value = setting_value_json(s, cfg);
    if (s.flag == "--precision") value = nlohmann::json(resolved_precision).dump();
    // train_batch_size is derived from the three; written only as the user gave it (another world
    // size then derives the rest again).
    const bool needed = s.flag == "--precision" || !setting_is_default(s, cfg) || cfg.is_given(s.flag);
    if (!needed) continue;
    if (s.type == T::toggle && value == "false" && !cfg.is_given(s.flag)) continue;
    if (s.type == T::text && value == "\"\"") continue;  // unset paths: nothing to say
    out[s.key] = nlohmann::ordered_json::parse(value);
  }
  return out.dump(2);
}

std::vector<std::pair<std::string, std::string>> agreeing_settings(const TrainConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> list;
  for (const Setting& s : settings())
    if (s.ranks_must_agree) list.emplace_back(s.flag, setting_value_text(s, cfg));
  return list;
}

std::vector<std::pair<std::string, std::string>> result_settings(const TrainConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> list;
  for (const Setting& s : settings())
    if (s.changes_results) list.emplace_back(s.key, setting_value_text(s, cfg));
  return list;
}

}  // namespace zerone::train
