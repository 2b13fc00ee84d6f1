#include "zerone/train/plan.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "zerone/comm/comm_choice.h"
#include "zerone/core/error.h"
#include "zerone/core/memory.h"
#include "zerone/core/sysinfo.h"
#include "zerone/io/aio.h"
#include "zerone/kernels/backend.h"
#include "zerone/train/settings.h"
#include "zerone/train/throughput.h"
#include "zerone/train/trainer.h"

namespace zerone::train {

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string fixed_text(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Note [Host memory speed with every core]: a streaming copy split over `threads` threads (each
// its own slice, as the CPU optimizer's kernels split a shard), best of a few: bytes read +
// written per second. The first form copied on one thread: 12.2 GB/s on the GPU machine's 16
// cores, where the offloaded AdamW of Llama-3.2-1B then took 0.95 s a step, not the 3.2 s the
// planner predicted from that figure (docs/BENCHMARKS.md, "ZeRO-Offload on the GPU"). The second
// copied 128 MiB, which a large server CPU's last-level cache holds: two runs on the same kind of
// GPU machine measured 121.5 and 67.9 GB/s, and on a 2-core development VM whose CPU reports 384
// MiB of it the copy read 78 GB/s beside the STREAM triad's 45-46. Now the buffers are twice the
// machine's last-level cache (memory_probe_bytes: within what the machine has free; 52-54 GB/s
// on that VM), and each thread first
// touches the slice it copies, so that its pages sit on its own NUMA node, as the optimizer's
// shard does after its first step.
double measure_memory_bytes_per_s(int threads) {
  const size_t n = memory_probe_bytes(last_level_cache_bytes(), available_memory_bytes());
  const std::unique_ptr<char[]> a(new char[n]), b(new char[n]);  // untouched: the threads touch their slices
  const size_t slice = (n + threads - 1) / threads;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const size_t lo = std::min(n, t * slice), hi = std::min(n, lo + slice);
    std::memset(a.get() + lo, 1, hi - lo);
    std::memset(b.get() + lo, 0, hi - lo);
  }
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; ++t) {
      const size_t lo = std::min(n, t * slice), hi = std::min(n, lo + slice);
      std::memcpy(b.get() + lo, a.get() + lo, hi - lo);
    }
    best = std::min(best, seconds_since(t0));
    a[rep] = b[n - 1 - rep];  // keep the copies observable
  }
  return 2.0 * static_cast<double>(n) / best;
}

// Writes and reads back 64 MiB under `dir` (O_DIRECT where the file system takes it, as the swap
// does); the file is removed. Bytes per second over both.
double measure_disk_bytes_per_s(const std::string& dir) {
  const std::string path = str_cat(dir, "/.zerone-plan-probe-", ::getpid());
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_DIRECT, 0600);
  if (fd < 0) fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
  ZERONE_CHECK(fd >= 0, "--nvme-path '", dir, "': cannot create a probe file to measure the disk: ", std::strerror(errno),
               " (give --disk-bandwidth)");
  constexpr size_t kChunk = size_t{4} << 20, kChunks = 16;
  void* raw = nullptr;
  if (::posix_memalign(&raw, 4096, kChunk) != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    throw Error("out of memory measuring the disk");
  }
  std::unique_ptr<void, decltype(&std::free)> buffer(raw, &std::free);
  std::memset(raw, 7, kChunk);
  bool ok = true;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < kChunks && ok; ++i) ok = ::pwrite(fd, raw, kChunk, static_cast<off_t>(i * kChunk)) == static_cast<ssize_t>(kChunk);
  ok = ok && ::fdatasync(fd) == 0;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  for (size_t i = 0; i < kChunks && ok; ++i) ok = ::pread(fd, raw, kChunk, static_cast<off_t>(i * kChunk)) == static_cast<ssize_t>(kChunk);
  const double s = seconds_since(t0);
  ::close(fd);
  ::unlink(path.c_str());
  ZERONE_CHECK(ok, "--nvme-path '", dir, "': the disk probe failed: ", std::strerror(errno), " (give --disk-bandwidth)");
  return 2.0 * static_cast<double>(kChunk * kChunks) / s;
}

std::string gb_per_s(double bytes_per_s) { return str_cat(fixed_text(bytes_per_s / 1e9, 2), " GB/s"); }

std::string hb(int64_t bytes) { return human_bytes(static_cast<double>(bytes)); }

// The settings flags a plan decides, in the table's order.
const char* const kPlannedFlags[] = {"--zero-stage", "--offload-optimizer", "--offload-param", "--offload-optimizer-ratio",
                                     "--offload-optimizer-nvme-ratio", "--grad-accumulators",
                                     "--activation-checkpointing", "--cpu-checkpointing", "--reduce-bucket-size",
                                     "--stage3-prefetch-bucket-size", "--sub-group-size", "--offload-buffer-count",
                                     "--micro-batch", "--grad-accum"};

}  // namespace

size_t memory_probe_bytes(long long cache_bytes, long long available_bytes) {
  constexpr size_t kLeast = size_t{256} << 20, kMost = size_t{1} << 30, kFloor = size_t{64} << 20;
  const size_t twice = cache_bytes > 0 ? 2 * static_cast<size_t>(cache_bytes) : 0;
  const size_t wanted = std::clamp(twice, kLeast, kMost);
  if (available_bytes <= 0) return wanted;
  return std::min(wanted, std::max(kFloor, static_cast<size_t>(available_bytes) / 8));
}

bool unified_memory(kernels::DeviceKind device) { return device != kernels::DeviceKind::cuda; }

bool unified_memory(const TrainConfig& cfg) { return unified_memory(kernels::device_or_default(cfg.device)); }

