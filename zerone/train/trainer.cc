#include "zerone/train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <memory>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"
#include "zerone/core/sysinfo.h"
#include "zerone/io/llmc_checkpoint.h"
#include "zerone/io/token_shards.h"
#include "zerone/io/tokenizer.h"
#include "zerone/optim/adamw.h"
#include "zerone/train/lr_schedule.h"
#include "zerone/train/markov_source.h"
#include "zerone/train/metrics.h"
#include "zerone/zero/engine.h"
#include "zerone/zero/loss_scaler.h"

namespace zerone::train {
namespace {

// Note [Default run]: a byte-level GPT (vocab 257) on the order-1 Markov corpus. Tuned to
// finish in well under 2 minutes on 2 cores and to end within 10% of the source entropy.
constexpr const char* kDefaultModel = "gpt2:layers=4,dim=256,heads=4,vocab=257,ctx=64";
constexpr int kDefaultSteps = 300;
constexpr int kDefaultMicroBatch = 16;
constexpr int kDefaultSeq = 64;
constexpr float kDefaultLr = 2e-3f;
constexpr int kDefaultWarmup = 20;
constexpr size_t kDefaultTrainTokens = 2'000'000;
constexpr size_t kDefaultValTokens = 100'000;
constexpr uint64_t kDefaultSourceSeed = 42;

// Mean loss over the first `batches` chunks of the validation data. Collective at stage 3 (the
// forward gathers parameters), so every rank runs it.
float evaluate(nn::GPT2& model, io::DataLoader& loader, int batches, int B, int T) {
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  double sum = 0.0;
  int n = static_cast<int>(std::min<uint64_t>(batches, loader.chunks_per_epoch()));
  for (int i = 0; i < n; ++i) {
    loader.load(i, inputs.data(), targets.data());
    sum += model.forward(inputs.data(), targets.data(), B, T);
  }
  return static_cast<float>(sum / n);
}

// Note [Threads per rank]: several ranks on one host must share its cores, or OpenMP teams
// oversubscribe them and every collective waits for the slowest rank. Unless --threads is given,
// each rank takes cores / ranks-on-this-host.
int default_threads_per_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MPICH_LOCAL_SIZE"}) {
    if (const char* v = std::getenv(var)) {
      int local = std::atoi(v);
      if (local > 1) return std::max(1, omp_get_num_procs() / local);
    }
  }
  return 0;
}

// FNV-1a over the consistency key and the model shape; all ranks must agree (Note [Same config]).
uint64_t config_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

void check_same_config_everywhere(const std::string& key, comm::Communicator& comm) {
  if (comm.world_size() == 1) return;
  uint64_t mine = config_hash(key);
  std::vector<uint64_t> all(comm.world_size());
  comm.all_gather(&mine, all.data(), sizeof mine);
  std::string differing;
  for (int r = 0; r < comm.world_size(); ++r)
    if (all[r] != all[0]) differing += str_cat(differing.empty() ? "" : ", ", r);
  // Every rank sees the same hashes, so every rank fails together: no hang, one message each.
  ZERONE_CHECK(differing.empty(), "ranks ", differing, " run a different configuration or model than rank 0: every rank of ",
               "a job must be started with the same flags, config file and model");
}

}  // namespace

DType resolve_precision(const std::string& precision) {
  if (!precision.empty()) return parse_dtype(precision);
  CpuInfo cpu = cpu_info();
  return (cpu.avx512_bf16 || cpu.amx_bf16) ? DType::bf16 : DType::f32;
}

TrainConfig default_run_config(TrainConfig cfg) {
  if (!cfg.is_given("--model") && !cfg.is_given("--init")) cfg.model = kDefaultModel;
  if (!cfg.is_given("--steps")) cfg.steps = kDefaultSteps;
  if (!cfg.is_given("--micro-batch")) cfg.micro_batch = kDefaultMicroBatch;
  if (!cfg.is_given("--seq")) cfg.seq = kDefaultSeq;
  if (!cfg.is_given("--lr")) cfg.lr = kDefaultLr;
  if (!cfg.is_given("--warmup")) cfg.warmup = kDefaultWarmup;
  if (!cfg.is_given("--lr-schedule")) cfg.lr_schedule = "cosine";
  if (!cfg.is_given("--min-lr-frac")) cfg.min_lr_frac = 0.1f;
  return cfg;
}

TrainResult run_training(TrainConfig cfg) {
  comm::SingleProcessCommunicator single;
  return run_training(std::move(cfg), single);
}

