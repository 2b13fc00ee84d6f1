#include "zerone/train/trainer.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <memory>

#include "zerone/comm/comm_choice.h"
#include "zerone/comm/traffic.h"
#include "zerone/core/error.h"
#include "zerone/io/aio.h"
#include "zerone/core/profiler.h"
#include "zerone/core/sysinfo.h"
#include "zerone/io/convert.h"
#include "zerone/io/hf_checkpoint.h"
#include "zerone/io/idx.h"
#include "zerone/io/sharded_checkpoint.h"
#include "zerone/io/llmc_checkpoint.h"
#include "zerone/io/token_shards.h"
#include "zerone/io/tokenizer.h"
#include "zerone/io/weight_source.h"
#include "zerone/nn/gpt2.h"
#include "zerone/nn/llama.h"
#include "zerone/nn/model.h"
#include "zerone/optim/adamw.h"
#include "zerone/optim/optimizers.h"
#include "zerone/train/batch_source.h"
#include "zerone/train/checkpoint.h"
#include "zerone/train/interrupt.h"
#include "zerone/train/lr_schedule.h"
#include "zerone/train/markov_source.h"
#include "zerone/train/metrics.h"
#include "zerone/train/plan.h"
#include "zerone/train/save_weights.h"
#include "zerone/train/settings.h"
#include "zerone/train/throughput.h"
#include "zerone/report/html_report.h"
#include "zerone/report/monitors.h"
#include "zerone/zero/engine.h"
#include "zerone/zero/estimate.h"
#include "zerone/zero/planner.h"
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
// Note [Exposed time]: scopes timed on a GPU's timeline are resolved (a wait for the GPU to reach
// them) at the end of the step in which this many became pending, so that their events are
// reused; a wait once in some steps, not one a step (under --profile, which times every device
// operation, every few steps). The wait is the step's time; reading the spans after it is not.
constexpr size_t kSpansBeforeSettling = 4096;

struct Evaluation {
  float loss = 0.0f;
  std::optional<float> accuracy;  // classifiers: the fraction of samples whose argmax is the label
  int64_t samples = 0, samples_here = 0;  // classifiers: all ranks', and this rank's share
};

// Note [Sharded validation]: over the first `batches` micro-batches of the validation data (batch
// i is samples i*B ..), rank r evaluates batches r, r + world, r + 2 world, ... and the sums are all-reduced, so every rank
// gets the same figures at every world size: tokens, the mean of the batches' mean losses;
// classifiers, the mean loss and the accuracy over every sample read (the last batch may be
// short). The accuracy is a ratio of integer counts, exact at any world size; the loss is a
// double sum whose order alone depends on the world size. The forward is collective at stage 3
// (it gathers parameters), so every rank runs the same number of forwards: a rank whose share is
// one batch short repeats its first batch (or batch 0) once and counts nothing from it.
//
// Note [Interrupted evaluation]: an evaluation has no state to save, so a stop signal ends it at the
// next batch (a pass over a large validation set takes minutes) and it returns nothing. The ranks
// agree on the signal before every batch (one small all-reduce), so all stop at the same batch and
// none waits in another's forward.
std::optional<Evaluation> evaluate(nn::Model& model, BatchSource& source, uint64_t batches, comm::Communicator& comm) {
  const bool classifier = model.input_kind() == nn::InputKind::features;
  const uint64_t world = static_cast<uint64_t>(comm.world_size()), rank = static_cast<uint64_t>(comm.rank());
  const uint64_t n = std::min<uint64_t>(batches, source.batches_per_epoch());
  const uint64_t B = static_cast<uint64_t>(source.micro_batch());
  const uint64_t rounds = (n + world - 1) / world;
  double sums[3] = {0.0, 0.0, 0.0};  // loss (classifiers: times the batch size), samples, correct
  for (uint64_t round = 0; round < rounds; ++round) {
    double stop = interrupt_signal() != 0 ? 1.0 : 0.0;
    if (world > 1) comm.all_reduce_sum_async(&stop, 1).wait();
    if (stop > 0.0) return std::nullopt;
    const uint64_t chunk = round * world + rank;
    const bool counted = chunk < n;
    const nn::Batch batch = source.load((counted ? chunk : rank < n ? rank : 0) * B);
    const float loss = model.forward(batch);
    if (!counted) continue;
    if (!classifier) {
      sums[0] += loss;
      continue;
    }
    sums[0] += static_cast<double>(loss) * batch.size;
    sums[1] += batch.size;
    const int K = model.logits_stride();
    const std::vector<float> logits_host = model.logits_to_host(0, batch.size);  // (B, K) from the device
    const float* logits = logits_host.data();
    for (int b = 0; b < batch.size; ++b) {
      const float* row = logits + static_cast<size_t>(b) * K;
      sums[2] += std::max_element(row, row + model.vocab_size()) - row == batch.targets[b] ? 1 : 0;
    }
  }
  Evaluation e;
  e.samples_here = static_cast<int64_t>(sums[1]);
  comm.all_reduce_sum_async(sums, 3).wait();
  if (!classifier) {
    e.loss = static_cast<float>(sums[0] / static_cast<double>(n));
  } else {
    e.loss = static_cast<float>(sums[0] / sums[1]);
    e.accuracy = static_cast<float>(sums[2] / sums[1]);
    e.samples = static_cast<int64_t>(sums[1]);
  }
  return e;
}

// `value` with `digits` decimals, for messages.
std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

// Ranks of this job on this host, from the launcher's environment (1 when not launched by MPI).
int local_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MPICH_LOCAL_SIZE"}) {
    if (const char* v = std::getenv(var)) {
      int local = std::atoi(v);
      if (local > 1) return local;
    }
  }
  return 1;
}

// Note [Threads per rank]: several ranks on one host must share its cores, or OpenMP teams
// oversubscribe them and every collective waits for the slowest rank. Unless --threads is given,
// each rank takes cores / ranks-on-this-host.
int default_threads_per_rank() {
  int local = local_ranks();
  return local > 1 ? std::max(1, omp_get_num_procs() / local) : 0;
}

// FNV-1a; all ranks must agree on every setting's hash (Note [Same config]).
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Note [Same config]: every rank must run the same settings, or the job computes garbage (or
// hangs in mismatched collectives). Each rank hashes each setting; an all-gather lets every rank
// compare every rank's hashes with rank 0's, so all fail together, naming the settings that differ.
void check_same_config_everywhere(const std::vector<std::pair<std::string, std::string>>& settings,
                                  comm::Communicator& comm) {
  if (comm.world_size() == 1) return;
  const size_t n = settings.size();
  std::vector<uint64_t> mine(n), all(n * comm.world_size());
  for (size_t i = 0; i < n; ++i) mine[i] = fnv1a(settings[i].second);
  comm.all_gather(mine.data(), all.data(), n * sizeof(uint64_t));
  std::string differing;
  for (size_t i = 0; i < n; ++i) {
    std::string ranks;
    for (int r = 1; r < comm.world_size(); ++r)
      if (all[r * n + i] != all[i]) ranks += str_cat(ranks.empty() ? "" : ",", r);
    if (!ranks.empty()) differing += str_cat(differing.empty() ? "" : "; ", settings[i].first, " (rank ", ranks, ")");
  }
  ZERONE_CHECK(differing.empty(), "ranks disagree with rank 0 on: ", differing, ". Every rank of a job must be started ",
               "with the same flags, config file and model (this rank has ", [&] {
                 std::string values;
                 for (size_t i = 0; i < n; ++i)
                   for (int r = 1; r < comm.world_size(); ++r)
                     if (all[r * n + i] != all[i]) {
                       values += str_cat(values.empty() ? "" : ", ", settings[i].first, " '", settings[i].second, "'");
                       break;
                     }
                 return values;
               }(), ")");
}

// Start-up checks of the outputs (Note [No late errors]): each must be writable where it is asked to
// be, and none may overwrite an input or another output.
// --save writes a Hugging Face directory when it names one (an existing directory, or a path
// ending in '/'), else an llm.c checkpoint file.
bool save_is_hf_directory(const std::string& save) {
  struct stat st;
  return !save.empty() && (save.back() == '/' || (::stat(save.c_str(), &st) == 0 && S_ISDIR(st.st_mode)));
}

void check_outputs(const TrainConfig& cfg) {
  if (save_is_hf_directory(cfg.save)) io::check_hf_output(cfg.save, "--save");
  else if (!cfg.save.empty()) io::check_atomic_output(cfg.save, "--save");
  if (!cfg.metrics.empty()) MetricsWriter::check_path(cfg.metrics);
  if (!cfg.report.empty()) {
    ZERONE_CHECK(!cfg.metrics.empty(), "--report '", cfg.report, "' is drawn from the run's metrics: give --metrics FILE.jsonl too");
    io::check_atomic_output(cfg.report, "--report");
    for (const auto& [flag, path] : {std::pair<const char*, std::string>{"--metrics", cfg.metrics}, {"--save", cfg.save},
                                     {"--init", cfg.init}, {"--config", cfg.config_file}})
      ZERONE_CHECK(path.empty() || !io::same_file(cfg.report, path), "--report and ", flag, " name the same file '", path, "'");
  }
  std::vector<std::pair<std::string, std::string>> inputs;
  if (!cfg.init.empty()) inputs.emplace_back("--init", cfg.init);
  if (!cfg.config_file.empty()) inputs.emplace_back("--config", cfg.config_file);
  for (const auto& [flag, pattern] : {std::pair<const char*, std::string>{"--data", cfg.data}, {"--val-data", cfg.val_data}}) {
    if (pattern.empty()) continue;
    glob_t g{};
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) inputs.emplace_back(flag, g.gl_pathv[i]);
    globfree(&g);
  }
  // --checkpoint-dir is created at start-up: a --save or --metrics of the same path would be written
  // into it (an llm.c --save silently became a Hugging Face directory among the checkpoints).
  auto trimmed = [](std::string p) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return p;
  };
  for (const auto& [flag, path] : {std::pair<const char*, std::string>{"--save", cfg.save}, {"--metrics", cfg.metrics}})
    ZERONE_CHECK(cfg.checkpoint_dir.empty() || path.empty() || !io::same_file(trimmed(cfg.checkpoint_dir), trimmed(path)),
                 "--checkpoint-dir '", cfg.checkpoint_dir, "' and ", flag, " '", path,
                 "' name the same path: give the checkpoints their own directory");
  if (!cfg.save.empty() && !cfg.metrics.empty())
    ZERONE_CHECK(!io::same_file(cfg.save, cfg.metrics), "--save and --metrics name the same file '", cfg.save,
                 "': the model would overwrite the metrics");
  for (const auto& [flag, path] : inputs) {
    ZERONE_CHECK(cfg.metrics.empty() || !io::same_file(cfg.metrics, path), "--metrics '", cfg.metrics, "' is the ",
                 flag, " file '", path, "': writing metrics would destroy it");
    // --save over --init is allowed: the checkpoint is read at start-up and replaced atomically.
    if (flag == std::string("--init")) continue;
    ZERONE_CHECK(cfg.save.empty() || !io::same_file(cfg.save, path), "--save '", cfg.save, "' is the ", flag,
                 " file '", path, "': saving would destroy it");
  }
}