DeviceBudget device_budget(kernels::DeviceKind device, double device_mem_limit_gib,
                           const std::optional<kernels::DeviceMemory>& memory) {
  DeviceBudget b;
  if (device_mem_limit_gib > 0) {
    b.bytes = static_cast<int64_t>(device_mem_limit_gib * kGiB);
    b.source = str_cat("--device-mem-limit ", device_mem_limit_gib, " GiB");
  }
  if (unified_memory(device) || !memory) return b;
  const int64_t usable = memory->usable_bytes();
  if (b.bytes > 0 && b.bytes <= usable) return b;
  b.bytes = std::max<int64_t>(usable, 1);  // a full GPU still caps: nothing fits
  b.source = str_cat("the GPU's ", hb(usable), " usable (", hb(memory->free_bytes), " free of ", hb(memory->total_bytes),
                     memory->measured ? "" : str_cat(" once the CUDA context's ", hb(kernels::kCudaContextReserveBytes), " reserve is taken"),
                     ")");
  return b;
}

zero::ZeroConfig fit_grad_sums(const TrainConfig& cfg, const nn::Model& model, DType dtype, int world, int seq,
                               int stage, zero::ZeroConfig zcfg, const zero::MemoryBudget& budget,
                               zero::CollectiveRoute route) {
  zero::ZeroConfig at_stage = zcfg;
  at_stage.stage = stage;
  if (cfg.grad_accumulators != "auto" || !zero::gradients_on_device(model.unit_numels(), world, at_stage)) return zcfg;
  const zero::StageEstimate row =
      zero::estimate(model, world, dtype, cfg.micro_batch, seq, zcfg, optimizer_options(cfg), stage, route)[0];
  zero::MemoryBudget spared = budget;
  if (spared.device_bytes > 0)
    spared.device_bytes = static_cast<int64_t>(static_cast<double>(spared.device_bytes) * (1.0 - kAutoDeviceHeadroom));
  if (!zero::overflows(zero::place_need(row, spared), spared).empty()) zcfg.grad_sums_on_device = false;
  return zcfg;
}

void count_for_run_device(nn::Model& shape, const TrainConfig& cfg) {
  shape.count_for_device(kernels::device_or_default(cfg.device), device_options(cfg));
}

zero::CollectiveRoute planned_collective_route(const TrainConfig& cfg, int world) {
  const kernels::DeviceKind device = cfg.device.empty() ? kernels::default_device() : kernels::parse_device_kind(cfg.device);
  const comm::CommChoice choice = comm::choose_comm_library(cfg.comm, device, comm::nccl_compiled_in(), world, {});
  return zero::collective_route(device, world, choice.library);
}

namespace {

// Note [Device speeds]: fills the GPU's GEMM rate, memory and host link bandwidth of `s` from the
// flags that give them, measuring the rest on the GPU (its backend: a CUDA context); returns the
// line that says where each came from. Throws Error when one must be measured and no GPU is here.
std::string plan_device_speeds(const TrainConfig& cfg, DType dtype, const PlanMachineOptions& o, zero::MachineSpeed& s) {
  const kernels::DeviceKind kind = kernels::device_or_default(cfg.device);
  const bool measure = o.gemm_tflops <= 0 || o.device_memory_gbps <= 0 || o.host_device_gbps <= 0;
  DeviceSpeeds measured;
  if (measure) {
    const std::vector<kernels::DeviceKind> here = kernels::available_devices();
    ZERONE_CHECK(std::find(here.begin(), here.end(), kind) != here.end(), "--device ", kernels::device_kind_name(kind),
                 ": no such device here to measure its speeds; to plan for one elsewhere give --gemm-tflops, "
                 "--device-bandwidth and --host-device-bandwidth (an H100 SXM: about 700 TFLOP/s on bf16 GEMMs, "
                 "3000 GB/s, 50 GB/s)");
    // The run's own backend (its options: --auto-fit's run then finds it as it asks for it).
    measured = measure_device_speeds(kernels::use_device(kind, device_options(cfg)), dtype);
  }
  s.gemm_flop_per_s = o.gemm_tflops > 0 ? o.gemm_tflops * 1e12 : measured.gemm_flop_per_s;
  s.device_memory_bytes_per_s = o.device_memory_gbps > 0 ? o.device_memory_gbps * 1e9 : measured.memory_bytes_per_s;
  s.host_device_bytes_per_s = o.host_device_gbps > 0 ? o.host_device_gbps * 1e9 : measured.host_device_bytes_per_s;
  return str_cat("device: GEMM ", fixed_text(s.gemm_flop_per_s / 1e12, 1), " TFLOP/s",
                 o.gemm_tflops > 0 ? " (--gemm-tflops)" : " (measured, 8192^3)", ", memory ",
                 gb_per_s(s.device_memory_bytes_per_s), o.device_memory_gbps > 0 ? " (--device-bandwidth)" : " (measured)",
                 ", host link ", gb_per_s(s.host_device_bytes_per_s),
                 o.host_device_gbps > 0 ? " (--host-device-bandwidth)" : " (measured, the slower direction)");
}

}  // namespace

