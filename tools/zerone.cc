// The `zerone` command-line program: parse, validate, call the libraries. Nothing else lives here.

#include <CLI/CLI.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <new>
#include <system_error>
#include <iostream>

#include "zerone/comm/communicator.h"
#include "zerone/core/error.h"
#include "zerone/core/sysinfo.h"
#include "zerone/io/prepare.h"
#include "zerone/io/tokenizer.h"
#include "zerone/kernels/cpu/matmul.h"
#include "zerone/nn/model.h"
#include "zerone/report/html_report.h"
#include "zerone/train/config.h"
#include "zerone/train/interrupt.h"
#include "zerone/train/metrics.h"
#include "zerone/io/convert.h"
#include "zerone/train/sample.h"
#include "zerone/train/trainer.h"
#include "zerone/zero/estimate.h"
#include <nlohmann/json.hpp>
#if ZERONE_HAVE_CUDA
#include "zerone/kernels/cuda/device.h"
#endif

namespace {

using namespace zerone;

void add_train_flags(CLI::App& cmd, train::TrainConfig& c, std::string& config_path) {
  cmd.add_option("--config", config_path, "JSON config (DeepSpeed-style keys); flags override it");
  cmd.add_option("--model", c.model,
                 "preset (gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, tinyllama-1.1b, llama-3.2-1b, llama-2-7b, "
                 "llama-3-8b), gpt2:layers=..,dim=..,heads=..,vocab=..,ctx=.. or "
                 "llama:layers=..,dim=..,heads=..,kv_heads=..,ffn=..,vocab=..,ctx=..");
  cmd.add_option("--init", c.init,
                 "weights to start from: an llm.c GPT-2 file (v3 f32 / v5 bf16), a Hugging Face model directory, or a "
                 "zerone checkpoint directory");
  cmd.add_option("--data", c.data, "glob of llm.c token shards, or a directory of IDX images (train-images-idx3-ubyte[.gz], "
                 "train-labels-idx1-ubyte[.gz]); without it, the built-in Markov corpus");
  cmd.add_option("--val-data", c.val_data, "glob of validation token shards, or an IDX directory (t10k-*; default: "
                 "the t10k-* files beside --data's)");
  cmd.add_option("--save", c.save, "write an llm.c checkpoint here at the end");
  cmd.add_option("--train-batch-size", c.train_batch_size,
                 "sequences per optimizer step over all ranks (DeepSpeed's train_batch_size; derives --micro-batch or --grad-accum)");
  cmd.add_option("--micro-batch", c.micro_batch, "sequences per micro-step (B)");
  cmd.add_option("--seq", c.seq, "tokens per sequence (T)");
  cmd.add_option("--grad-accum", c.grad_accum, "micro-steps per optimizer step");
  cmd.add_option("--steps", c.steps, "optimizer steps");
  cmd.add_option("--lr", c.lr, "peak learning rate");
  cmd.add_option("--warmup", c.warmup, "warmup steps (DeepSpeed schedules: warmup_num_steps)");
  cmd.add_option("--lr-schedule", c.lr_schedule,
                 "constant, cosine, or DeepSpeed's warmup-lr (WarmupLR), warmup-decay (WarmupDecayLR), warmup-cosine (WarmupCosineLR)");
  cmd.add_option("--min-lr-frac", c.min_lr_frac, "cosine floor as a fraction of --lr (warmup-cosine: cos_min_ratio, default 1e-4)");
  cmd.add_option("--warmup-type", c.warmup_type, "DeepSpeed schedules: log (default) or linear warmup");
  cmd.add_option("--warmup-min-lr", c.warmup_min_lr, "warmup-lr, warmup-decay: lr the warmup starts from (0)");
  cmd.add_option("--warmup-min-ratio", c.warmup_min_ratio, "warmup-cosine: warmup starts from --lr times this (0)");
  cmd.add_option("--total-steps", c.total_steps, "warmup-decay, warmup-cosine: total_num_steps (default --steps)");
  cmd.add_option("--weight-decay", c.weight_decay, "AdamW weight decay (matrices and embeddings)");
  cmd.add_option("--beta1", c.beta1, "AdamW beta1");
  cmd.add_option("--beta2", c.beta2, "AdamW beta2");
  cmd.add_option("--eps", c.eps, "AdamW epsilon");
  cmd.add_option("--optimizer", c.optimizer, "adamw (default) or sgd (torch.optim.SGD's rule)");
  cmd.add_option("--momentum", c.momentum, "SGD momentum (0: none)");
  cmd.add_option("--dampening", c.dampening, "SGD dampening of the momentum (0)");
  cmd.add_flag("--nesterov", c.nesterov, "SGD: Nesterov momentum (needs --momentum > 0, --dampening 0)");
  cmd.add_option("--epochs", c.epochs, "image data: passes over --data (instead of --steps)");
  cmd.add_option("--grad-clip", c.grad_clip, "clip the global gradient norm to this (0: off)");
  cmd.add_option("--precision", c.precision, "fp32, bf16 or fp16 (default: bf16 where the CPU has it)");
  cmd.add_option("--loss-scale", c.loss_scale, "fp16: static loss scale (0: dynamic, the default)");
  cmd.add_option("--initial-scale-power", c.initial_scale_power, "fp16: dynamic scale starts at 2^N (16)");
  cmd.add_option("--loss-scale-window", c.loss_scale_window, "fp16: steps without overflow before doubling (1000)");
  cmd.add_option("--hysteresis", c.hysteresis, "fp16: overflows tolerated before halving (2)");
  cmd.add_option("--min-loss-scale", c.min_loss_scale, "fp16: lowest dynamic scale (1)");
  cmd.add_option("--zero-stage", c.zero_stage, "ZeRO stage 0..3");
  cmd.add_option("--reduce-bucket-size", c.reduce_bucket_size, "gradient elements per all-reduce bucket (stage 0) / in flight before waiting (stages 2-3)");
  cmd.add_option("--allgather-bucket-size", c.allgather_bucket_size, "elements per parameter all-gather bucket");
  cmd.add_option("--stage3-prefetch-bucket-size", c.stage3_prefetch_bucket_size, "elements of units prefetched ahead (stage 3)");
  cmd.add_option("--stage3-param-persistence-threshold", c.stage3_param_persistence_threshold,
                 "units smaller than this many elements stay whole (stage 3)");
  cmd.add_option("--seed", c.seed, "seed for initialisation and shuffling");
  cmd.add_flag("--no-shuffle", c.no_shuffle, "read batches in order (llm.c's layout)");
  cmd.add_option("--metrics", c.metrics, "write one JSON line per step here");
  cmd.add_option("--peak-tflops", c.peak_tflops,
                 "TFLOP/s per rank that MFU is measured against (default: the GEMM peak measured at start-up)");
  cmd.add_option("--report", c.report, "write an HTML report of the run here at the end (needs --metrics)");
  cmd.add_option("--tensorboard", c.tensorboard_dir,
                 "write TensorBoard event files into this directory (DeepSpeed's tensorboard block)");
  cmd.add_option("--csv-monitor", c.csv_monitor_dir,
                 "write one CSV per metric into this directory (DeepSpeed's csv_monitor block)");
  cmd.add_option("--threads", c.threads, "OpenMP threads (0: all cores)");
  cmd.add_option("--val-every", c.val_every, "validate every N steps (0: at the end)");
  cmd.add_option("--val-batches", c.val_batches, "batches per validation");
  cmd.add_flag("--profile", c.profile, "report where step time goes (after the first step)");
  cmd.add_flag("--activation-checkpointing", c.activation_checkpointing,
               "recompute each block's forward in its backward: activation memory of one block, same results");
  cmd.add_flag("--cpu-checkpointing", c.cpu_checkpointing,
               "with --activation-checkpointing: keep the saved block inputs in host memory, off the device "
               "(DeepSpeed's cpu_checkpointing; same results)");
  cmd.add_flag("--delayed-update", c.delayed_update,
               "ZeRO-Offload's delayed parameter update: step s's optimizer runs beside step s+1's forward and "
               "backward, which use the parameters of step s-1 (off)");
  cmd.add_option("--early-step", c.early_step,
                 "update each unit as soon as its gradients are final, during the backward of the rest "
                 "(true/false; same numbers either way; with --grad-clip or fp16 and NVMe offload a speculation, validated or redone)");
  cmd.add_option("--hpz-partition-size", c.hpz_partition_size,
                 "ZeRO++ hpZ (stage 3): keep a secondary copy of the parameters partitioned over groups of this "
                 "many consecutive ranks (usually the ranks per host), so backward's gathers stay in the group "
                 "(1: off; same results)");
  cmd.add_flag("--quantized-weights", c.quantized_weights,
               "ZeRO++ qwZ (stage 3): gather parameters as blockwise int8 (changes results)");
  cmd.add_option("--quantized-gradients", c.quantized_gradients,
                 "ZeRO++ qgZ (stage 3): reduce-scatter gradients as blockwise int8 or int4 all-to-alls, within "
                 "then across hosts: 8 or 4 bits (0: off; changes results)");
  cmd.add_option("--device", c.device,
                 "where compute runs: cpu, sim (a simulated device the host cannot touch) or cuda; default: cuda "
                 "when a GPU and the CUDA backend are present, else cpu");
  cmd.add_option("--device-mem-limit", c.device_mem_limit, "GiB of device memory per rank (0: no cap); a plan beyond it is refused");
  cmd.add_option("--offload-optimizer", c.offload_optimizer, "none, cpu or nvme: where fp32 master, moments and the step live (stages 1-3)");
  cmd.add_option("--offload-param", c.offload_param, "none, cpu or nvme: where stage 3's parameter shards live");
  cmd.add_option("--nvme-path", c.nvme_path, "directory for swap files (NVMe offload; one subdirectory per run and rank)");
  cmd.add_option("--sub-group-size", c.sub_group_size, "optimizer elements swapped at once (NVMe offload)");
  cmd.add_option("--offload-buffer-count", c.offload_buffer_count, "staging buffers of the optimizer swap (NVMe offload)");
  cmd.add_option("--offload-optimizer-ratio", c.offload_optimizer_ratio,
                 "share of the optimizer's sub-groups offloaded, the first ones (DeepSpeed's offload_optimizer.ratio; 1)");
  cmd.add_option("--pipeline-read", c.pipeline_read, "read the next sub-group while one steps (true/false)");
  cmd.add_option("--pipeline-write", c.pipeline_write, "write a sub-group back while the next steps (true/false)");
  cmd.add_option("--pin-memory", c.pin_memory, "lock the staging buffers in memory (true/false)");
  cmd.add_option("--aio-block-size", c.aio_block_size, "bytes per swap I/O request");
  cmd.add_option("--aio-queue-depth", c.aio_queue_depth, "swap I/O requests in flight per io_uring ring");
  cmd.add_option("--aio-intra-op-parallelism", c.aio_intra_op_parallelism, "io_uring rings a swap transfer is spread over");
  cmd.add_option("--aio-single-submit", c.aio_single_submit, "submit swap requests one by one (true/false)");
  cmd.add_option("--aio-overlap-events", c.aio_overlap_events, "submit new swap requests while others complete (true/false)");
  cmd.add_option("--checkpoint-dir", c.checkpoint_dir,
                 "directory of sharded checkpoints (step-N/ and a 'latest' pointer); saved at the end and on a stop signal");
  cmd.add_option("--checkpoint-every", c.checkpoint_every, "also save after every N steps");
  cmd.add_option("--keep-last", c.keep_last, "keep only the newest K checkpoints (0: all)");
  cmd.add_flag("--resume", c.resume, "continue from the latest checkpoint in --checkpoint-dir (--steps is the total)");
  cmd.add_flag("--checkpoint-async", c.checkpoint_async,
               "write checkpoints in the background: the step stalls only to copy the state");
}

int cmd_info() {
  CpuInfo cpu = cpu_info();
  auto yes = [](bool b) { return b ? "yes" : "no"; };
  std::printf("zerone %s\n", "0.1.0");
  std::printf("cpu          %s (%d logical cores)\n", cpu.model_name.c_str(), cpu.logical_cores);
  std::printf("  avx2       %s\n  avx512f    %s\n  avx512_bf16 %s\n  amx_tile   %s\n  amx_bf16   %s\n", yes(cpu.avx2),
              yes(cpu.avx512f), yes(cpu.avx512_bf16), yes(cpu.amx_tile), yes(cpu.amx_bf16));
  std::printf("memory       %s\n", train::human_bytes(static_cast<double>(physical_memory_bytes())).c_str());
  std::printf("oneDNN       %s\n", kernels::cpu::onednn_version_string());
  std::printf("default precision %s\n", dtype_name(train::resolve_precision("")));
  std::printf("MPI          %s\n", comm::mpi_library_version().c_str());
#if ZERONE_HAVE_CUDA
  std::printf("CUDA         compiled in (%s)\n", cuda::version_string().c_str());
  auto devs = cuda::devices();
  if (devs.empty()) std::printf("  devices    none found (GPU kernels will be skipped)\n");
  for (const auto& d : devs)
    std::printf("  device %d   %s, sm_%d%d, %d SMs, %s\n", d.index, d.name.c_str(), d.compute_major, d.compute_minor,
                d.multiprocessors, train::human_bytes(static_cast<double>(d.total_memory_bytes)).c_str());
#else
  std::printf("CUDA         not compiled in\n");
#endif
  std::printf("NCCL         not compiled in\n");
  std::string devices;
  for (kernels::DeviceKind d : kernels::available_devices())
    devices += str_cat(devices.empty() ? "" : ", ", kernels::device_kind_name(d));
  std::printf("devices      %s (default %s)\n", devices.c_str(), kernels::device_kind_name(kernels::default_device()));
  return 0;
}

struct EstimateArgs {
  std::string model, precision;
  int world = 1, stage = 0, micro_batch = 4, seq = 64;
  double device_mem_gib = 0.0;
  int64_t persistence_threshold = 100'000;
  int64_t reduce_bucket_numel = 500'000'000, prefetch_numel = 50'000'000;
  std::string offload_optimizer = "none", offload_param = "none";
  int64_t sub_group_size = 1'000'000'000;
  int buffer_count = 4;
  double ratio = 1.0;
  bool delayed_update = false;
  bool json = false;
  bool activation_checkpointing = false;
  bool cpu_checkpointing = false;
  bool seq_given = false;
  double grad_clip = 0.0;
  bool early_step = true;
  std::string optimizer = "adamw";  // as for train: its state is what is estimated
  double momentum = 0.0;
  bool momentum_given = false;
};

int cmd_estimate(const EstimateArgs& a, bool stage_given) {
  DType dtype = train::resolve_precision(a.precision);
  std::unique_ptr<nn::Model> shape = nn::make_model(a.model, dtype, 64, /*allocate=*/false);
  ZERONE_CHECK(!a.cpu_checkpointing || a.activation_checkpointing,
               "--cpu-checkpointing keeps the inputs that activation checkpointing saves: give --activation-checkpointing too");
  shape->set_activation_checkpointing(a.activation_checkpointing);
  shape->set_cpu_checkpointing(a.cpu_checkpointing);
  const nn::Model& model = *shape;
  ZERONE_CHECK(std::isfinite(a.device_mem_gib) && a.device_mem_gib >= 0.0, "--device-mem ", a.device_mem_gib,
               " is out of range: expected a finite number of GiB >= 0");
  ZERONE_CHECK(a.persistence_threshold >= 0, "--stage3-param-persistence-threshold is negative");
  ZERONE_CHECK(a.reduce_bucket_numel >= 1, "--reduce-bucket-size ", a.reduce_bucket_numel,
               " must be at least 1 element");
  ZERONE_CHECK(a.prefetch_numel >= 0, "--stage3-prefetch-bucket-size ", a.prefetch_numel, " is negative");
  // Image classifiers read one sample per row: --seq does not apply to them.
  const bool classifier = model.input_kind() == nn::InputKind::features;
  ZERONE_CHECK(!classifier || !a.seq_given, "--seq applies to token models; ", model.spec(), " reads one image per sample");
  const int seq = classifier ? 1 : a.seq;
  ZERONE_CHECK(seq <= model.max_seq_len(), "--seq ", seq, " exceeds the model's context length ", model.max_seq_len());
  zero::ZeroConfig base;
  base.persistence_threshold = static_cast<size_t>(a.persistence_threshold);
  base.reduce_bucket_numel = static_cast<size_t>(a.reduce_bucket_numel);
  base.prefetch_numel = static_cast<size_t>(a.prefetch_numel);
  base.offload_optimizer = zero::parse_offload_device(a.offload_optimizer, "--offload-optimizer");
  base.offload_param = zero::parse_offload_device(a.offload_param, "--offload-param");
  ZERONE_CHECK(a.sub_group_size >= 1, "--sub-group-size ", a.sub_group_size, " must be at least 1 element");
  ZERONE_CHECK(a.buffer_count >= 1 && a.buffer_count <= 64, "--offload-buffer-count ", a.buffer_count,
               " is out of range: expected 1..64");
  base.sub_group_numel = static_cast<size_t>(a.sub_group_size);
  base.optimizer_buffer_count = a.buffer_count;
  // Note [Speculative early step]: undo copies and spare slots, as train keeps them (only with
  // NVMe offload and no partial optimizer offload, zero::speculates).
  base.early_step = a.early_step;
  base.speculative_step = a.early_step && (a.grad_clip > 0.0 || dtype == DType::f16);
  ZERONE_CHECK(a.optimizer == "adamw" || a.optimizer == "sgd", "--optimizer '", a.optimizer, "': expected adamw or sgd");
  ZERONE_CHECK(a.optimizer == "sgd" || !a.momentum_given, "--momentum applies to --optimizer sgd; the optimizer is ",
               a.optimizer);
  ZERONE_CHECK(std::isfinite(a.momentum) && a.momentum >= 0.0, "--momentum ", a.momentum,
               " is out of range: expected a finite number >= 0");
  ZERONE_CHECK(std::isfinite(a.ratio) && a.ratio >= 0.0 && a.ratio <= 1.0, "--offload-optimizer-ratio ", a.ratio,
               " is out of range: expected a number in [0, 1]");
  ZERONE_CHECK(a.ratio == 1.0 || base.offload_optimizer != zero::OffloadDevice::none, "--offload-optimizer-ratio ",
               a.ratio, " offloads a part of the optimizer, but --offload-optimizer is none: give --offload-optimizer cpu or nvme");
  base.offload_optimizer_ratio = a.ratio;
  base.delayed_update = a.delayed_update;
  optim::OptimizerOptions optimizer = optim::AdamWOptions{};
  if (a.optimizer == "sgd") optimizer = optim::SGDOptions{static_cast<float>(a.momentum)};
  auto rows = zero::estimate(model, a.world, dtype, a.micro_batch, seq, base, optimizer,
                             stage_given ? std::optional<int>(a.stage) : std::nullopt);
  const double limit = a.device_mem_gib * 1024.0 * 1024.0 * 1024.0;
  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = model.spec();
    j["parameters"] = model.num_parameters();
    j["world"] = a.world;
    j["precision"] = dtype_name(dtype);
    j["optimizer"] = a.optimizer;
    j["micro_batch"] = a.micro_batch;
    j["seq"] = seq;
    for (const auto& r : rows) {
      nlohmann::ordered_json s;
      s["stage"] = r.stage;
      s["param"] = r.model_state.param;
      s["grad"] = r.model_state.grad;
      s["master"] = r.model_state.master;
      s["optim"] = r.model_state.optim;
      s["model_state"] = r.model_state.total();
      if (r.model_state.speculation != 0) s["speculation"] = r.model_state.speculation;  // Note [Speculative early step]
      s["working_set"] = {{"param", r.working_set.param}, {"grad", r.working_set.grad}, {"comm", r.working_set.comm},
                          {"host", r.working_set.host}, {"total", r.working_set.total()}};
      s["activation"] = r.activations + r.host_activations;
      s["activation_places"] = {{"device", r.activations}, {"host", r.host_activations}};
      s["total"] = r.total();
      // Where the bytes live (Note [Offload places]): device = model state there + working set +
      // activations; "places" has every (place, category) the ledger will show.
      s["device"] = r.device();
      s["host"] = r.host();
      s["nvme"] = r.nvme();
      nlohmann::ordered_json places = nlohmann::ordered_json::object();
      for (size_t p = 0; p < MemoryLedger::kPlaces; ++p)
        for (size_t c = 0; c < MemoryLedger::kCategories; ++c)
          if (int64_t b = r.model_state.placed.get(static_cast<MemPlace>(p), static_cast<MemCategory>(c)); b != 0)
            places[str_cat(mem_place_name(static_cast<MemPlace>(p)), ".", mem_category_name(static_cast<MemCategory>(c)))] = b;
      s["model_state_places"] = places;
      if (limit > 0) s["fits"] = static_cast<double>(r.device()) <= limit;
      j["stages"].push_back(s);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model %s (%zu parameters), world %d, %s, %s, micro-batch %d x seq %d, offload optimizer %s, param %s; "
              "bytes per rank:\n",
              model.spec().c_str(), model.num_parameters(), a.world, dtype_name(dtype),
              a.optimizer == "sgd" ? str_cat("sgd (momentum ", a.momentum, ")").c_str() : "adamw", a.micro_batch, seq,
              a.offload_optimizer.c_str(), a.offload_param.c_str());
  std::printf("%-6s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s%s\n", "stage", "param", "grad", "master", "optim",
              "model", "working set", "activation", "device", "host", "nvme", "in memory", limit > 0 ? "  fits" : "");
  auto h = [](int64_t b) { return train::human_bytes(static_cast<double>(b)); };
  for (const auto& r : rows) {
    std::printf("%-6d %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s%s\n", r.stage, h(r.model_state.param).c_str(),
                h(r.model_state.grad).c_str(), h(r.model_state.master).c_str(), h(r.model_state.optim).c_str(),
                h(r.model_state.total()).c_str(), h(r.working_set.total()).c_str(), h(r.activations + r.host_activations).c_str(),
                h(r.device()).c_str(), h(r.host()).c_str(), h(r.nvme()).c_str(), h(r.total()).c_str(),
                limit > 0 ? (static_cast<double>(r.device()) <= limit ? "  yes" : "  no") : "");
  }
  return 0;
}

// Note [Strict numbers]: CLI11 2.1 reads "0010" as octal 8 and "0x10" as 16, wraps "-1" into an
// unsigned seed, clamps an overflowing 64-bit value, and an empty value ("--data ''") would pass as
// "not given". Every option's value is therefore checked as text first: not empty, integers in plain
// decimal without leading zeros that fit 64 bits (no sign for unsigned), numbers without hex
// forms. Ranges per flag are then checked by train::validate and the commands.
std::string strict_value_error(const std::string& value, const std::string& type) {
  if (value.empty()) return "an empty value is not allowed";
  const bool is_int = type.rfind("INT", 0) == 0, is_uint = type.rfind("UINT", 0) == 0;
  if (!is_int && !is_uint && type.rfind("FLOAT", 0) != 0) return "";
  std::string digits = value;
  if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) digits.erase(0, 1);
  if (digits.size() > 1 && digits[0] == '0' && std::isdigit(static_cast<unsigned char>(digits[1])))
    return str_cat("'", value, "' has a leading zero (write decimal numbers without one)");
  if (digits.size() > 1 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X' || digits[1] == 'b' ||
                                                digits[1] == 'B' || digits[1] == 'o' || digits[1] == 'O'))
    return str_cat("'", value, "' is not a decimal number");
  if (!is_int && !is_uint) return "";
  if (is_uint && value[0] == '-') return str_cat("'", value, "' is negative, expected a non-negative integer");
  const char* begin = value.data() + (value[0] == '+' ? 1 : 0);
  const char* end = value.data() + value.size();
  std::from_chars_result r;
  if (is_uint) {
    uint64_t v = 0;
    r = std::from_chars(begin, end, v);
  } else {
    int64_t v = 0;
    r = std::from_chars(begin, end, v);
  }
  if (r.ec == std::errc::result_out_of_range) return str_cat("'", value, "' is out of range for a 64-bit integer");
  if (r.ec != std::errc() || r.ptr != end) return str_cat("'", value, "' is not an integer");
  return "";
}