// Note [No late errors]: a token id outside the vocabulary anywhere in the data is found before
// the first step, not when (or if) a batch reaches it. Each rank scans 1/world of the tokens (with
// pread, about memory speed) and the first bad position is agreed on by an all-gather, so every
// rank fails with the same message naming the file.
void check_tokens_in_vocabulary(const io::TokenSource& tokens, int vocab_size, const char* what,
                                comm::Communicator& comm) {
  const size_t n = tokens.num_tokens(), world = static_cast<size_t>(comm.world_size());
  const size_t begin = n / world * comm.rank() + std::min<size_t>(comm.rank(), n % world);
  const size_t end = begin + n / world + (static_cast<size_t>(comm.rank()) < n % world ? 1 : 0);
  std::optional<size_t> bad = tokens.find_token_outside(vocab_size, begin, end);
  int64_t mine = bad ? static_cast<int64_t>(*bad) : -1;
  std::vector<int64_t> all(world);
  comm.all_gather(&mine, all.data(), sizeof mine);
  int64_t first = -1;
  for (int64_t p : all)
    if (p >= 0 && (first < 0 || p < first)) first = p;
  ZERONE_CHECK(first < 0, what, ": ", tokens.describe(static_cast<size_t>(first)),
               " is out of range for the model's vocabulary of ", vocab_size, " (ids 0..", vocab_size - 1, ")");
}

// What the start-up checks hold a run's estimate against (Note [Fit] in zero/planner.h): the
// device cap (Note [Device budget]), the host's available memory, the free disk under --nvme-path.
zero::MemoryBudget start_up_budget(const TrainConfig& cfg, kernels::DeviceKind device,
                                   const std::optional<kernels::DeviceMemory>& device_memory) {
  zero::MemoryBudget budget;
  budget.unified = unified_memory(device);
  budget.device_bytes = device_budget(device, cfg.device_mem_limit, device_memory).bytes;
  budget.ranks_per_host = local_ranks();
  budget.host_bytes = std::max<long long>(available_memory_bytes(), 0);
  if (!cfg.nvme_path.empty()) {
    try {
      budget.nvme_bytes = static_cast<int64_t>(io::check_swap_path(cfg.nvme_path, "--nvme-path"));
    } catch (const Error&) {
      // Refused by check_memory_fits with the path's own message when the run swaps there.
    }
  }
  return budget;
}

}  // namespace

// Note [Refuse what cannot fit]: a run whose estimated memory exceeds what this host (or its GPU)
// has left is refused before anything is allocated, with the estimate, instead of being killed by
// the kernel (or failing an allocation) minutes later. The estimate is zerone estimate's, the
// engine's own partition arithmetic (model states and working set to the byte, activations from
// the model's table); ranks on one host share its memory. On a GPU the device bytes are checked
// against the GPU's free memory less what the ledger cannot see (Note [Device memory the ledger
// cannot see] in kernels/backend.h; train::device_budget), the host bytes against the host's.
void check_memory_fits(const nn::Model& model, DType dtype, const TrainConfig& cfg, const zero::ZeroConfig& zcfg,
                       int world, kernels::DeviceKind device, const std::optional<kernels::DeviceMemory>& device_memory,
                       zero::CollectiveRoute route) {
  const optim::OptimizerOptions optimizer = optimizer_options(cfg);
  auto rows = zero::estimate(model, world, dtype, cfg.micro_batch, cfg.seq, zcfg, optimizer, std::nullopt, route);
  const zero::StageEstimate& mine = rows[cfg.zero_stage];
  auto h = [](double b) { return human_bytes(b); };
  auto hb = [&](int64_t b) { return h(static_cast<double>(b)); };
  const std::string breakdown = str_cat(
      "param ", hb(mine.model_state.param), ", grad ", hb(mine.model_state.grad), ", master ", hb(mine.model_state.master),
      ", optim ", hb(mine.model_state.optim), ", working set ", hb(mine.working_set.total()), ", activations ",
      hb(mine.activations + mine.host_activations), "; by place: ", zero::describe_places(mine), " bytes");
  // Note [Device cap]: --device-mem-limit caps the device arena (core/memory.h); a GPU's own
  // memory caps it too (Note [Device budget] in train/plan.h). The plan is checked against the
  // smaller before anything is allocated; the message names what overflows and the settings that
  // fit (Note [Advice that leads somewhere] in train/plan.cc).
  const int local = local_ranks();
  const DeviceBudget device_cap = device_budget(device, cfg.device_mem_limit, device_memory);
  zero::MemoryBudget budget = start_up_budget(cfg, device, device_memory);
  if (device_cap.bytes > 0 && mine.device() > device_cap.bytes)
    throw Error(str_cat("the run needs ", hb(mine.device()), " of ", kernels::device_kind_name(device),
                        " device memory per rank, over ", device_cap.source, " (", breakdown, "). ",
                        fit_advice(cfg, model, dtype, world, budget, mine)));
  if (zcfg.offload_optimizer == zero::OffloadDevice::nvme || zcfg.offload_param == zero::OffloadDevice::nvme) {
    const uint64_t free_bytes = io::check_swap_path(cfg.nvme_path, "--nvme-path");
    const double need = static_cast<double>(mine.nvme()) * local;
    ZERONE_CHECK(need <= static_cast<double>(free_bytes), "the run needs ", h(need), " of swap space under --nvme-path '",
                 cfg.nvme_path, "' (", hb(mine.nvme()), " per rank", local > 1 ? str_cat(" x ", local, " ranks") : "",
                 ") but only ", h(static_cast<double>(free_bytes)), " are free. ",
                 fit_advice(cfg, model, dtype, world, budget, mine));
  }
  const long long available = available_memory_bytes();
  if (available <= 0) return;  // unknown: nothing to compare with
  // --checkpoint-async keeps a host copy of the rank's checkpoint pieces (Note [Saving a step]):
  // its partition of every unit in the compute dtype plus the f32 optimizer state.
  int64_t staging = 0;
  if (cfg.checkpoint_async) {
    const size_t state_tensors = (dtype == DType::f32 ? 0 : 1) + optim::optimizer_state_tensors(optimizer);  // master, state
    for (size_t numel : model.unit_numels()) {
      const size_t saved = std::min(numel, zero::unit_shard(numel, world, 0, zcfg).shard_numel);
      staging += static_cast<int64_t>(saved * (dtype_size(dtype) + 4 * state_tensors));
    }
  }
  // In host memory: everything on a device that is host memory, else the host place alone.
  auto in_memory = [&](const zero::StageEstimate& r) { return budget.unified ? r.total() : r.host(); };
  const double need = static_cast<double>(in_memory(mine) + staging) * local;
  if (need <= static_cast<double>(available)) return;
  budget.host_bytes = available - staging * local;
  std::string stages;
  for (const auto& r : rows) stages += str_cat(stages.empty() ? "" : ", ", r.stage, ": ", h(static_cast<double>(in_memory(r))));
  throw Error(str_cat("the run needs ", hb(in_memory(mine) + staging), budget.unified ? "" : " of host memory", " per rank (",
                      breakdown, staging > 0 ? str_cat("; --checkpoint-async staging ", hb(staging)) : "", ")",
                      local > 1 ? str_cat(" x ", local, " ranks on this host") : "",
                      ", but this host has ", h(static_cast<double>(available)), " available. Per rank at world ", world,
                      " by ZeRO stage: ", stages, world == 1 ? " (at world 1 sharding saves nothing: more ranks on more hosts divide it)" : "",
                      ". ", fit_advice(cfg, model, dtype, world, budget, mine)));
}