PlanMachine plan_machine(const TrainConfig& cfg, int world, DType dtype, const PlanMachineOptions& o) {
  ZERONE_CHECK(world >= 1, "--world ", world, " must be at least 1");
  ZERONE_CHECK(o.ranks_per_host >= 0 && o.ranks_per_host <= world, "--ranks-per-host ", o.ranks_per_host,
               " is out of range: expected 1..--world (", world, ")");
  PlanMachine m;
  zero::MemoryBudget& b = m.budget;
  b.ranks_per_host = o.ranks_per_host > 0 ? o.ranks_per_host : world;
  b.unified = unified_memory(cfg);
  const DeviceBudget device = device_budget(kernels::device_or_default(cfg.device), cfg.device_mem_limit,
                                            kernels::device_memory(kernels::device_or_default(cfg.device)));
  b.device_bytes = device.bytes;
  if (o.host_mem_gib > 0) {
    b.host_bytes = static_cast<int64_t>(o.host_mem_gib * kGiB);
    m.sources.push_back(str_cat("memory ", hb(b.host_bytes), " per host (--host-mem)"));
  } else {
    // What the estimate does not count (the program, the kernels' scratch, the data readers)
    // needs room too: a reserve of 5% and 256 MiB per rank (Note [Fit]).
    const long long available = available_memory_bytes();
    const int64_t measured = available > 0 ? available : physical_memory_bytes();
    const int64_t reserve = measured / 20 + (int64_t{256} << 20) * b.ranks_per_host;
    b.host_bytes = std::max<int64_t>(measured - reserve, 0);
    m.sources.push_back(str_cat("memory ", hb(b.host_bytes), " per host (", hb(measured), " available now of ",
                                hb(physical_memory_bytes()), " physical, less a reserve of ", hb(reserve),
                                "; --host-mem plans for another figure)"));
  }
  if (b.device_bytes > 0) m.sources.push_back(str_cat("device cap ", hb(b.device_bytes), " per rank (", device.source, ")"));
  else if (!b.unified) m.sources.push_back("device memory per rank not measured: give --device-mem-limit GiB, else it is not checked");
  if (!cfg.nvme_path.empty()) {
    if (o.disk_free_gib >= 0) {
      b.nvme_bytes = static_cast<int64_t>(o.disk_free_gib * kGiB);
      m.sources.push_back(str_cat("NVMe ", hb(b.nvme_bytes), " free (--disk-free)"));
    } else {
      b.nvme_bytes = static_cast<int64_t>(io::check_swap_path(cfg.nvme_path, "--nvme-path"));
      m.sources.push_back(str_cat("NVMe ", hb(b.nvme_bytes), " free under '", cfg.nvme_path, "'"));
    }
  } else {
    m.sources.push_back("no --nvme-path: NVMe offload not considered");
  }
  const std::pair<double, const char*> given_speeds[] = {{o.gemm_tflops, "--gemm-tflops"}, {o.memory_gbps, "--memory-bandwidth"},
                                                         {o.disk_gbps, "--disk-bandwidth"}, {o.link_gbps, "--link-bandwidth"},
                                                         {o.device_memory_gbps, "--device-bandwidth"},
                                                         {o.host_device_gbps, "--host-device-bandwidth"}};
  for (const auto& [value, flag] : given_speeds)
    ZERONE_CHECK(value >= 0 && std::isfinite(value), flag, " ", value, " is out of range: expected a speed > 0 (or 0: measured)");
  ZERONE_CHECK(!b.unified || (o.device_memory_gbps == 0 && o.host_device_gbps == 0),
               "--device-bandwidth and --host-device-bandwidth describe a GPU of its own: give them with --device cuda");
  zero::MachineSpeed& s = m.speed;
  // Measured here with every core (GEMM, and the copy: Note [Host memory speed with every core]);
  // the ranks of a host share its cores (Note [Threads per rank] in trainer.cc) and its memory, so
  // a rank gets its share of each.
  const double ranks = b.ranks_per_host;
  const int cores = std::max(1, cpu_info().logical_cores);
  s.memory_bytes_per_s = o.memory_gbps > 0 ? o.memory_gbps * 1e9 : measure_memory_bytes_per_s(cores) / ranks;
  if (b.unified) {
    s.gemm_flop_per_s = o.gemm_tflops > 0 ? o.gemm_tflops * 1e12 : measure_gemm_peak_tflop_per_s(dtype) * 1e12 / ranks;
    s.host_device_bytes_per_s = s.memory_bytes_per_s;
  } else {
    // Note [Device speeds]: the GPU's own figures, one GPU per rank.
    m.sources.push_back(plan_device_speeds(cfg, dtype, o, s));
  }
  if (b.nvme_bytes >= 0) s.disk_bytes_per_s = o.disk_gbps > 0 ? o.disk_gbps * 1e9 : measure_disk_bytes_per_s(cfg.nvme_path);
  s.link_bytes_per_s = o.link_gbps > 0 ? o.link_gbps * 1e9 : world <= b.ranks_per_host ? s.memory_bytes_per_s / 2 : 1.25e9;
  m.sources.push_back(str_cat(b.unified ? str_cat("GEMM ", fixed_text(s.gemm_flop_per_s / 1e12, 3), " TFLOP/s per rank",
                                                  o.gemm_tflops > 0 ? " (--gemm-tflops)" : " (measured)", ", ")
                                        : "host ",
                              "memory ",
                              gb_per_s(s.memory_bytes_per_s), o.memory_gbps > 0 ? " (--memory-bandwidth)" : " (measured)",
                              s.disk_bytes_per_s > 0 ? str_cat(", disk ", gb_per_s(s.disk_bytes_per_s),
                                                               o.disk_gbps > 0 ? " (--disk-bandwidth)" : " (measured)")
                                                     : "",
                              world > 1 ? str_cat(", link ", gb_per_s(s.link_bytes_per_s)) : ""));
  return m;
}