TrainResult run_training(TrainConfig cfg, comm::Communicator& comm) {
  const int world = comm.world_size(), rank = comm.rank();
  const bool lead = rank == 0;
  const bool default_run = cfg.data.empty();
  ZERONE_CHECK(!(default_run && !cfg.val_data.empty()), "--val-data given without --data");
  resolve_batch_sizes(cfg, world);  // before the default run's batch, which fills only what is not given
  if (default_run) cfg = default_run_config(cfg);
  validate(cfg);
  if (cfg.threads > 0) omp_set_num_threads(cfg.threads);
  else if (int t = default_threads_per_rank(); t > 0) omp_set_num_threads(t);
  const DType dtype = resolve_precision(cfg.precision);
  check_settings_take_effect(cfg, dtype == DType::f16, default_run || !cfg.val_data.empty());
  if (lead)
    for (const std::string& notice : cfg.notices) std::fprintf(stderr, "zerone: notice: %s\n", notice.c_str());

  // Model shape: --model, else the --init file's header; both given must agree.
  nn::GPT2Config model_config;
  if (!cfg.init.empty()) {
    model_config = io::read_llmc_config(cfg.init);
    if (!cfg.model.empty()) {
      nn::GPT2Config requested = nn::parse_model_spec(cfg.model);
      ZERONE_CHECK(requested == model_config, "--model ", requested.to_string(), " disagrees with --init '", cfg.init,
                   "', which holds ", model_config.to_string());
    }
  } else {
    ZERONE_CHECK(!cfg.model.empty(), "--model is required with --data (or --init FILE to take the shape from a checkpoint)");
    model_config = nn::parse_model_spec(cfg.model);
  }
  ZERONE_CHECK(cfg.seq <= model_config.max_seq_len, "--seq ", cfg.seq, " exceeds the model's context length ",
               model_config.max_seq_len);
  check_same_config_everywhere(str_cat(consistency_key(cfg), '|', model_config.to_string(), '|', dtype_name(dtype)), comm);

  // Data.
  std::unique_ptr<io::TokenSource> train_tokens, val_tokens;
  std::optional<double> entropy;
  if (default_run) {
    MarkovSource source(kDefaultSourceSeed);
    entropy = source.entropy_rate();
    train_tokens = std::make_unique<io::InMemoryTokens>(source.generate(kDefaultTrainTokens, 1), "built-in corpus");
    val_tokens = std::make_unique<io::InMemoryTokens>(source.generate(kDefaultValTokens, 2), "built-in held-out corpus");
  } else {
    train_tokens = std::make_unique<io::TokenDataset>(cfg.data, "--data");
    if (!cfg.val_data.empty()) val_tokens = std::make_unique<io::TokenDataset>(cfg.val_data, "--val-data");
  }
  const int B = cfg.micro_batch, T = cfg.seq;
  io::DataLoader train_loader(*train_tokens, B, T, model_config.vocab_size, !cfg.no_shuffle, cfg.seed);
  std::unique_ptr<io::DataLoader> val_loader;
  if (val_tokens) val_loader = std::make_unique<io::DataLoader>(*val_tokens, B, T, model_config.vocab_size, false, 0);

  // Model: the engine materializes it unit by unit (from the seed or the --init file), keeping
  // only what its stage needs (Note [Materializing units]).
  nn::GPT2 model(model_config, dtype, zero::kShardAlign * world, /*allocate=*/false);
  auto materialize = [&](int u) {
    if (cfg.init.empty()) model.init_unit(u, cfg.seed);
    else io::load_llmc_checkpoint(cfg.init, model, u);
  };
  zero::ZeroConfig zcfg;
  zcfg.stage = cfg.zero_stage;
  zcfg.reduce_bucket_numel = static_cast<size_t>(cfg.reduce_bucket_size);
  zcfg.allgather_bucket_numel = static_cast<size_t>(cfg.allgather_bucket_size);
  zcfg.prefetch_numel = static_cast<size_t>(cfg.stage3_prefetch_bucket_size);
  zcfg.persistence_threshold = static_cast<size_t>(cfg.stage3_param_persistence_threshold);
  zero::ZeroEngine engine(model, comm, zcfg, optim::AdamWOptions{cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay},
                          materialize);

  Progress progress;
  if (lead) {
    progress.message(str_cat("zerone: model ", model_config.to_string(), " (", model_config.num_parameters(),
                             " parameters), ", dtype_name(dtype), ", micro-batch ", B, " x seq ", T, " x accum ",
                             cfg.grad_accum, " x world ", world, ", ZeRO stage ", cfg.zero_stage, ", ", cfg.steps,
                             " steps, ", omp_get_max_threads(), " threads/rank",
                             world > 1 ? str_cat(", ", comm.description()) : "",
                             default_run ? str_cat("; built-in Markov corpus, entropy ", *entropy, " nats/token") : ""));
  }
  MetricsWriter metrics(lead ? cfg.metrics : "");

  // fp16: dynamic (or static) loss scaling; bf16 and fp32 need none.
  const bool scaled = dtype == DType::f16;
  zero::LossScaler scaler(zero::LossScaleConfig{cfg.loss_scale == 0.0, cfg.loss_scale == 0.0 ? 1.0 : cfg.loss_scale,
                                                cfg.initial_scale_power, cfg.loss_scale_window, cfg.hysteresis,
                                                cfg.min_loss_scale});

  LrSchedule schedule(lr_schedule_config(cfg));
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  TrainResult result;
  Profiler::set_enabled(cfg.profile);
  double profiled_wall_s = 0.0;  // steps 2.. (the first step creates the GEMM primitives)
  for (int step = 1; step <= cfg.steps; ++step) {
    if (step == 2) Profiler::reset();
    auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0.0;  // gradients start at zero: the optimizer step zeroes them
    const double loss_scale = scaled ? scaler.scale() : 1.0;
    for (int micro = 0; micro < cfg.grad_accum; ++micro) {
      // Chunk (s*accum + k)*world + r: every world size sees the same global batch.
      uint64_t chunk = (static_cast<uint64_t>(step - 1) * cfg.grad_accum + micro) * world + rank;
      {
        ProfileScope profile(ProfileCategory::data);
        train_loader.load(chunk, inputs.data(), targets.data());
      }
      loss_sum += model.forward(inputs.data(), targets.data(), B, T);
      engine.set_last_micro_step(micro == cfg.grad_accum - 1);
      model.backward(static_cast<float>(loss_scale / cfg.grad_accum));
    }
    // The reported loss is the mean over the global batch.
    float loss = static_cast<float>(comm.all_reduce_sum(loss_sum) / (static_cast<double>(cfg.grad_accum) * world));
    ZERONE_CHECK(std::isfinite(loss), "training diverged at step ", step, ": loss ", loss, " (try a lower --lr or --grad-clip)");
    float lr = static_cast<float>(schedule.lr());
    zero::ZeroEngine::StepResult stepped = engine.step(lr, cfg.grad_clip, loss_scale, scaled);
    if (scaled) scaler.update(stepped.overflow);
    schedule.advance(!stepped.overflow);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step >= 2) profiled_wall_s += ms / 1000.0;

    StepRecord record;
    record.step = step;
    record.total_steps = cfg.steps;
    record.loss = loss;
    record.lr = lr;
    record.grad_norm = static_cast<float>(stepped.norm);
    if (scaled) record.loss_scale = loss_scale;
    record.skipped = stepped.overflow;
    record.ms = ms;
    record.tokens_per_s = static_cast<double>(B) * T * cfg.grad_accum * world / (ms / 1000.0);
    bool validate_now = val_loader && ((cfg.val_every > 0 && step % cfg.val_every == 0) || step == cfg.steps);
    if (validate_now) record.val_loss = evaluate(model, *val_loader, cfg.val_batches, B, T);
    if (lead) {
      progress.step(record);
      if (record.val_loss && step != cfg.steps) progress.message(str_cat("step ", step, ": val loss ", *record.val_loss));
    }
    metrics.write(record);
    result.steps = step;
    result.final_train_loss = loss;
    if (record.val_loss) result.final_val_loss = record.val_loss;
  }
  progress.finish();
  if (cfg.profile && cfg.steps >= 2 && lead) {
    progress.message(str_cat("time per step ", 1000.0 * profiled_wall_s / (cfg.steps - 1), " ms: ",
                             Profiler::report(profiled_wall_s, cfg.steps - 1)));
  }
  Profiler::set_enabled(false);
  if (!cfg.save.empty()) {
    engine.with_full_params([&] {
      // llm.c has no fp16 checkpoint version: fp16 parameters widen exactly to f32 (v3).
      if (lead) io::save_llmc_checkpoint(cfg.save, model, dtype == DType::f16 ? DType::f32 : dtype);
    });
    if (lead) progress.message(str_cat("saved llm.c checkpoint '", cfg.save, "'"));
  }
  result.source_entropy = entropy;
  float final_loss = result.final_val_loss.value_or(result.final_train_loss);
  char line[160];
  if (entropy) {
    std::snprintf(line, sizeof line, "final loss %.4f nats/token; source entropy %.4f nats/token", final_loss, *entropy);
  } else {
    std::snprintf(line, sizeof line, "final loss %.4f nats/token (%s)", final_loss,
                  result.final_val_loss ? "validation" : "last training step");
  }
  if (lead) progress.message(line);
  return result;
}

}  // namespace zerone::train