namespace {

// The "run" object of the first metrics line: settings, machine and peak (docs/metrics.md).
nlohmann::ordered_json run_info(const TrainConfig& cfg, const nn::Model& model, DType dtype, int world,
                                const comm::Communicator& comm, int start_step, std::optional<double> flops_per_token,
                                std::optional<double> peak_tflops, const std::string& peak_source) {
  nlohmann::ordered_json run;
  run["zerone"] = "0.1.0";
  run["start_time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (start_step > 1) run["resumed_from_step"] = start_step - 1;
  run["model"] = model.spec();
  run["parameters"] = model.num_parameters();
  run["precision"] = dtype_name(dtype);
  run["data"] = cfg.data.empty() ? "built-in Markov corpus" : cfg.data;
  if (!cfg.val_data.empty()) run["val_data"] = cfg.val_data;
  if (!cfg.init.empty()) run["init"] = cfg.init;
  if (!cfg.config_file.empty()) run["config"] = cfg.config_file;
  run["micro_batch"] = cfg.micro_batch;
  if (model.input_kind() == nn::InputKind::tokens) run["seq"] = cfg.seq;
  run["grad_accum"] = cfg.grad_accum;
  run["world"] = world;
  run["steps"] = cfg.steps;
  run["zero_stage"] = cfg.zero_stage;
  run["offload_optimizer"] = cfg.offload_optimizer;
  run["offload_param"] = cfg.offload_param;
  run["optimizer"] = cfg.optimizer;
  run["lr"] = std::strtod(str_cat(cfg.lr).c_str(), nullptr);  // 0.002, not 0.0020000000949949026
  run["lr_schedule"] = cfg.lr_schedule;
  run["warmup"] = cfg.warmup;
  run["weight_decay"] = std::strtod(str_cat(cfg.weight_decay).c_str(), nullptr);
  run["grad_clip"] = std::strtod(str_cat(cfg.grad_clip).c_str(), nullptr);
  run["seed"] = cfg.seed;
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  run["host"] = host;
  run["cpu"] = cpu_info().model_name;
  run["threads_per_rank"] = omp_get_max_threads();
  if (world > 1) run["comm"] = comm.description();
  if (world > 1) run["topology"] = comm::describe_topology(comm.hosts());
  if (flops_per_token) run["flops_per_token"] = *flops_per_token;
  if (peak_tflops) {
    run["peak_tflop_per_s"] = *peak_tflops;
    run["peak_source"] = peak_source;
  }
  return run;
}

// Rank 0's peak bytes per place and category, beside zerone estimate's figure for each place.
void fill_memory_summary(RunSummary& summary, const nn::Model& model, DType dtype, const TrainConfig& cfg,
                         const zero::ZeroConfig& zcfg, int world, zero::CollectiveRoute route) {
  const auto rows = zero::estimate(model, world, dtype, cfg.micro_batch, cfg.seq, zcfg, optimizer_options(cfg),
                                   cfg.zero_stage, route);
  const MemoryLedger& ledger = MemoryLedger::global();
  for (size_t p = 0; p < MemoryLedger::kPlaces; ++p) {
    const auto place = static_cast<MemPlace>(p);
    RunSummary::PlacePeak peak;
    peak.place = mem_place_name(place);
    for (size_t c = 0; c < MemoryLedger::kCategories; ++c) {
      const auto category = static_cast<MemCategory>(c);
      if (int64_t bytes = ledger.peak(place, category); bytes > 0) {
        peak.categories.emplace_back(mem_category_name(category), bytes);
        peak.peak_bytes += bytes;
      }
    }
    if (!rows.empty())
      peak.estimate_bytes = place == MemPlace::device ? rows[0].device() : place == MemPlace::host ? rows[0].host() : rows[0].nvme();
    if (peak.peak_bytes > 0 || (peak.estimate_bytes && *peak.estimate_bytes > 0)) summary.memory.push_back(peak);
  }
  summary.peak_rss_bytes = peak_rss_bytes();
}

// Sets the device cap for the lifetime of a run (Note [Device cap]).
class DeviceLimitGuard {
 public:
  explicit DeviceLimitGuard(int64_t bytes) { set_device_limit_bytes(bytes); }
  ~DeviceLimitGuard() { set_device_limit_bytes(0); }
  DeviceLimitGuard(const DeviceLimitGuard&) = delete;
  DeviceLimitGuard& operator=(const DeviceLimitGuard&) = delete;
};

// The run's data (Note [Samples] in batch_source.h): the training and validation sources of --data
// and --val-data (image directories or token shards) or the default run's built-in corpus. Image
// data fixes cfg.steps from --epochs. Appends what was opened to `settings` and checks that every
// rank opened the same (collective), and that every token is in the vocabulary. Throws Error
// naming the file and what is wrong.
struct TrainData {
  std::unique_ptr<io::TokenSource> train_tokens, val_tokens;  // token data: what the sources read
  std::unique_ptr<BatchSource> train, val;                    // val: null without validation data
  uint64_t steps_per_epoch = 0;                               // image data (Note [Image epochs])
  std::optional<double> entropy;                              // the built-in corpus's entropy rate
};
TrainData open_training_data(TrainConfig& cfg, const nn::Model& model, bool default_run,
                             std::vector<std::pair<std::string, std::string>>& settings, comm::Communicator& comm) {
  const bool classifier = model.input_kind() == nn::InputKind::features;
  const int world = comm.world_size();
  TrainData data;
  std::unique_ptr<io::TokenSource>& train_tokens = data.train_tokens;
  std::unique_ptr<io::TokenSource>& val_tokens = data.val_tokens;
  if (classifier) {
    auto train_images = std::make_unique<ImageBatches>(io::load_image_split(cfg.data, "train", "--data"), "--data",
                                                       model.input_shape(), model.vocab_size(), cfg.micro_batch,
                                                       static_cast<int64_t>(cfg.micro_batch) * cfg.grad_accum * world,
                                                       !cfg.no_shuffle, cfg.seed);
    data.steps_per_epoch = train_images->steps_per_epoch();
    settings.emplace_back("the --data samples", str_cat(train_images->num_samples()));
    if (!cfg.val_data.empty()) {
      auto val_images = std::make_unique<ImageBatches>(io::load_image_split(cfg.val_data, "t10k", "--val-data"),
                                                       "--val-data", model.input_shape(), model.vocab_size(),
                                                       cfg.micro_batch, 0, false, 0);
      settings.emplace_back("the --val-data samples", str_cat(val_images->num_samples()));
      data.val = std::move(val_images);
    }
    data.train = std::move(train_images);
    check_same_config_everywhere(settings, comm);
    if (cfg.epochs > 0) {
      ZERONE_CHECK(data.steps_per_epoch * static_cast<uint64_t>(cfg.epochs) <= 100'000'000ull, "--epochs ", cfg.epochs, " x ",
                   data.steps_per_epoch, " steps per epoch is beyond 100000000 steps");
      cfg.steps = static_cast<int>(data.steps_per_epoch * static_cast<uint64_t>(cfg.epochs));
    }
  } else if (default_run) {
    MarkovSource source(kDefaultSourceSeed);
    data.entropy = source.entropy_rate();
    // Each part holds at least one batch, however large --micro-batch x --seq (issue 18's largest
    // micro-batch on a GPU: 128 x 1024 tokens is more than the held-out part's default).
    const size_t batch_tokens = static_cast<size_t>(cfg.micro_batch) * cfg.seq + 1;
    train_tokens = std::make_unique<io::InMemoryTokens>(
        source.generate(std::max(kDefaultTrainTokens, batch_tokens), 1), "built-in corpus");
    val_tokens = std::make_unique<io::InMemoryTokens>(source.generate(std::max(kDefaultValTokens, batch_tokens), 2),
                                                      "built-in held-out corpus");
  } else {
    train_tokens = std::make_unique<io::TokenDataset>(cfg.data, "--data");
    if (!cfg.val_data.empty()) val_tokens = std::make_unique<io::TokenDataset>(cfg.val_data, "--val-data");
  }
  const int B = cfg.micro_batch, T = cfg.seq;
  if (!classifier) {
    auto check_holds_a_batch = [&](const io::TokenSource& tokens, const char* what) {
      const size_t need = static_cast<size_t>(B) * T + 1;
      ZERONE_CHECK(tokens.num_tokens() >= need, what, " holds ", tokens.num_tokens(), " tokens, fewer than one batch of ",
                   "--micro-batch x --seq + 1 = ", need);
    };
    check_holds_a_batch(*train_tokens, default_run ? "the built-in corpus" : "--data");
    if (val_tokens) check_holds_a_batch(*val_tokens, default_run ? "the built-in held-out corpus" : "--val-data");
    // The same paths can name different files on different ranks (another working directory or
    // host): compare what was opened too (Note [Same config]).
    if (!default_run) {
      settings.emplace_back("the --data tokens", str_cat(train_tokens->num_tokens()));
      if (val_tokens) settings.emplace_back("the --val-data tokens", str_cat(val_tokens->num_tokens()));
      check_same_config_everywhere(settings, comm);
    }
    data.train = std::make_unique<TokenBatches>(*train_tokens, B, T, model.vocab_size(), !cfg.no_shuffle, cfg.seed);
    check_tokens_in_vocabulary(*train_tokens, model.vocab_size(), default_run ? "built-in corpus" : "--data", comm);
    if (val_tokens)
      check_tokens_in_vocabulary(*val_tokens, model.vocab_size(), default_run ? "built-in corpus" : "--val-data", comm);
    if (val_tokens) data.val = std::make_unique<TokenBatches>(*val_tokens, B, T, model.vocab_size(), false, 0);
  }
  return data;
}

// The lines rank 0 prints before the first step: the model, batch, ZeRO and offload settings,
// the optimizer, the data, the ranks and their topology.
void print_run_header(Progress& progress, const TrainConfig& cfg, const nn::Model& model, DType dtype,
                      const zero::ZeroConfig& zcfg, const optim::OptimizerOptions& optimizer, const TrainData& data,
                      comm::Communicator& comm) {
  const int world = comm.world_size(), B = cfg.micro_batch, T = cfg.seq;
  const bool classifier = model.input_kind() == nn::InputKind::features;
  const bool default_run = cfg.data.empty();
  const uint64_t steps_per_epoch = data.steps_per_epoch;
  const std::optional<double>& entropy = data.entropy;
  progress.message(str_cat("zerone: model ", model.spec(), " (", model.num_parameters(),
                           " parameters), ", dtype_name(dtype), ", micro-batch ", B,
                           classifier ? "" : str_cat(" x seq ", T), " x accum ",
                           cfg.grad_accum, " x world ", world, ", ZeRO stage ", cfg.zero_stage,
                           zcfg.offload_optimizer != zero::OffloadDevice::none ? str_cat(", optimizer on ", cfg.offload_optimizer) : "",
                           zero::gradients_on_device(model.unit_numels(), world, zcfg) ? " (gradient sums on the device)" : "",
                           zcfg.offload_param != zero::OffloadDevice::none ? str_cat(", params on ", cfg.offload_param) : "",
                           ", ", optim::optimizer_name(optimizer), ", ", cfg.steps, " steps",
                           classifier ? str_cat(" (", steps_per_epoch, " per epoch)") : "", ", ", omp_get_max_threads(), " threads/rank",
                           world > 1 ? str_cat(", ", comm.description()) : "",
                           default_run ? str_cat("; built-in Markov corpus, entropy ", *entropy, " nats/token") : ""));
  if (world > 1) progress.message(str_cat("zerone: topology: ", comm::describe_topology(comm.hosts())));
  if (zero::zeropp_enabled(zcfg)) progress.message(str_cat("zerone: ZeRO++: ", zero::describe_zeropp(zcfg, comm.hosts())));
}

// Note [Model FLOPs] (throughput.h): the TFLOP/s per rank MFU is measured against and where it
// comes from: --peak-tflops, else the host's GEMM peak measured now (rank 0 of a model with a
// FLOP count) where the model runs on the host's cores (cpu, sim). On cuda the host's GEMMs say
// nothing of the GPU's: the vendor's dense peak of a known GPU (Note [Known GPU peaks],
// kernels/backend.h), else none and MFU is reported only with --peak-tflops.
std::pair<std::optional<double>, std::string> peak_tflop_per_s(const TrainConfig& cfg, DType dtype, bool lead,
                                                               const std::optional<double>& flops_per_token,
                                                               const kernels::Backend& device) {
  if (cfg.peak_tflops > 0) return {cfg.peak_tflops, "--peak-tflops"};
  if (device.kind() == kernels::DeviceKind::cuda) {
    if (const std::optional<kernels::GpuPeak> peak = device.peak(dtype))
      return {peak->dense_16bit_tflops, str_cat(peak->product, "'s dense ", dtype_name(dtype), " peak")};
    return {std::nullopt, ""};
  }
  if (lead && flops_per_token)
    return {measure_gemm_peak_tflop_per_s(dtype), str_cat("measured ", dtype == DType::bf16 ? "bf16" : "f32", " GEMM peak")};
  return {std::nullopt, ""};
}

// Note [The step loop]: StepLoop runs optimizer steps start_step..cfg.steps on what run_training
// built (it owns none of it): each step plans the engine's step, runs the micro-steps on the
// step's global batch (Note [Samples]), agrees with the other ranks on the loss, a stop signal and
// a finished background save in one all-reduce, steps the optimizer, the loss scaler and the
// schedule, validates when due, reports the step (progress, metrics, monitors) and saves a
// checkpoint when due. A stop signal saves the last complete step and ends the loop.
struct StepLoopInputs {
  const TrainConfig& cfg;
  comm::Communicator& comm;
  nn::Model& model;
  zero::ZeroEngine& engine;
  BatchSource* train_source;
  BatchSource* val_source;  // null: no validation
  LrSchedule& schedule;
  zero::LossScaler& scaler;
  bool scaled;  // fp16: the loss is scaled
  Checkpointer* checkpointer;     // null: no --checkpoint-dir
  report::Monitors* monitors;     // null: none (and on ranks other than 0)
  Progress& progress;
  MetricsWriter& metrics;
  RunSummary& summary;
  std::chrono::steady_clock::time_point run_t0;
  int start_step;
  uint64_t samples_base;     // the stream position step start_step starts at
  uint64_t steps_per_epoch;  // image data
  std::optional<double> flops_per_token, peak_tflops;
  int64_t skipped_steps = 0;  // fp16 overflows so far (a resumed run's included)
};
struct StepLoop : StepLoopInputs {
  explicit StepLoop(const StepLoopInputs& inputs) : StepLoopInputs(inputs) {}
  // The profiler keeps no pointer to the backend's timeline past the loop, however it ended.
  ~StepLoop() {
    Profiler::reset();
    Profiler::set_device_timeline(nullptr);
    Profiler::set_enabled(false);
    Profiler::set_itemize_device_work(false);
  }
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  // What the loop keeps and reports.
  TrainResult result;
  double profiled_wall_s = 0.0;  // steps 2.. (the first step creates the GEMM primitives)
  // Derived from the above.
  const int world = comm.world_size(), rank = comm.rank();
  const bool lead = rank == 0;
  const int B = cfg.micro_batch, T = cfg.seq;
  const bool classifier = model.input_kind() == nn::InputKind::features;
  const uint64_t global_batch = static_cast<uint64_t>(B) * cfg.grad_accum * world;  // samples per step

  // The state after `done` steps, for a checkpoint.
  TrainerState state_after(int done) const {
    TrainerState st;
    st.step = done;
    st.consumed_samples = samples_base + static_cast<uint64_t>(done - start_step + 1) * global_batch;
    st.epoch_samples = train_source->samples_per_epoch();
    st.micro_batch = B;
    st.seq = T;
    st.grad_accum = cfg.grad_accum;
    st.world_size = world;
    st.seed = cfg.seed;
    st.shuffle = !cfg.no_shuffle;
    st.lr_advances = schedule.advances();
    st.loss_scaler = scaler.state();
    st.skipped_steps = skipped_steps;
    st.settings = result_settings(cfg);
    return st;
  }
  // "saved checkpoint 'DIR/step-N' (B bytes; rank 0 wrote its file in S s; stall T s)".
  void report_saved() {
    if (!lead) return;
    progress.message(str_cat("saved checkpoint '", cfg.checkpoint_dir, "/",
                             io::checkpoint_step_name(checkpointer->last_published_step()), "' (",
                             human_bytes(static_cast<double>(checkpointer->last_bytes())), " from ", world,
                             world > 1 ? " ranks" : " rank", "; rank 0 wrote its file in ",
                             fixed(checkpointer->last_write_s(), 3), " s",
                             checkpointer->last_copied_bytes() > 0
                                 ? str_cat(", of which ", human_bytes(static_cast<double>(checkpointer->last_copied_bytes())),
                                           " copied disk to disk from the optimizer's swap file")
                                 : "",
                             "; training stalled ", fixed(checkpointer->last_stall_s(), 3), " s)"));
  }
  void save_checkpoint(int done) {
    comm.set_phase(str_cat("checkpoint of step ", done));
    if (lead) progress.message(str_cat("saving checkpoint of step ", done, " in '", cfg.checkpoint_dir, "' ..."));
    // Outside the steps' wall time, so the profiler does not count it either (its copies of the
    // whole state would be transfers beyond the steps' time).
    const bool profiling = Profiler::enabled();
    Profiler::set_enabled(false);
    checkpointer->save(engine, state_after(done));
    Profiler::set_enabled(profiling);
    if (!cfg.checkpoint_async) report_saved();
    else if (lead)
      progress.message(str_cat("staged checkpoint of step ", done, " (stall ", fixed(checkpointer->last_stall_s(), 3),
                               " s); writing in the background"));
  }
  // What a stop signal leaves after `done` steps, for its message.
  std::string kept_after(int done) const {
    std::string kept = done > 0 ? str_cat("steps 1..", done, " were trained") : "no step was trained";
    if (!cfg.metrics.empty()) kept += str_cat("; their metrics are in '", cfg.metrics, "'");
    if (!cfg.save.empty()) kept += str_cat("; --save '", cfg.save, "' was not written (it is written when training ends)");
    if (checkpointer && checkpointer->last_published_step() > 0)
      kept += str_cat("; checkpoint '", cfg.checkpoint_dir, "/", io::checkpoint_step_name(checkpointer->last_published_step()),
                      "' holds the last of them (--resume continues)");
    return kept;
  }

  // Runs the steps; false when a stop signal ended them (result.interrupted_by says which).
  bool run() {
    // Always on: the summary says where the time went (a scope costs two clock reads).
    Profiler::set_enabled(true);
    Profiler::set_device_timeline(model.backend().device_timeline());  // Note [Exposed time]
    // Note [Device compute itemized]: --profile times each device operation on a GPU.
    Profiler::set_itemize_device_work(cfg.profile && model.backend().device_timeline() != nullptr);
    if (cfg.profile && cfg.steps - start_step < 1 && lead)
      progress.warning("--profile reports steps 2 and later (the first creates the GEMM primitives): nothing to report in 1 step");
    throw_if_interrupted();
    if (start_step > cfg.steps && lead)
      progress.message(str_cat("zerone: the checkpoint is at step ", start_step - 1, ", --steps is ", cfg.steps,
                               ": nothing left to train"));
    if (lead && start_step <= cfg.steps) progress.starting(start_step, cfg.steps);
    for (int step = start_step; step <= cfg.steps; ++step) {
      if (step == start_step + 1) Profiler::reset();
      comm.set_phase(str_cat("step ", step));
      auto t0 = std::chrono::steady_clock::now();
      const comm::TrafficBytes traffic0 = comm::Traffic::global().totals();
      double loss_sum = 0.0;  // gradients start at zero: the optimizer step zeroes them
      const double loss_scale = scaled ? scaler.scale() : 1.0;
      const float lr = static_cast<float>(schedule.lr());
      // Before the backward: with the early step the optimizer's step begins during it.
      const bool checkpoint_after = checkpointer && ((cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0) || step == cfg.steps);
      if (checkpoint_after) engine.prepare_checkpoint();
      engine.plan_step(lr, cfg.grad_clip, loss_scale, scaled);  // Note [Early optimizer step]
      for (int micro = 0; micro < cfg.grad_accum; ++micro) {
        // Note [Samples] (batch_source.h): the step's global batch, this micro-step's and rank's B of it.
        const uint64_t place = (static_cast<uint64_t>(micro) * world + rank) * B;
        nn::Batch batch;
        {
          ProfileScope profile(ProfileCategory::data);
          batch = train_source->load(samples_base + static_cast<uint64_t>(step - start_step) * global_batch + place);
        }
        // Note [Dropout keys] (kernels/cpu/classifier.h): the sample's place in the global batch.
        batch.training = true;
        batch.seed = cfg.seed;
        batch.step = static_cast<uint64_t>(step);
        batch.first_sample = place;
        loss_sum += model.forward(batch);
        engine.set_last_micro_step(micro == cfg.grad_accum - 1);
        model.backward(static_cast<float>(loss_scale / cfg.grad_accum));
      }
      // The reported loss is the mean over the global batch. An interrupt rides on the same
      // all-reduce, so every rank stops at this step (Note [Interrupts]).
      // A background checkpoint write that every rank has finished is published here, at the same
      // step on every rank (Note [Saving a step]).
      const int signal_here = interrupt_signal();
      const bool save_pending = checkpointer && checkpointer->pending();
      double reduced[5] = {loss_sum, signal_here == SIGINT ? 1.0 : 0.0, signal_here == SIGHUP ? 1.0 : 0.0,
                           signal_here == SIGTERM ? 1.0 : 0.0, save_pending && checkpointer->writer_done() ? 1.0 : 0.0};
      comm.all_reduce_sum_async(reduced, 5).wait();
      if (save_pending && reduced[4] == static_cast<double>(world)) {
        checkpointer->publish_pending();
        report_saved();
      }
      // Note [Resume]: a stop signal seen after the backward finishes the step in progress and stops
      // after it, its checkpoint holding it. Stopping before the update would leave a half-updated
      // state: the early step (Note [Early optimizer step]) has updated most units by now. Every
      // rank sees the same sums, so all agree on the signal (SIGTERM over SIGHUP over SIGINT).
      const int stop_signal = reduced[3] > 0.0 ? SIGTERM : reduced[2] > 0.0 ? SIGHUP : reduced[1] > 0.0 ? SIGINT : 0;
      float loss = static_cast<float>(reduced[0] / (static_cast<double>(cfg.grad_accum) * world));
      ZERONE_CHECK(std::isfinite(loss), "training diverged at step ", step, ": loss ", loss, " (try a lower --lr or --grad-clip)");
      zero::StepResult stepped = engine.step(lr, cfg.grad_clip, loss_scale, scaled);
      // --delayed-update: the last update is waited for and installed before the final validation
      // and --save (Note [Delayed parameter update]).
      if (step == cfg.steps) engine.finish_delayed_update();
      if (scaled) scaler.update(stepped.overflow);
      if (stepped.overflow) ++skipped_steps;
      schedule.advance(!stepped.overflow);
      // The wait for the GPU is the step's; reading the spans is not (Profiler::wait_to_settle).
      const size_t max_pending = step == cfg.steps ? 0 : kSpansBeforeSettling;
      Profiler::wait_to_settle(max_pending);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      Profiler::settle(max_pending);
      if (step > start_step) profiled_wall_s += ms / 1000.0;

      StepRecord record;
      record.step = step;
      record.total_steps = cfg.steps;
      record.loss = loss;
      record.lr = lr;
      record.grad_norm = static_cast<float>(stepped.norm);
      if (scaled) record.loss_scale = loss_scale;
      record.skipped = stepped.overflow;
      record.ms = ms;
      if (world > 1) {
        const comm::TrafficBytes sent = comm::Traffic::global().totals() - traffic0;
        record.comm_bytes_intra = sent.intra;
        record.comm_bytes_inter = sent.inter;
      }
      const double rate = static_cast<double>(B) * T * cfg.grad_accum * world / (ms / 1000.0);
      if (classifier) record.samples_per_s = rate;
      else record.tokens_per_s = rate;
      record.timestamp_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      record.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_t0).count();
      record.seen = static_cast<int64_t>(samples_base + static_cast<uint64_t>(step - start_step + 1) * global_batch) * T;
      if (flops_per_token) {
        record.tflop_per_s = *flops_per_token * static_cast<double>(B) * T * cfg.grad_accum * world / (ms / 1000.0) / 1e12;
        if (peak_tflops) record.mfu = *record.tflop_per_s / (world * *peak_tflops);
      }
      // Classifiers validate at the end of every epoch too, on the whole --val-data unless
      // --val-batches limits it.
      const bool epoch_end = classifier && step % steps_per_epoch == 0;
      int64_t val_samples = 0, val_samples_here = 0;
      bool validate_now = val_source && stop_signal == 0 &&
                          ((cfg.val_every > 0 && step % cfg.val_every == 0) || step == cfg.steps || epoch_end);
      if (validate_now) {
        // Validation is outside the step's wall time, so --profile does not count it either.
        Profiler::set_enabled(false);
        comm.set_phase(str_cat("validation after step ", step));
        const uint64_t batches = classifier && !cfg.is_given("--val-batches") ? val_source->batches_per_epoch()
                                                                              : static_cast<uint64_t>(cfg.val_batches);
        const std::optional<Evaluation> evaluated = evaluate(model, *val_source, batches, comm);
        Profiler::set_enabled(true);  // the summary splits the step's time (issue 23)
        if (!evaluated) {
          // Stopped during validation (Note [Interrupted evaluation]): step `step` is complete, so
          // its metrics are written and the stop checkpoint holds it.
          int sig = interrupt_signal();
          double reduced_sig[3] = {sig == SIGINT ? 1.0 : 0.0, sig == SIGHUP ? 1.0 : 0.0, sig == SIGTERM ? 1.0 : 0.0};
          comm.all_reduce_sum_async(reduced_sig, 3).wait();
          result.interrupted_by = reduced_sig[2] > 0.0 ? SIGTERM : reduced_sig[1] > 0.0 ? SIGHUP : SIGINT;
          result.steps = step;
          result.final_train_loss = loss;
          if (lead) progress.step(record);
          metrics.write(record);
          stop_after(step, str_cat(" during the validation after step ", step, " of ", cfg.steps));
          return false;
        }
        const Evaluation& e = *evaluated;
        record.val_loss = e.loss;
        record.val_accuracy = e.accuracy;
        val_samples = e.samples;
        val_samples_here = e.samples_here;
      }
      if (lead) {
        progress.step(record);
        if (record.val_loss && step != cfg.steps) {
          std::string what = epoch_end ? str_cat("epoch ", step / steps_per_epoch, " (step ", step, ")") : str_cat("step ", step);
          std::string acc = record.val_accuracy ? str_cat(", val accuracy ", *record.val_accuracy * 100.0f, "% (", val_samples,
                                                          " samples", world > 1 ? str_cat(", ", val_samples_here, " on rank 0") : "",
                                                          ")")
                                                : "";
          progress.message(str_cat(what, ": val loss ", *record.val_loss, acc));
        }
      }
      if (std::optional<std::string> warning = metrics.write(record); warning && lead) progress.warning(*warning);
      if (lead) summary.add(record);
      if (monitors) {
        // DeepSpeed's tags and x axis: global samples (sequences) so far.
        const int64_t samples = record.seen / T;
        std::vector<report::MonitorEvent> events = {{"Train/Samples/train_loss", loss, samples}, {"Train/Samples/lr", lr, samples}};
        if (scaled) events.push_back({"Train/Samples/loss_scale", loss_scale, samples});
        if (std::isfinite(record.grad_norm)) events.push_back({"Train/Samples/grad_norm", record.grad_norm, samples});
        if (record.val_loss) events.push_back({"Train/Samples/val_loss", *record.val_loss, samples});
        if (std::optional<std::string> warning = monitors->write(events, record.timestamp_s)) progress.warning(*warning);
      }
      result.steps = step;
      result.final_train_loss = loss;
      if (record.val_loss) result.final_val_loss = record.val_loss;
      if (record.val_accuracy) result.final_val_accuracy = record.val_accuracy;
      if (checkpoint_after) save_checkpoint(step);
      if (stop_signal != 0) {
        result.interrupted_by = stop_signal;
        // At the last step the run has ended: it finishes as any run does (--save written; report()
        // says when the signal came) and exits with the signal's status.
        if (step == cfg.steps) break;
        stop_after(step, str_cat(signal_here == 0 ? " (on another rank)" : "", " during step ", step, " of ", cfg.steps));
        return false;
      }
    }
    return true;
  }

  // After the last step: publishes a pending save, ends the progress display and fills the
  // summary's time split.
  // A background save in flight, if any, is waited for, published and reported.
  void publish_saved() {
    if (checkpointer && checkpointer->pending()) {
      checkpointer->publish_pending();
      report_saved();
    }
  }
  // A stop signal (result.interrupted_by) after step `done` completed: its checkpoint is written
  // unless it was already, and the run says what was kept (`when`: where the signal found it).
  void stop_after(int done, const std::string& when) {
    publish_saved();
    if (checkpointer && checkpointer->last_published_step() < done) {
      save_checkpoint(done);
      publish_saved();
    }
    if (lead)
      progress.message(str_cat("zerone: stopped by ", signal_name(result.interrupted_by), when, ": ", kept_after(done)));
  }

  void finish() {
    publish_saved();
    progress.finish();
    // Note [Exposed time]: on a device timeline, what no scope took is the device's compute,
    // unless --profile itemized it (Note [Device compute itemized]): then it is the GPU's idle
    // between operations.
    const bool itemized = Profiler::itemizes_device_work();
    const bool compute_is_remainder = model.backend().device_timeline() != nullptr && !itemized;
    const char* remainder = compute_is_remainder ? "device compute and launches" : itemized ? "launches and gaps" : "other";
    if (cfg.profile && cfg.steps > start_step && lead) {
      progress.message(str_cat("time per step ", 1000.0 * profiled_wall_s / (cfg.steps - start_step), " ms: ",
                               Profiler::report(profiled_wall_s, cfg.steps - start_step, remainder)));
    }
    Profiler::set_enabled(false);
    Profiler::set_itemize_device_work(false);
    Profiler::set_device_timeline(nullptr);
    if (lead && cfg.steps > start_step) {
      summary.profiled_steps = cfg.steps - start_step;
      summary.profiled_wall_s = profiled_wall_s;
      summary.compute_s = Profiler::seconds(ProfileCategory::gemm) + Profiler::seconds(ProfileCategory::attention) +
                          Profiler::seconds(ProfileCategory::elementwise);
      summary.comm_s = Profiler::seconds(ProfileCategory::comm);
      summary.optimizer_s = Profiler::seconds(ProfileCategory::optimizer);
      summary.transfer_s = Profiler::seconds(ProfileCategory::transfer);
      summary.optimizer_hidden_share = Profiler::hidden_share(ProfileCategory::optimizer);
      summary.compute_is_remainder = compute_is_remainder;
      if (!compute_is_remainder) summary.remainder_name = remainder;
      summary.io_s = Profiler::seconds(ProfileCategory::data) + Profiler::seconds(ProfileCategory::swap);
    }
  }

  // The end of the run, after --save: what was written, the summary and the final loss line.
  TrainResult report(const std::optional<double>& entropy, DType dtype, const zero::ZeroConfig& zcfg,
                     zero::CollectiveRoute route) {
    if (int sig = interrupt_signal(); sig != 0) {
      result.interrupted_by = sig;
      if (lead) progress.message(str_cat("zerone: ", signal_name(sig), " arrived after the last step; everything was written"));
    }
    if (const zero::EarlyStats& e = engine.early_stats();
        lead && e.validated + e.redone + e.skipped + e.held_back > 0)
      progress.message(str_cat("early step (Note [Speculative early step]): ", e.validated, " speculative steps validated, ",
                               e.redone, " taken back and redone (clipped), ", e.skipped, " taken back and skipped (fp16 overflow), ",
                               e.held_back, " stepped at the end after a clipped step"));
    if (skipped_steps > 0 && lead)
      progress.warning(str_cat(skipped_steps, " of ", cfg.steps, " steps were skipped for gradient overflow (fp16)",
                               skipped_steps == cfg.steps ? ": nothing was trained; lower --loss-scale or use dynamic scaling"
                                                          : ""));
    if (metrics.missing_lines() > 0 && lead)
      progress.warning(str_cat("--metrics '", cfg.metrics, "' lacks ", metrics.missing_lines(), " of ", cfg.steps,
                               " lines (writes failed)"));
    result.source_entropy = entropy;
    // Resumed at or past --steps: no step ran, so there is no loss to report (it printed 0.0000).
    if (start_step > cfg.steps) return result;
    if (lead) {
      summary.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_t0).count();
      fill_memory_summary(summary, model, dtype, cfg, zcfg, world, route);
      if (!cfg.metrics.empty())
        summary.written.push_back(str_cat("metrics '", cfg.metrics, "' (", result.steps - start_step + 1 - metrics.missing_lines(), " lines)"));
      if (checkpointer && checkpointer->last_published_step() > 0)
        summary.written.push_back(str_cat("checkpoint '", cfg.checkpoint_dir, "/",
                                          io::checkpoint_step_name(checkpointer->last_published_step()), "'"));
      if (!cfg.save.empty()) summary.written.push_back(str_cat("--save '", cfg.save, "'"));
      if (monitors)
        for (const std::string& w : monitors->written()) summary.written.push_back(w);
      if (!cfg.report.empty()) {
        // A report that cannot be written costs the run nothing: everything else is saved already.
        try {
          report::write_html_report(report::read_run_logs({cfg.metrics}), cfg.report);
          summary.written.push_back(str_cat("report '", cfg.report, "'"));
        } catch (const Error& e) {
          progress.warning(str_cat("--report: ", e.what()));
        }
      }
      for (const std::string& line : summary.lines()) progress.message(line);
    }
    float final_loss = result.final_val_loss.value_or(result.final_train_loss);
    char line[160];
    if (entropy) {
      std::snprintf(line, sizeof line, "final loss %.4f nats/token; source entropy %.4f nats/token", final_loss, *entropy);
    } else {
      if (classifier && result.final_val_accuracy)
        std::snprintf(line, sizeof line, "final loss %.4f (validation), val accuracy %.2f%%", final_loss,
                      *result.final_val_accuracy * 100.0);
      else
        std::snprintf(line, sizeof line, "final loss %.4f %s(%s)", final_loss, classifier ? "" : "nats/token ",
                      result.final_val_loss ? "validation" : "last training step");
    }
    if (lead) progress.message(line);
    return result;
  }
};

}  // namespace