zero::PlanRequest plan_request(const TrainConfig& cfg, nn::Model& shape, DType dtype, int world, const PlanMachine& machine) {
  zero::PlanRequest r;
  r.model = &shape;
  r.dtype = dtype;
  r.optimizer = optimizer_options(cfg);
  r.world = world;
  r.seq = shape.input_kind() == nn::InputKind::features ? 1 : cfg.seq;
  ZERONE_CHECK(r.seq <= shape.max_seq_len(), "--seq ", r.seq, " exceeds the model's context length ", shape.max_seq_len());
  if (cfg.train_batch_size > 0 && !cfg.is_given("--micro-batch") && !cfg.is_given("--grad-accum")) {
    ZERONE_CHECK(cfg.train_batch_size % world == 0, "--train-batch-size ", cfg.train_batch_size,
                 " is not a multiple of --world ", world);
    r.micro_batch = static_cast<int>(cfg.train_batch_size / world);
    r.grad_accum = 1;
    r.micro_batch_free = true;
  } else {
    TrainConfig batch = cfg;
    resolve_batch_sizes(batch, world);
    r.micro_batch = batch.micro_batch;
    r.grad_accum = batch.grad_accum;
  }
  r.flops_per_token = model_flops_per_token(shape, r.seq).value_or(0.0);
  // Note [Transient gradients]: each candidate keeps them only at one micro-step (planner.cc).
  TrainConfig one_micro_step = cfg;
  one_micro_step.grad_accum = 1;
  r.base = zero_config(one_micro_step, dtype, shape.unit_numels(), world);
  r.collectives = planned_collective_route(cfg, world);
  auto given = [&](const char* flag) { return cfg.is_given(flag); };
  if (given("--zero-stage")) r.stage = cfg.zero_stage;
  if (given("--offload-optimizer")) r.offload_optimizer = zero::parse_offload_device(cfg.offload_optimizer, "--offload-optimizer");
  if (given("--offload-param")) r.offload_param = zero::parse_offload_device(cfg.offload_param, "--offload-param");
  if (given("--offload-optimizer-ratio")) r.offload_optimizer_ratio = cfg.offload_optimizer_ratio;
  if (given("--offload-optimizer-nvme-ratio")) r.offload_optimizer_nvme_ratio = cfg.offload_optimizer_nvme_ratio;
  if (cfg.grad_accumulators != "auto") r.grad_sums_on_device = cfg.grad_accumulators == "device";
  if (given("--activation-checkpointing")) r.activation_checkpointing = cfg.activation_checkpointing;
  if (given("--cpu-checkpointing")) r.cpu_checkpointing = cfg.cpu_checkpointing;
  if (given("--reduce-bucket-size")) r.reduce_bucket_numel = r.base.reduce_bucket_numel;
  if (given("--stage3-prefetch-bucket-size")) r.prefetch_numel = r.base.prefetch_numel;
  if (given("--sub-group-size")) r.sub_group_numel = r.base.sub_group_numel;
  if (given("--offload-buffer-count")) r.buffer_count = cfg.offload_buffer_count;
  r.budget = machine.budget;
  r.speed = machine.speed;
  return r;
}

void apply_plan(const zero::PlanChoice& c, TrainConfig& cfg) {
  auto set = [&](const char* flag) { cfg.given.insert(flag); };
  cfg.zero_stage = c.zero.stage;
  set("--zero-stage");
  cfg.offload_optimizer = zero::offload_device_name(c.zero.offload_optimizer);
  set("--offload-optimizer");
  cfg.offload_param = zero::offload_device_name(c.zero.offload_param);
  set("--offload-param");
  if (c.zero.offload_optimizer != zero::OffloadDevice::none) {
    cfg.offload_optimizer_ratio = c.zero.offload_optimizer_ratio;
    set("--offload-optimizer-ratio");
  }
  if (c.zero.offload_optimizer == zero::OffloadDevice::nvme) {
    cfg.offload_optimizer_nvme_ratio = c.zero.offload_optimizer_nvme_ratio;
    set("--offload-optimizer-nvme-ratio");
  }
  // Note [Gradient sums on the device]: only where the place matters (grad_accumulators_blocker).
  if (c.grad_accum > 1 && zero::gradient_sums_placeable(c.zero)) {
    cfg.grad_accumulators = c.zero.grad_sums_on_device ? "device" : "host";
    set("--grad-accumulators");
  }
  cfg.activation_checkpointing = c.activation_checkpointing;
  set("--activation-checkpointing");
  cfg.cpu_checkpointing = c.cpu_checkpointing;
  if (c.cpu_checkpointing) set("--cpu-checkpointing");
  if (c.zero.stage >= 2) {  // below, the bucket holds no memory: the run's own value stays
    cfg.reduce_bucket_size = static_cast<int64_t>(c.zero.reduce_bucket_numel);
    set("--reduce-bucket-size");
  }
  if (c.zero.stage == 3) {
    cfg.stage3_prefetch_bucket_size = static_cast<int64_t>(c.zero.prefetch_numel);
    set("--stage3-prefetch-bucket-size");
  }
  if (c.zero.offload_optimizer == zero::OffloadDevice::nvme) {
    cfg.sub_group_size = static_cast<int64_t>(c.zero.sub_group_numel);
    cfg.offload_buffer_count = c.zero.offload_buffer_count;
    set("--sub-group-size");
    set("--offload-buffer-count");
  }
  // A swap directory the plan does not use is refused by train ("given but nothing is offloaded").
  if (c.zero.offload_optimizer != zero::OffloadDevice::nvme && c.zero.offload_param != zero::OffloadDevice::nvme) {
    cfg.nvme_path.clear();
    cfg.given.erase("--nvme-path");
  }
  cfg.micro_batch = c.micro_batch;
  cfg.grad_accum = c.grad_accum;
  set("--micro-batch");
  set("--grad-accum");
}

std::string choice_flags(const zero::PlanChoice& choice) {
  TrainConfig cfg;
  cfg.given.clear();
  apply_plan(choice, cfg);
  std::string out;
  for (const char* flag : kPlannedFlags) {
    if (!cfg.is_given(flag)) continue;
    const Setting* s = find_setting(flag);
    ZERONE_ASSERT(s != nullptr);
    const std::string value = setting_value_text(*s, cfg);
    if (std::string(flag) != "--zero-stage" && setting_is_default(*s, cfg)) continue;
    if (s->type == SettingType::toggle) {
      if (value == "true") out += str_cat(out.empty() ? "" : " ", flag);
      continue;
    }
    out += str_cat(out.empty() ? "" : " ", flag, " ", value);
  }
  return out;
}