void make_values_strict(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands({})) {
    for (CLI::Option* opt : sub->get_options()) {
      if (opt->get_expected_min() == 0) continue;  // a flag without a value
      const std::string type = opt->get_type_name();
      opt->check(CLI::Validator([type](std::string& value) { return strict_value_error(value, type); }, "", "strict"));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zerone: train transformer language models with ZeRO memory optimizations"};
  app.require_subcommand(1);

  train::TrainConfig train_cfg;
  std::string config_path;
  CLI::App* train_cmd = app.add_subcommand("train", "train a model (no arguments: the default run)");
  add_train_flags(*train_cmd, train_cfg, config_path);

  std::vector<std::string> text_files;
  std::string out_prefix, prepare_tokenizer;
  double val_fraction = 0.1;
  CLI::App* prepare_cmd = app.add_subcommand("prepare", "tokenize text files into llm.c token shards");
  prepare_cmd->add_option("--text", text_files, "text files (one document each)")->required();
  prepare_cmd->add_option("--out", out_prefix, "output prefix: writes PREFIX_train.bin and PREFIX_val.bin")->required();
  prepare_cmd->add_option("--val-fraction", val_fraction, "fraction of tokens held out for validation");
  prepare_cmd->add_option("--tokenizer", prepare_tokenizer,
                          "tokenizer.json, encoder.json (+ vocab.bpe beside it), a SentencePiece .model, or a directory "
                          "holding one (default: byte-level)");

  train::SampleOptions sample_opts;
  CLI::App* sample_cmd = app.add_subcommand("sample", "generate text from an llm.c checkpoint");
  sample_cmd->add_option("--init", sample_opts.init, "llm.c checkpoint or Hugging Face model directory")->required();
  sample_cmd->add_option("--prompt", sample_opts.prompt, "prompt text, encoded with --tokenizer (default byte-level)");
  sample_cmd->add_option("--prompt-tokens", sample_opts.prompt_tokens, "prompt as token ids")->delimiter(',');
  sample_cmd->add_option("--tokenizer", sample_opts.tokenizer,
                         "tokenizer.json, encoder.json, SentencePiece .model or llm.c tokenizer file (decode only)");
  sample_cmd->add_option("--tokens", sample_opts.num_tokens, "tokens to generate");
  sample_cmd->add_option("--temperature", sample_opts.temperature, "sampling temperature (0: greedy)");
  sample_cmd->add_option("--top-k", sample_opts.top_k, "sample among the k most likely (0: all)");
  sample_cmd->add_option("--seed", sample_opts.seed, "sampling seed");
  sample_cmd->add_option("--precision", sample_opts.precision, "fp32 or bf16");

  CLI::App* info_cmd = app.add_subcommand("info", "what this build and machine offer");

  io::ConvertOptions convert_opts;
  CLI::App* convert_cmd = app.add_subcommand(
      "convert", "convert model weights between zerone checkpoints, llm.c files and Hugging Face directories");
  convert_cmd->add_option("SRC", convert_opts.src,
                          "a zerone checkpoint (step directory or --checkpoint-dir root), an llm.c file, or a Hugging "
                          "Face model directory")->required();
  convert_cmd->add_option("DST", convert_opts.dst, "the file or directory to write")->required();
  convert_cmd->add_option("--to", convert_opts.to,
                          "hf (config.json + model.safetensors), llmc (GPT-2, f32 v3 / bf16 v5) or zerone (weights-only "
                          "checkpoint); default: llmc for DST ending in .bin, else hf");
  convert_cmd->add_option("--dtype", convert_opts.dtype, "f32, bf16 or f16 (default: the source's)");

  EstimateArgs est;
  CLI::App* estimate_cmd = app.add_subcommand("estimate", "per-rank memory of each ZeRO stage, before running");
  estimate_cmd->add_option("--model", est.model, "preset or spec (as for train)")->required();
  estimate_cmd->add_option("--world", est.world, "data-parallel ranks")->required();
  estimate_cmd->add_option("--zero-stage", est.stage, "only this stage (default: all)");
  estimate_cmd->add_option("--precision", est.precision, "fp32 or bf16 (default as train)");
  estimate_cmd->add_option("--micro-batch", est.micro_batch, "for activations (default 4)");
  estimate_cmd->add_option("--seq", est.seq, "for activations (default 64)");
  estimate_cmd->add_option("--device-mem,--device-mem-limit", est.device_mem_gib,
                           "device memory per rank in GiB: say which stages fit on the device");
  estimate_cmd->add_option("--offload-optimizer", est.offload_optimizer, "none, cpu or nvme (as for train; stages 1-3)");
  estimate_cmd->add_option("--offload-param", est.offload_param, "none, cpu or nvme (as for train; stage 3)");
  estimate_cmd->add_option("--sub-group-size", est.sub_group_size, "as for train (NVMe swap sub-group, elements)");
  estimate_cmd->add_option("--offload-buffer-count", est.buffer_count, "as for train (NVMe staging buffers)");
  estimate_cmd->add_option("--offload-optimizer-ratio", est.ratio, "as for train (share of the sub-groups offloaded)");
  estimate_cmd->add_flag("--delayed-update", est.delayed_update, "as for train (its gradient and parameter copies)");
  estimate_cmd->add_option("--stage3-param-persistence-threshold", est.persistence_threshold,
                           "as for train (elements)");
  estimate_cmd->add_option("--reduce-bucket-size", est.reduce_bucket_numel,
                           "as for train (elements): bounds stages 2-3's gradients in flight");
  estimate_cmd->add_option("--stage3-prefetch-bucket-size", est.prefetch_numel,
                           "as for train (elements): bounds stage 3's prefetched parameters");
  estimate_cmd->add_flag("--json", est.json, "machine-readable output");
  estimate_cmd->add_option("--grad-clip", est.grad_clip,
                           "as for train: with the early step, its speculation's undo copies and spare swap slots");
  estimate_cmd->add_option("--early-step", est.early_step, "as for train (true/false)");
  estimate_cmd->add_option("--optimizer", est.optimizer, "adamw or sgd (as for train; default adamw): whose state");
  estimate_cmd->add_option("--momentum", est.momentum, "as for train (SGD: a momentum buffer unless 0)");
  estimate_cmd->add_flag("--activation-checkpointing", est.activation_checkpointing, "as for train");
  estimate_cmd->add_flag("--cpu-checkpointing", est.cpu_checkpointing, "as for train");

  std::vector<std::string> report_inputs;
  std::string report_out;
  CLI::App* report_cmd = app.add_subcommand("report", "an HTML report (inline SVG plots) of one or more runs' --metrics files");
  report_cmd->add_option("RUN.jsonl", report_inputs, "metrics files written by zerone train --metrics (several: overlaid)")->required();
  report_cmd->add_option("-o,--output", report_out, "the HTML file to write")->required();

  make_values_strict(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line with the usual prefix and exit 1, like every other bad input (README).
    std::fprintf(stderr, "zerone: error: %s (zerone %s--help lists the options)\n", e.what(),
                 train_cmd->parsed() ? "train " : sample_cmd->parsed() ? "sample " : prepare_cmd->parsed() ? "prepare "
                 : estimate_cmd->parsed() ? "estimate " : convert_cmd->parsed() ? "convert " : report_cmd->parsed() ? "report " : "");
    return 1;
  }

  // Note [Errors under MPI]: a rank that fails must not leave its peers waiting in a collective
  // forever, so with more than one rank an error ends the whole job (MPI_Abort) after printing.
  // Everything is caught here, not only zerone::Error: an exception escaping main would end in
  // std::terminate without a message and, under MPI, without ending the other ranks.
  std::unique_ptr<comm::Communicator> communicator;
  auto fail = [&](const std::string& message) {
    train::end_status_line();
    std::fflush(stdout);
    if (communicator && communicator->world_size() > 1) {
      std::fprintf(stderr, "zerone: error (rank %d of %d): %s\n", communicator->rank(), communicator->world_size(),
                   message.c_str());
      std::fflush(stderr);
      communicator->abort_job(1);
    }
    std::fprintf(stderr, "zerone: error: %s\n", message.c_str());
    return 1;
  };
  try {
    if (train_cmd->parsed()) {
      communicator = comm::make_communicator();
      for (const CLI::Option* opt : train_cmd->get_options())
        if (opt->count() > 0) train_cfg.given.insert(opt->get_name());
      train_cfg.config_file = config_path;
      if (!config_path.empty()) train::apply_json_config(config_path, train_cfg);
      train::TrainResult result = train::run_training(train_cfg, *communicator);
      if (result.interrupted_by != 0) return 128 + result.interrupted_by;
    } else if (prepare_cmd->parsed()) {
      std::unique_ptr<io::Tokenizer> tokenizer =
          prepare_tokenizer.empty() ? io::make_byte_tokenizer() : io::load_tokenizer(prepare_tokenizer);
      io::PrepareResult r = io::prepare_text_shards(text_files, out_prefix, val_fraction, *tokenizer);
      std::printf("wrote %s (%zu tokens) and %s (%zu tokens) with the %s tokenizer (vocabulary %d)\n",
                  r.train_path.c_str(), r.train_tokens, r.val_path.c_str(), r.val_tokens,
                  tokenizer->description().c_str(), r.vocab_size);
      std::printf("train with: zerone train --data %s%s%s --model gpt2:layers=4,dim=256,heads=4,vocab=%d,ctx=256\n",
                  r.train_path.c_str(), r.val_tokens > 0 ? " --val-data " : "", r.val_tokens > 0 ? r.val_path.c_str() : "",
                  r.vocab_size);
    } else if (sample_cmd->parsed()) {
      train::sample(sample_opts, [](const std::string& piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      });
      std::printf("\n");
    } else if (info_cmd->parsed()) {
      return cmd_info();
    } else if (convert_cmd->parsed()) {
      // Ctrl-C stops between units: the destination is not written and its temporaries are removed
      // (without the handler the default action left them, as large as the model).
      train::InterruptGuard interrupts("stopping the conversion before it reads its next unit");
      convert_opts.check_interrupt = [] {
        if (int sig = train::interrupt_signal(); sig != 0) throw train::Interrupted(sig);
      };
      io::ConvertResult r;
      try {
        r = io::convert_checkpoint(convert_opts);
      } catch (const train::Interrupted& e) {
        std::fprintf(stderr, "zerone: convert stopped by %s: '%s' was not written\n", train::signal_name(e.signal_number()),
                     convert_opts.dst.c_str());
        return 128 + e.signal_number();
      }
      if (!r.notice.empty()) std::fprintf(stderr, "zerone: notice: %s\n", r.notice.c_str());
      std::printf("converted %s '%s' (%s, %llu parameters) to %s '%s' (%s)\n", r.source_kind.c_str(),
                  convert_opts.src.c_str(), r.model_spec.c_str(), static_cast<unsigned long long>(r.parameters),
                  r.destination_kind.c_str(), convert_opts.dst.c_str(), r.dtype.c_str());
    } else if (report_cmd->parsed()) {
      const std::vector<report::RunLog> runs = report::read_run_logs(report_inputs);
      report::write_html_report(runs, report_out);
      std::printf("wrote '%s' (%zu run%s)\n", report_out.c_str(), runs.size(), runs.size() == 1 ? "" : "s");
    } else if (estimate_cmd->parsed()) {
      est.seq_given = estimate_cmd->count("--seq") > 0;
      est.momentum_given = estimate_cmd->count("--momentum") > 0;
      return cmd_estimate(est, estimate_cmd->count("--zero-stage") > 0);
    }
  } catch (const train::Interrupted& e) {
    train::end_status_line();
    std::fprintf(stderr, "zerone: %s\n", e.what());
    if (communicator && communicator->world_size() > 1) communicator->abort_job(128 + e.signal_number());
    return 128 + e.signal_number();
  } catch (const zerone::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory (a buffer could not be allocated); zerone estimate shows what a run needs");
  } catch (const std::system_error& e) {
    return fail(str_cat("system error: ", e.what()));
  } catch (const std::exception& e) {
    return fail(str_cat("unexpected failure: ", e.what()));
  } catch (...) {
    return fail("unexpected failure (unknown exception)");
  }
  return 0;
}