kernels::DeviceOptions device_options(const TrainConfig& cfg) {
  return kernels::DeviceOptions{.cuda_attention = kernels::parse_cuda_attention(cfg.cuda_attention)};
}

optim::OptimizerOptions optimizer_options(const TrainConfig& cfg) {
  if (cfg.optimizer == "sgd") return optim::SGDOptions{cfg.momentum, cfg.dampening, cfg.weight_decay, cfg.nesterov};
  return optim::AdamWOptions{cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay};
}

zero::ZeroConfig zero_config(const TrainConfig& cfg, DType dtype, const std::vector<size_t>& unit_numels, int world,
                             const io::FaultEnv& env) {
  zero::ZeroConfig zcfg;
  zcfg.stage = cfg.zero_stage;
  zcfg.reduce_bucket_numel = cfg.reduce_bucket_size > 0 ? static_cast<size_t>(cfg.reduce_bucket_size)
                                                        : zero::auto_bucket_numel(unit_numels, world);
  zcfg.allgather_bucket_numel = static_cast<size_t>(cfg.allgather_bucket_size);
  zcfg.prefetch_numel = static_cast<size_t>(cfg.stage3_prefetch_bucket_size);
  zcfg.persistence_threshold = static_cast<size_t>(cfg.stage3_param_persistence_threshold);
  zcfg.offload_optimizer = zero::parse_offload_device(cfg.offload_optimizer, "--offload-optimizer");
  zcfg.offload_param = zero::parse_offload_device(cfg.offload_param, "--offload-param");
  zcfg.sub_group_numel = cfg.sub_group_size > 0 ? static_cast<size_t>(cfg.sub_group_size)
                                                : zero::auto_sub_group_numel(unit_numels, world, cfg.zero_stage,
                                                                             cfg.offload_buffer_count);
  zcfg.offload_buffer_count = cfg.offload_buffer_count;
  zcfg.offload_optimizer_ratio = cfg.offload_optimizer_ratio;
  zcfg.offload_optimizer_nvme_ratio = cfg.offload_optimizer_nvme_ratio;
  zcfg.delayed_update = cfg.delayed_update;
  zcfg.early_step = cfg.early_step;
  // Note [Transient gradients]: the run's promise, one micro-step a step with no clipping or loss
  // scaling; zero::gradients_transient adds the engine's own conditions (stage, early step, no
  // delayed update, no partial offload). transient_gradients_blocker names all of them.
  zcfg.transient_gradients = cfg.transient_gradients && cfg.grad_accum == 1 && cfg.grad_clip <= 0.0f && dtype != DType::f16;
  // Note [Gradient sums on the device]: "auto" asks for them where a device the host cannot address
  // (a GPU, or the simulated one) adds micro-steps; fit_grad_sums takes them back where they would
  // not fit. On the cpu device both places are the same memory: host, as before.
  zcfg.device_is_host_memory = kernels::device_or_default(cfg.device) == kernels::DeviceKind::cpu;
  zcfg.grad_sums_on_device = cfg.grad_accumulators == "device" ||
                             (cfg.grad_accumulators == "auto" && cfg.grad_accum > 1 && !zcfg.device_is_host_memory);
  zcfg.hpz_partition_size = cfg.hpz_partition_size;
  zcfg.quantized_weights = cfg.quantized_weights;
  zcfg.quantized_gradients_bits = cfg.quantized_gradients;
  // Note [Speculative early step]: with clipping or fp16 loss scaling the early step speculates,
  // for every optimizer (AdamW and SGD step shard by shard and keep undo copies; zero::speculates
  // decides where: with NVMe state and no partial optimizer offload).
  zcfg.speculative_step = cfg.early_step && !cfg.delayed_update && (cfg.grad_clip > 0.0f || dtype == DType::f16);
  // Tests and benchmarks only: speculate with the state in memory too ("memory"), and also after a
  // clipped step ("always").
  zcfg.speculate_in_memory = env.speculate == "memory" || env.speculate == "always";
  zcfg.speculate_always = env.speculate == "always";
  return zcfg;
}