namespace {

std::string places_text(const zero::StageEstimate& e) {
  const zero::PlacedBytes all = zero::placed_bytes(e);
  std::string out;
  for (size_t p = 0; p < MemoryLedger::kPlaces; ++p) {
    const auto place = static_cast<MemPlace>(p);
    std::string line;
    for (size_t c = 0; c < MemoryLedger::kCategories; ++c)
      if (int64_t b = all.get(place, static_cast<MemCategory>(c)); b != 0)
        line += str_cat(line.empty() ? "" : ", ", mem_category_name(static_cast<MemCategory>(c)), " ", hb(b));
    if (!line.empty()) out += str_cat("    ", mem_place_name(place), " ", hb(all.place_total(place)), ": ", line, "\n");
  }
  return out;
}

}  // namespace

nlohmann::ordered_json places_json(const zero::PlacedBytes& bytes) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (size_t p = 0; p < MemoryLedger::kPlaces; ++p)
    for (size_t k = 0; k < MemoryLedger::kCategories; ++k)
      if (int64_t b = bytes.get(static_cast<MemPlace>(p), static_cast<MemCategory>(k)); b != 0)
        out[str_cat(mem_place_name(static_cast<MemPlace>(p)), ".", mem_category_name(static_cast<MemCategory>(k)))] = b;
  return out;
}

namespace {

std::string cost_text(const zero::StepCost& c) {
  return str_cat(fixed_text(c.total_s, 3), " s/step (compute ", fixed_text(c.compute_s, 3), ", memory ",
                 fixed_text(c.memory_s, 3), ", optimizer ", fixed_text(c.optimizer_s, 3), ", NVMe ", fixed_text(c.nvme_s, 3),
                 ", comm ", fixed_text(c.comm_s, 3), c.transfer_s > 0 ? str_cat(", host-device ", fixed_text(c.transfer_s, 3)) : "",
                 ")");
}

std::string need_text(const zero::PlaceNeed& n, const zero::MemoryBudget& b) {
  std::string out = str_cat(b.unified ? "memory (device + host) " : "host memory ", hb(n.memory), " of ", hb(b.host_bytes),
                            " per host");
  if (b.device_bytes > 0 || !b.unified) out += str_cat(", device ", hb(n.device), " per rank", b.device_bytes > 0 ? str_cat(" of ", hb(b.device_bytes)) : "");
  if (n.nvme > 0) out += str_cat(", NVMe ", hb(n.nvme), b.nvme_bytes >= 0 ? str_cat(" of ", hb(b.nvme_bytes), " free") : "");
  return out;
}

nlohmann::ordered_json candidate_json(const zero::PlanCandidate& c) {
  nlohmann::ordered_json j;
  j["family"] = zero::family_label(c.choice);
  j["flags"] = choice_flags(c.choice);
  j["predicted_s_per_step"] = c.cost.total_s;
  j["cost"] = {{"compute_s", c.cost.compute_s}, {"memory_s", c.cost.memory_s}, {"optimizer_s", c.cost.optimizer_s},
               {"nvme_s", c.cost.nvme_s}, {"comm_s", c.cost.comm_s}, {"transfer_s", c.cost.transfer_s},
               {"bottleneck", c.cost.bottleneck()}};
  j["need"] = {{"device_per_rank", c.need.device}, {"memory_per_host", c.need.memory}, {"nvme_per_host", c.need.nvme}};
  j["bytes_per_rank"] = places_json(zero::placed_bytes(c.estimate));
  // The model state alone (what the ledger's metrics show at the end of a step, Note [Offload places]).
  j["model_state_per_rank"] = places_json(c.estimate.model_state.placed);
  if (!c.fits()) j["overflow"] = c.overflow;
  return j;
}

std::string smallest_text(const zero::Plan& plan, const zero::MemoryBudget& b) {
  std::string out = "the smallest budget that would fit, per place (the others as given): ";
  std::string parts;
  if (plan.min_memory_bytes)
    parts += str_cat(b.unified ? "memory " : "host memory ", hb(*plan.min_memory_bytes), " per host");
  if (plan.min_device_bytes && (b.device_bytes > 0 || !b.unified))
    parts += str_cat(parts.empty() ? "" : "; ", "device ", hb(*plan.min_device_bytes), " per rank");
  if (plan.min_nvme_bytes && *plan.min_nvme_bytes > 0)
    parts += str_cat(parts.empty() ? "" : "; ", "NVMe ", hb(*plan.min_nvme_bytes), " free");
  out += parts.empty() ? "none by one place alone" : parts;
  if (plan.smallest)
    out += str_cat(". The plan with the least memory (", zero::family_label(plan.smallest->choice), ", ",
                   choice_flags(plan.smallest->choice), ") needs ", need_text(plan.smallest->need, b));
  return out;
}

}  // namespace

std::string plan_text(const zero::Plan& plan, const zero::PlanRequest& r, const PlanMachine& machine, const TrainConfig& cfg,
                      size_t runners_up) {
  std::string out = str_cat("zerone plan: ", r.model->spec(), " (", r.model->num_parameters(), " parameters), world ",
                            r.world, " (", r.budget.ranks_per_host, " per host), micro-batch ", r.micro_batch, " x seq ",
                            r.seq, " x grad-accum ", r.grad_accum, r.micro_batch_free ? " (micro-batch free)" : "", ", ",
                            dtype_name(r.dtype), ", ", cfg.optimizer, "\n");
  for (const std::string& s : machine.sources) out += str_cat("  ", s, "\n");
  out += str_cat("  searched ", plan.candidates, " settings, ", plan.fitting, " fit\n");
  if (!plan.best) return out + "  nothing fits; " + smallest_text(plan, r.budget) + "\n";
  const zero::PlanCandidate& b = *plan.best;
  out += str_cat("chosen: ", zero::family_label(b.choice), ": predicted ", cost_text(b.cost), "\n");
  out += str_cat("  settings: ", choice_flags(b.choice), "\n");
  out += str_cat("  needs ", need_text(b.need, r.budget), "\n");
  out += "  bytes per rank by place:\n" + places_text(b.estimate);
  if (!plan.runners_up.empty()) {
    out += "runners-up (the best of each other family):\n";
    char line[512];
    std::snprintf(line, sizeof line, "  %-10s %-48s %s\n", "s/step", "plan", "why it lost");
    out += line;
    for (size_t i = 0; i < plan.runners_up.size() && i < runners_up; ++i) {
      const zero::RunnerUp& ru = plan.runners_up[i];
      std::snprintf(line, sizeof line, "  %-10s %-48s %s\n",
                    ru.candidate.fits() ? fixed_text(ru.candidate.cost.total_s, 3).c_str() : "-",
                    zero::family_label(ru.candidate.choice).c_str(), ru.why.c_str());
      out += line;
    }
  }
  return out;
}

nlohmann::ordered_json plan_json(const zero::Plan& plan, const zero::PlanRequest& r, const PlanMachine& machine,
                                 const TrainConfig& cfg) {
  nlohmann::ordered_json j;
  j["model"] = r.model->spec();
  j["parameters"] = r.model->num_parameters();
  j["world"] = r.world;
  j["ranks_per_host"] = r.budget.ranks_per_host;
  j["precision"] = dtype_name(r.dtype);
  j["optimizer"] = cfg.optimizer;
  j["micro_batch"] = r.micro_batch;
  j["grad_accum"] = r.grad_accum;
  j["seq"] = r.seq;
  j["budget"] = {{"unified", r.budget.unified}, {"device_per_rank", r.budget.device_bytes},
                 {"memory_per_host", r.budget.host_bytes}, {"nvme_free", r.budget.nvme_bytes}};
  j["speed"] = {{"gemm_flop_per_s", r.speed.gemm_flop_per_s}, {"memory_bytes_per_s", r.speed.memory_bytes_per_s},
                {"device_memory_bytes_per_s", r.speed.device_memory_bytes_per_s},
                {"host_device_bytes_per_s", r.speed.host_device_bytes_per_s},
                {"disk_bytes_per_s", r.speed.disk_bytes_per_s}, {"link_bytes_per_s", r.speed.link_bytes_per_s}};
  j["sources"] = machine.sources;
  j["candidates"] = plan.candidates;
  j["fitting"] = plan.fitting;
  if (plan.best) {
    j["chosen"] = candidate_json(*plan.best);
    TrainConfig applied = cfg;
    apply_plan(plan.best->choice, applied);
    j["config"] = nlohmann::ordered_json::parse(
        effective_config_json(applied, dtype_name(r.dtype)));
  } else {
    nlohmann::ordered_json s;
    if (plan.min_memory_bytes) s["memory_per_host"] = *plan.min_memory_bytes;
    if (plan.min_device_bytes) s["device_per_rank"] = *plan.min_device_bytes;
    if (plan.min_nvme_bytes) s["nvme_free"] = *plan.min_nvme_bytes;
    j["smallest_budget"] = s;
    if (plan.smallest) j["smallest_plan"] = candidate_json(*plan.smallest);
  }
  for (const zero::RunnerUp& ru : plan.runners_up) {
    nlohmann::ordered_json c = candidate_json(ru.candidate);
    c["why"] = ru.why;
    j["runners_up"].push_back(c);
  }
  return j;
}

std::string plan_command(const TrainConfig& cfg, int world, int ranks_per_host) {
  std::string out = "zerone plan";
  if (!cfg.config_file.empty()) out += str_cat(" --config ", cfg.config_file);
  out += str_cat(" --model ", cfg.model, " --world ", world);
  if (ranks_per_host > 0 && ranks_per_host != world) out += str_cat(" --ranks-per-host ", ranks_per_host);
  out += str_cat(" --micro-batch ", cfg.micro_batch, " --seq ", cfg.seq);
  if (cfg.grad_accum != 1) out += str_cat(" --grad-accum ", cfg.grad_accum);
  if (!cfg.precision.empty()) out += str_cat(" --precision ", cfg.precision);
  if (cfg.optimizer != "adamw") out += str_cat(" --optimizer ", cfg.optimizer);
  if (cfg.device_mem_limit > 0) out += str_cat(" --device-mem-limit ", cfg.device_mem_limit);
  out += str_cat(" --nvme-path ", cfg.nvme_path.empty() ? "DIR" : cfg.nvme_path);
  return out;
}