optim::NvmeConfig nvme_config(const TrainConfig& cfg, int rank, const io::FaultEnv& env) {
  optim::NvmeConfig nvme;
  nvme.nvme_path = cfg.nvme_path;
  nvme.rank = rank;
  nvme.pipeline_read = cfg.pipeline_read;
  nvme.pipeline_write = cfg.pipeline_write;
  nvme.pin_memory = cfg.pin_memory;
  nvme.aio.block_bytes = static_cast<size_t>(cfg.aio_block_size);
  nvme.aio.queue_depth = cfg.aio_queue_depth;
  nvme.aio.intra_op_parallelism = cfg.aio_intra_op_parallelism;
  nvme.aio.single_submit = cfg.aio_single_submit;
  nvme.aio.overlap_events = cfg.aio_overlap_events;
  // Tests only (tests/zero/offload_faults.sh): make the Nth swap transfer fail (io::parse_fault_plan).
  nvme.fault_plan = env.swap_fault_plan;
  nvme.grad_fault_plan = env.grad_swap_fault_plan;
  return nvme;
}

TrainConfig resolve_settings(TrainConfig cfg, int world) {
  const bool default_run = cfg.data.empty();
  // Image data (a directory of IDX files): validation defaults to the t10k-* files beside train-*.
  const bool image_data = !default_run && io::has_image_split(cfg.data, "train");
  if (image_data && cfg.val_data.empty() && io::has_image_split(cfg.data, "t10k")) cfg.val_data = cfg.data;
  ZERONE_CHECK(!(default_run && !cfg.val_data.empty()), "--val-data given without --data");
  resolve_batch_sizes(cfg, world);  // before the default run's batch, which fills only what is not given
  if (default_run) cfg = default_run_config(cfg);
  validate(cfg);
  return cfg;
}

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

TrainResult run_training(TrainConfig cfg, comm::Communicator& comm, const io::FaultEnv& env) {
  const auto run_t0 = std::chrono::steady_clock::now();
  const int world = comm.world_size(), rank = comm.rank();
  const bool lead = rank == 0;
  const bool default_run = cfg.data.empty();
  const bool image_data = !default_run && io::has_image_split(cfg.data, "train");
  cfg = resolve_settings(std::move(cfg), world);
  comm.set_timeout(cfg.comm_timeout_s);  // Note [Collective timeout]
  comm.set_phase("start-up");
  InterruptGuard interrupts;
  if (cfg.threads > 0) omp_set_num_threads(cfg.threads);
  else if (int t = default_threads_per_rank(); t > 0) omp_set_num_threads(t);
  const DType dtype = resolve_precision(cfg.precision);
  check_settings_take_effect(cfg, dtype == DType::f16, default_run || !cfg.val_data.empty());
  if (lead)
    for (const std::string& notice : cfg.notices) std::fprintf(stderr, "zerone: notice: %s\n", notice.c_str());

  // Model shape: --model, else the --init file's header; both given must agree. The model is built
  // without storage: the engine materializes it unit by unit (from the seed or the --init file),
  // keeping only what its stage needs (Note [Materializing units]).
  // Note [Resume] (train/checkpoint.h): the checkpoint to continue from decides the model; a
  // zerone checkpoint given to --init gives the weights only.
  std::unique_ptr<io::CheckpointReader> resume_from;
  // Note [One run per checkpoint directory] (io/sharded_checkpoint.h): rank 0 locks an existing
  // --checkpoint-dir before reading it (one created at start-up is locked once it exists), refuses
  // another run's checkpoints without --resume, and sweeps the temporaries of killed saves.
  std::optional<io::CheckpointDirLock> checkpoint_lock;
  auto lock_checkpoint_dir = [&] {
    checkpoint_lock.emplace(cfg.checkpoint_dir);
    if (!cfg.resume)
      if (std::optional<std::string> run = io::describe_checkpoint_run(cfg.checkpoint_dir))
        throw Error(str_cat("--checkpoint-dir '", cfg.checkpoint_dir, "' holds the checkpoints of an earlier run (", *run,
                            "): give --resume to continue it, or a new --checkpoint-dir to start over (a new run ",
                            "there would move 'latest' back to its own steps and prune the earlier run's)"));
    io::remove_stale_checkpoint_temporaries(cfg.checkpoint_dir);
  };
  if (lead && !cfg.checkpoint_dir.empty() && io::is_directory(cfg.checkpoint_dir)) lock_checkpoint_dir();
  if (cfg.resume) resume_from = find_resume_checkpoint(cfg, lead);
  std::string model_spec = cfg.model;
  // --init: a Hugging Face directory, a zerone checkpoint or an llm.c file (io/weight_source.h).
  std::unique_ptr<io::WeightSource> init_source;
  if (!resume_from && !cfg.init.empty()) init_source = std::make_unique<io::WeightSource>(cfg.init, "--init");
  const io::CheckpointReader* init_zerone = init_source ? init_source->checkpoint() : nullptr;
  if (const io::CheckpointReader* ckpt = resume_from ? resume_from.get() : init_zerone) {
    // Canonical form: a spec spelled differently (a preset name, another key order) is the same model.
    try {
      model_spec = nn::make_model(ckpt->manifest().model, dtype, 64, false)->spec();
    } catch (const Error& e) {
      throw Error(str_cat("checkpoint '", ckpt->path(), "' holds model '", ckpt->manifest().model,
                          "', which is not a model spec: ", e.what()));
    }
    if (!cfg.model.empty()) {
      const std::string requested = nn::make_model(cfg.model, dtype, 64, false)->spec();
      ZERONE_CHECK(requested == model_spec, "--model ", requested, " disagrees with checkpoint '", ckpt->path(),
                   "', which holds ", model_spec);
    }
  } else if (init_source && init_source->format() == io::WeightFormat::hf_directory) {
    model_spec = init_source->spec();
    if (lead && !init_source->notice().empty()) std::fprintf(stderr, "zerone: notice: %s\n", init_source->notice().c_str());
    if (!cfg.model.empty()) {
      const std::string requested = nn::make_model(cfg.model, dtype, 64, false)->spec();
      const std::string held = nn::make_model(model_spec, dtype, 64, false)->spec();
      ZERONE_CHECK(requested == held, "--model ", requested, " disagrees with --init '", cfg.init, "', which holds ", held);
    }
  } else if (init_source) {
    const nn::GPT2Config from_file = nn::parse_model_spec(init_source->spec());
    if (!cfg.model.empty()) {
      ZERONE_CHECK(!nn::is_llama_spec(cfg.model), "--init '", cfg.init, "' is an llm.c GPT-2 checkpoint, but --model ",
                   cfg.model, " is a LLaMA");
      const nn::GPT2Config requested = nn::parse_model_spec(cfg.model);
      ZERONE_CHECK(requested == from_file, "--model ", requested.to_string(), " disagrees with --init '", cfg.init,
                   "', which holds ", from_file.to_string());
    }
    model_spec = from_file.to_string();
  } else {
    ZERONE_CHECK(!cfg.model.empty(), "--model is required with --data (or --init FILE to take the shape from a checkpoint)");
  }
  // Note [Models and their device] (nn/model.h): the device is chosen before anything lives on it.
  kernels::use_device(kernels::device_or_default(cfg.device), device_options(cfg));
  std::unique_ptr<nn::Model> model_owner = nn::make_model(model_spec, dtype, zero::kShardAlign * world, /*allocate=*/false);
  nn::Model& model = *model_owner;
  model.set_activation_checkpointing(cfg.activation_checkpointing);
  model.set_cpu_checkpointing(cfg.cpu_checkpointing);
  const bool classifier = model.input_kind() == nn::InputKind::features;
  if (classifier) {
    ZERONE_CHECK(image_data, "--model ", model.spec(), " is an image classifier: give --data DIR, a directory with ",
                 "train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz] (e.g. /usr/share/datasets/fashion-mnist)",
                 default_run ? "" : str_cat("; '", cfg.data, "' is not one"));
    ZERONE_CHECK(!cfg.is_given("--seq"), setting_name(cfg, "--seq"), " applies to token models; ", model.spec(),
                 " reads one image per sample");
    cfg.seq = 1;
    ZERONE_CHECK(cfg.save.empty(), "--save writes llm.c or Hugging Face checkpoints, which hold GPT-2 and LLaMA models; ",
                 model.spec(), " cannot be saved in them");
  } else {
    ZERONE_CHECK(!image_data, "--data '", cfg.data, "' holds IDX images, but --model ", model.spec(),
                 " reads tokens: give an image classifier (mnist-mlp, mnist-cnn, cifar-cnn or seq:...)");
    ZERONE_CHECK(!cfg.is_given("--epochs"), setting_name(cfg, "--epochs"),
                 " applies to image data; token runs count --steps");
  }
  ZERONE_CHECK(cfg.seq <= model.max_seq_len(), "--seq ", cfg.seq, " exceeds the model's context length ",
               model.max_seq_len());
  ZERONE_CHECK(cfg.save.empty() || save_is_hf_directory(cfg.save) || dynamic_cast<nn::GPT2*>(&model) != nullptr,
               "--save '", cfg.save, "' names a file, which is an llm.c GPT-2 checkpoint and cannot hold ", model.spec(),
               ": give a directory (ending in '/') for a Hugging Face checkpoint");
  if (resume_from) check_checkpoint_fits(*resume_from, model, dtype);
  if (init_zerone) check_checkpoint_fits(*init_zerone, model, dtype, /*weights_only=*/true);
  auto settings = consistency_settings(cfg);
  settings.emplace_back("the model", model.spec());
  if (resume_from) settings.emplace_back("the checkpoint resumed", str_cat(resume_from->path(), " step ", resume_from->manifest().step));
  settings.emplace_back("the precision", dtype_name(dtype));
  check_same_config_everywhere(settings, comm);
  if (lead) check_outputs(cfg);  // only rank 0 writes; its error ends the job (Note [Errors under MPI])
  if (lead && !cfg.checkpoint_dir.empty()) {
    io::check_checkpoint_root(cfg.checkpoint_dir, "--checkpoint-dir");
    if (!checkpoint_lock) lock_checkpoint_dir();
  }

  zero::ZeroConfig zcfg = zero_config(cfg, dtype, model.unit_numels(), world, env);
  zero::check_zeropp(zcfg, world);
  const optim::NvmeConfig nvme = nvme_config(cfg, rank, env);
  // Note [Choosing NCCL] (comm/comm_choice.h): the library of the collectives over device memory,
  // before the fit check (which counts what it stages through host memory). On cuda every rank
  // tells its GPU first (collective), so that ranks sharing one never reach NCCL.
  const comm::CommChoice comm_choice = [&] {
    kernels::Backend& device = model.backend();
    const bool on_gpu = device.kind() == kernels::DeviceKind::cuda;
    const std::vector<std::string> gpus = on_gpu && world > 1 ? comm::gather_device_identities(comm, device)
                                                              : std::vector<std::string>{};
    return comm::choose_comm_library(cfg.comm, device.kind(), comm::nccl_compiled_in(), world, gpus);
  }();
  const zero::CollectiveRoute route = zero::collective_route(model.backend().kind(), world, comm_choice.library);
  zcfg = fit_grad_sums(cfg, model, dtype, world, cfg.seq, cfg.zero_stage, zcfg,
                       start_up_budget(cfg, model.backend().kind(), model.backend().device_memory()), route);
  // Every rank must keep its sums where the others do (a collective's operands would be in
  // different places): on the device only where all ranks fit them.
  if (world > 1 && cfg.grad_accumulators == "auto")
    zcfg.grad_sums_on_device = comm.all_reduce_sum(zcfg.grad_sums_on_device ? 1.0 : 0.0) == static_cast<double>(world);
  check_memory_fits(model, dtype, cfg, zcfg, world, model.backend().kind(), model.backend().device_memory(), route);
  DeviceLimitGuard device_limit(static_cast<int64_t>(cfg.device_mem_limit * 1024.0 * 1024.0 * 1024.0));

  TrainData data = open_training_data(cfg, model, default_run, settings, comm);
  BatchSource* const train_source = data.train.get();
  BatchSource* const val_source = data.val.get();
  const uint64_t steps_per_epoch = data.steps_per_epoch;
  const std::optional<double> entropy = data.entropy;
  const int T = cfg.seq;
  // The run's position: step 1 and sample 0, or where the checkpoint left off (Note [Resume]).
  TrainerState resumed;
  if (resume_from) resumed = resume_trainer_state(*resume_from, cfg, world, *train_source, lead);
  const int start_step = static_cast<int>(resumed.step) + 1;
  const uint64_t samples_base = resumed.consumed_samples;
  // DeepSpeed's tensorboard and csv_monitor (report/monitors.h), rank 0; their directories are
  // created now, before the model is built (Note [No late errors]).
  std::unique_ptr<report::Monitors> monitors;
  if (lead && (!cfg.tensorboard_dir.empty() || !cfg.csv_monitor_dir.empty()))
    monitors = std::make_unique<report::Monitors>(cfg.tensorboard_dir, setting_name(cfg, "--tensorboard"), cfg.csv_monitor_dir,
                                                  setting_name(cfg, "--csv-monitor"),
                                                  resume_from ? static_cast<int64_t>(samples_base) : -1);

  // Opened and checked once; each unit then reads only its own bytes.
  if (init_source) init_source->bind(model);
  // --init's weights into unit u of `m` (the run's model, or an f32 copy for Note [f16 range]).
  auto load_init = [&](nn::Model& m, int u) { init_source->load_unit(m, u); };
  auto materialize = [&](int u) {
    throw_if_interrupted();
    if (resume_from) {
      resume_from->read(u, "param", 0, model.units()[u].numel(), dtype, model.units()[u].data());
    } else if (init_source) {
      load_init(model, u);
      io::check_unit_fits_f16(model, u, load_init, str_cat("--init '", cfg.init, "' at --precision fp16"));
    } else {
      model.init_unit(u, cfg.seed);
    }
  };
  const auto load_t0 = std::chrono::steady_clock::now();
  const optim::OptimizerOptions optimizer = optimizer_options(cfg);
  Progress progress;
  // A large model takes seconds to materialize (or read) before anything else is printed.
  if (lead)
    progress.message(str_cat("zerone: building ", model.spec(), " (", model.num_parameters(), " parameters, ",
                             resume_from ? "from the checkpoint" : cfg.init.empty() ? "initialized from the seed" : "read from --init",
                             ") ..."));
  std::unique_ptr<comm::Communicator> native_comm;  // outlives the engine
  if (lead && !comm_choice.notice.empty()) progress.message(str_cat("zerone: notice: ", comm_choice.notice));
  if (comm_choice.library == comm::CommLibrary::nccl) {
    native_comm = comm::make_nccl_communicator(comm, model.backend());
    if (lead) progress.message(str_cat("zerone: collectives over GPU memory: ", native_comm->description()));
  }
  zero::ZeroEngine engine(model, comm, zcfg, optimizer, materialize, nvme, native_comm.get());
  if (resume_from) resume_optimizer(*resume_from, engine);

  if (lead) print_run_header(progress, cfg, model, dtype, zcfg, optimizer, data, comm);
  MetricsWriter metrics(lead ? cfg.metrics : "");
  if (resume_from) metrics.continue_after(start_step - 1);
  const std::optional<double> flops_per_token = model_flops_per_token(model, T);  // Note [Model FLOPs]
  const auto [peak_tflops, peak_source] = peak_tflop_per_s(cfg, dtype, lead, flops_per_token, model.backend());
  RunSummary summary;
  summary.classifier = classifier;
  summary.world = world;
  summary.peak_tflop_per_s = peak_tflops;
  summary.peak_source = peak_source;
  if (lead) metrics.set_run_info(run_info(cfg, model, dtype, world, comm, start_step, flops_per_token, peak_tflops, peak_source));

  // fp16: dynamic (or static) loss scaling; bf16 and fp32 need none.
  const bool scaled = dtype == DType::f16;
  zero::LossScaler scaler(zero::LossScaleConfig{cfg.loss_scale == 0.0, cfg.loss_scale == 0.0 ? 1.0 : cfg.loss_scale,
                                                cfg.initial_scale_power, cfg.loss_scale_window, cfg.hysteresis,
                                                cfg.min_loss_scale});

  LrSchedule schedule(lr_schedule_config(cfg));
  int64_t skipped_steps = 0;
  if (resume_from) {
    resume_progress(resumed, schedule, scaled ? &scaler : nullptr, skipped_steps);
    if (lead)
      progress.message(str_cat("zerone: resumed from '", resume_from->path(), "' (step ", resumed.step, ", saved at world ",
                               resume_from->manifest().world_size, ", ZeRO stage ", resume_from->manifest().zero_stage,
                               "; rank 0 read ", human_bytes(static_cast<double>(resume_from->bytes_read())), " in ",
                               fixed(resume_from->read_seconds(), 3), " s, ",
                               fixed(std::chrono::duration<double>(std::chrono::steady_clock::now() - load_t0).count(), 3),
                               " s with allocating the model and optimizer)"));
  }
  resume_from.reset();  // its files are closed; nothing more is read
  init_source.reset();
  std::unique_ptr<Checkpointer> checkpointer;
  if (!cfg.checkpoint_dir.empty()) {
    CheckpointRunInfo info{model.spec(), dtype, cfg.zero_stage, cfg.offload_optimizer, cfg.offload_param,
                           io::checkpoint_units(model)};
    checkpointer = std::make_unique<Checkpointer>(cfg.checkpoint_dir, cfg.keep_last, cfg.checkpoint_async, info, comm, env);
  }
  StepLoop loop(StepLoopInputs{.cfg = cfg,
                               .comm = comm,
                               .model = model,
                               .engine = engine,
                               .train_source = train_source,
                               .val_source = val_source,
                               .schedule = schedule,
                               .scaler = scaler,
                               .scaled = scaled,
                               .checkpointer = checkpointer.get(),
                               .monitors = monitors.get(),
                               .progress = progress,
                               .metrics = metrics,
                               .summary = summary,
                               .run_t0 = run_t0,
                               .start_step = start_step,
                               .samples_base = samples_base,
                               .steps_per_epoch = steps_per_epoch,
                               .flops_per_token = flops_per_token,
                               .peak_tflops = peak_tflops,
                               .skipped_steps = skipped_steps});
  if (!loop.run()) return loop.result;
  loop.finish();
  if (!cfg.save.empty()) {
    const bool hf = save_is_hf_directory(cfg.save);
    const char* kind = hf ? "Hugging Face checkpoint" : "llm.c checkpoint";
    if (lead) progress.message(str_cat("saving ", kind, " '", cfg.save, "' ..."));
    comm.set_phase("--save");
    // Note [What an export carries]: a Hugging Face --init brings its tokenizer and special tokens.
    io::HfSaveExtras extras;
    if (!cfg.init.empty() && io::is_hf_directory(cfg.init)) extras.source_dir = cfg.init;
    const SavedWeights saved = save_weights(cfg.save, hf, extras, model, engine, lead);  // Note [Streaming save]
    if (lead)
      progress.message(str_cat("saved ", kind, " '", cfg.save, "' (one unit gathered at a time: rank 0 held at most ",
                               saved.peak_param_bytes, " bytes of parameters; the whole model is ",
                               saved.model_param_bytes, " bytes)"));
  }
  return loop.report(entropy, dtype, zcfg, route);
}

}  // namespace zerone::train