// Note [Advice that leads somewhere]: a refusal used to say "try a higher stage" at stage 3 and
// "try --offload-optimizer nvme" to a run already on it, while the real causes (bucket defaults,
// swap staging, activations) went unnamed. Now it names the categories over budget, and proposes
// only changes that differ from the run's settings, exist at its stage and world, and that the
// estimate says fit (with the disk unchecked when no --nvme-path is given: the proposal then says
// how much it needs). When no single change fits, the planner's best plan is the proposal (all
// of its settings that differ), or, when nothing fits, the smallest budgets. The `zerone plan`
// command line with the run's flags ends every refusal.
std::string fit_advice(const TrainConfig& cfg, const nn::Model& model, DType dtype, int world,
                       const zero::MemoryBudget& budget, const zero::StageEstimate& mine) {
  std::unique_ptr<nn::Model> shape_model = nn::make_model(model.spec(), dtype, 64, /*allocate=*/false);
  nn::Model& shape = *shape_model;
  const zero::PlacedBytes all = zero::placed_bytes(mine);
  const zero::PlaceNeed need = zero::place_need(mine, budget);
  // Categories of the overflowing places, largest first.
  std::vector<std::pair<int64_t, std::string>> cats;
  const bool device_over = budget.device_bytes > 0 && need.device > budget.device_bytes;
  const bool memory_over = budget.host_bytes > 0 && need.memory > budget.host_bytes;
  for (size_t p = 0; p < MemoryLedger::kPlaces; ++p) {
    const auto place = static_cast<MemPlace>(p);
    const bool over = (place == MemPlace::device && (device_over || (memory_over && budget.unified))) ||
                      (place == MemPlace::host && memory_over);
    if (!over) continue;
    for (size_t c = 0; c < MemoryLedger::kCategories; ++c)
      if (int64_t b = all.get(place, static_cast<MemCategory>(c)); b > 0)
        cats.emplace_back(b, str_cat(mem_place_name(place), " ", mem_category_name(static_cast<MemCategory>(c)), " ", hb(b)));
  }
  std::sort(cats.begin(), cats.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string out = "Largest over budget: ";
  for (size_t i = 0; i < cats.size() && i < 4; ++i) out += str_cat(i ? ", " : "", cats[i].second);
  if (cats.empty()) out += str_cat("NVMe ", hb(need.nvme));
  out += ". ";

  // Single changes, each checked by the estimate.
  zero::MemoryBudget check = budget;
  struct Fix {
    std::string flags;
    TrainConfig cfg;
  };
  std::vector<Fix> fixes;
  auto propose = [&](const std::string& flags, auto&& edit) {
    TrainConfig c = cfg;
    edit(c);
    fixes.push_back({flags, c});
  };
  const std::vector<size_t> numels = shape.unit_numels();
  if (!cfg.activation_checkpointing) propose("--activation-checkpointing", [](TrainConfig& c) { c.activation_checkpointing = true; });
  if (!cfg.cpu_checkpointing && dynamic_cast<const nn::UnitModel*>(&shape) != nullptr)
    propose(cfg.activation_checkpointing ? "--cpu-checkpointing" : "--activation-checkpointing --cpu-checkpointing",
            [](TrainConfig& c) { c.activation_checkpointing = c.cpu_checkpointing = true; });
  for (int s = cfg.zero_stage + 1; s <= 3 && world > 1; ++s)
    propose(str_cat("--zero-stage ", s), [s](TrainConfig& c) { c.zero_stage = s; });
  const std::string nvme_flag = cfg.nvme_path.empty() ? " --nvme-path DIR" : "";
  for (const char* dev : {"cpu", "nvme"}) {
    if (cfg.offload_optimizer == dev) continue;
    const std::string flags = str_cat(cfg.zero_stage == 0 ? "--zero-stage 1 " : "", "--offload-optimizer ", dev,
                                      std::string(dev) == "nvme" ? nvme_flag : "");
    propose(flags, [dev](TrainConfig& c) {
      c.offload_optimizer = dev;
      c.zero_stage = std::max(c.zero_stage, 1);
    });
  }
  for (const char* dev : {"cpu", "nvme"}) {
    if (cfg.offload_param == dev) continue;
    const std::string flags = str_cat(cfg.zero_stage != 3 ? "--zero-stage 3 " : "", "--offload-param ", dev,
                                      std::string(dev) == "nvme" ? nvme_flag : "");
    propose(flags, [dev](TrainConfig& c) {
      c.offload_param = dev;
      c.zero_stage = 3;
    });
  }
  const zero::ZeroConfig now = zero_config(cfg, dtype, numels, world);
  const size_t auto_bucket = zero::auto_bucket_numel(numels, world);
  if (cfg.zero_stage >= 2 && now.reduce_bucket_numel > auto_bucket)
    propose(str_cat("--reduce-bucket-size ", auto_bucket), [&](TrainConfig& c) { c.reduce_bucket_size = static_cast<int64_t>(auto_bucket); });
  if (cfg.zero_stage == 3 && now.prefetch_numel > auto_bucket)
    propose(str_cat("--stage3-prefetch-bucket-size ", auto_bucket),
            [&](TrainConfig& c) { c.stage3_prefetch_bucket_size = static_cast<int64_t>(auto_bucket); });
  if (cfg.zero_stage >= 2 && now.reduce_bucket_numel > auto_bucket && cfg.zero_stage == 3 && now.prefetch_numel > auto_bucket)
    propose(str_cat("--reduce-bucket-size ", auto_bucket, " --stage3-prefetch-bucket-size ", auto_bucket), [&](TrainConfig& c) {
      c.reduce_bucket_size = c.stage3_prefetch_bucket_size = static_cast<int64_t>(auto_bucket);
    });
  if (now.offload_optimizer == zero::OffloadDevice::nvme && now.stage >= 1) {
    const size_t group = zero::auto_sub_group_numel(numels, world, cfg.zero_stage, 2);
    if (group < now.sub_group_numel || cfg.offload_buffer_count > 2)
      propose(str_cat("--sub-group-size ", group, " --offload-buffer-count 2"), [&](TrainConfig& c) {
        c.sub_group_size = static_cast<int64_t>(group);
        c.offload_buffer_count = 2;
      });
  }
  for (int m = cfg.micro_batch / 2; m >= 1; m /= 2) {
    if (cfg.micro_batch % m != 0) continue;
    const int accum = cfg.grad_accum * (cfg.micro_batch / m);
    propose(str_cat("--micro-batch ", m, " --grad-accum ", accum, " (the same batch)"), [m, accum](TrainConfig& c) {
      c.micro_batch = m;
      c.grad_accum = accum;
    });
    if (m == 1) break;
  }

  const optim::OptimizerOptions optimizer = optimizer_options(cfg);
  std::string works;
  for (const Fix& f : fixes) {
    try {
      shape.set_activation_checkpointing(f.cfg.activation_checkpointing);
      shape.set_cpu_checkpointing(f.cfg.cpu_checkpointing);
      const zero::CollectiveRoute route = planned_collective_route(f.cfg, world);
      // As the run with the fix would place its gradient sums.
      const zero::ZeroConfig z =
          fit_grad_sums(f.cfg, shape, dtype, world, cfg.seq, f.cfg.zero_stage, zero_config(f.cfg, dtype, numels, world), check, route);
      const zero::StageEstimate e = zero::estimate(shape, world, dtype, f.cfg.micro_batch, cfg.seq, z, optimizer, f.cfg.zero_stage, route)[0];
      const zero::PlaceNeed n = zero::place_need(e, check);
      if (!zero::overflows(n, check).empty()) continue;
      works += str_cat(works.empty() ? "" : "; ", f.flags, " (", need_text(n, check), ")");
    } catch (const Error&) {
      continue;  // not a setting this model has
    }
  }
  shape.set_activation_checkpointing(cfg.activation_checkpointing);
  if (cfg.cpu_checkpointing || shape.cpu_checkpointing()) shape.set_cpu_checkpointing(cfg.cpu_checkpointing);
  if (!works.empty()) {
    out += str_cat("Each of these fits by itself (checked by the estimate): ", works, ". ");
  } else {
    // No single change: the planner's best plan, all of its settings.
    PlanMachine machine;
    machine.budget = budget;
    machine.speed.gemm_flop_per_s = 1e12;  // the ranking's speeds do not matter for fitting; any positive
    machine.speed.memory_bytes_per_s = 1e10;
    machine.speed.disk_bytes_per_s = 1e9;
    zero::PlanRequest r = plan_request(cfg, shape, dtype, world, machine);
    r.stage.reset();
    r.offload_optimizer.reset();
    r.offload_param.reset();
    r.offload_optimizer_ratio.reset();
    r.offload_optimizer_nvme_ratio.reset();
    r.grad_sums_on_device.reset();
    r.activation_checkpointing.reset();
    r.cpu_checkpointing.reset();
    r.reduce_bucket_numel.reset();
    r.prefetch_numel.reset();
    r.sub_group_numel.reset();
    r.buffer_count.reset();
    if (r.budget.nvme_bytes < 0 && budget.nvme_bytes < 0) r.budget.nvme_bytes = std::numeric_limits<int64_t>::max() / 4;
    const zero::Plan plan = zero::make_plan(r);
    if (plan.best)
      out += str_cat("No single change fits; together these do (checked by the planner): ", choice_flags(plan.best->choice),
                     cfg.nvme_path.empty() && plan.best->need.nvme > 0 ? " --nvme-path DIR" : "", " (",
                     need_text(plan.best->need, budget), "). ");
    else
      out += str_cat("No settings fit this model and batch here; ", smallest_text(plan, budget), ". ");
  }
  out += str_cat("The planner picks the fastest that fits: ", plan_command(cfg, world, budget.ranks_per_host));
  return out;
}

TrainConfig auto_fit(TrainConfig cfg, comm::Communicator& comm) {
  const int world = comm.world_size();
  // validate() refuses --nvme-path without NVMe offload, which the plan has yet to choose.
  TrainConfig probe = cfg;
  probe.nvme_path.clear();
  probe.given.erase("--nvme-path");
  TrainConfig resolved = resolve_settings(probe, world);
  resolved.nvme_path = cfg.nvme_path;
  ZERONE_CHECK(!resolved.model.empty(), "--auto-fit plans for --model: give the model (--init alone is not read before planning)");
  const DType dtype = resolve_precision(resolved.precision);
  std::unique_ptr<nn::Model> shape = nn::make_model(resolved.model, dtype, 64, /*allocate=*/false);
  count_for_run_device(*shape, resolved);
  // Rank 0 measures; every rank plans with its figures (Note [Fit]: the plan is deterministic).
  PlanMachine machine;
  double figures[11] = {};
  if (comm.rank() == 0) {
    PlanMachineOptions options;
    const comm::Hosts& hosts = comm.hosts();
    options.ranks_per_host = hosts.of_member.empty()
                                 ? world
                                 : static_cast<int>(std::count(hosts.of_member.begin(), hosts.of_member.end(), hosts.of_member[0]));
    machine = plan_machine(resolved, world, dtype, options);
    const zero::MemoryBudget& b = machine.budget;
    const zero::MachineSpeed& s = machine.speed;
    double values[11] = {static_cast<double>(b.ranks_per_host), static_cast<double>(b.device_bytes),
                         static_cast<double>(b.host_bytes), static_cast<double>(b.nvme_bytes), s.gemm_flop_per_s,
                         s.memory_bytes_per_s, s.disk_bytes_per_s, s.link_bytes_per_s, b.unified ? 1.0 : 0.0,
                         s.device_memory_bytes_per_s, s.host_device_bytes_per_s};
    std::copy(std::begin(values), std::end(values), figures);
  }
  if (world > 1) comm.broadcast(figures, sizeof figures, 0);
  machine.budget.ranks_per_host = static_cast<int>(figures[0]);
  machine.budget.device_bytes = static_cast<int64_t>(figures[1]);
  machine.budget.host_bytes = static_cast<int64_t>(figures[2]);
  machine.budget.nvme_bytes = static_cast<int64_t>(figures[3]);
  machine.speed.gemm_flop_per_s = figures[4];
  machine.speed.memory_bytes_per_s = figures[5];
  machine.speed.host_device_bytes_per_s = figures[10];
  machine.speed.disk_bytes_per_s = figures[6];
  machine.speed.link_bytes_per_s = figures[7];
  machine.budget.unified = figures[8] != 0.0;
  machine.speed.device_memory_bytes_per_s = figures[9];
  const zero::PlanRequest request = plan_request(resolved, *shape, dtype, world, machine);
  const zero::Plan plan = zero::make_plan(request);
  if (comm.rank() == 0) std::printf("%s", plan_text(plan, request, machine, resolved, 3).c_str());
  ZERONE_CHECK(plan.best.has_value(), "--auto-fit: no settings fit; ", smallest_text(plan, machine.budget));
  apply_plan(plan.best->choice, cfg);
  if (comm.rank() == 0) std::printf("--auto-fit: training with %s\n", choice_flags(plan.best->choice).c_str());
  std::fflush(stdout);
  return cfg;
}

}  // namespace zerone::train
