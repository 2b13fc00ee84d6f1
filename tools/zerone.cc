// The `zerone` command-line program: parse, validate, call the libraries. Nothing else lives here.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <system_error>
#include <iostream>

#include "zerone/comm/comm_choice.h"
#include "zerone/comm/communicator.h"
#include "zerone/core/error.h"
#include "zerone/core/sysinfo.h"
#include "zerone/io/prepare.h"
#include "zerone/io/tokenizer.h"
#include "zerone/kernels/cpu/matmul.h"
#include "zerone/nn/model.h"
#include "zerone/report/html_report.h"
#include "zerone/train/config.h"
#include "zerone/train/settings.h"
#include "zerone/train/plan.h"
#include "zerone/zero/planner.h"
#include "zerone/io/aio.h"
#include "zerone/io/fault_env.h"
#include "zerone/io/file.h"
#include "zerone/optim/optimizers.h"
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

// Note [Flags from the table]: each command's flags are the settings table's rows for it
// (train/settings.h), bound to the TrainConfig field, grouped and with their defaults in --help.
void add_setting_flags(CLI::App& cmd, train::TrainConfig& c, unsigned command) {
  for (const train::Setting& s : train::settings()) {
    if (!(s.commands & command)) continue;
    std::string names = s.flag;
    for (const std::string& a : s.cli_aliases) names += "," + a;
    std::string help = s.help;
    if (s.type == train::SettingType::choice) help += str_cat(" (", train::range_text(s), ")");
    help += str_cat(" [default: ", s.default_text, "]");
    CLI::Option* opt = std::visit(
        [&](auto member) -> CLI::Option* {
          auto& field = c.*member;
          using F = std::decay_t<decltype(field)>;
          if constexpr (std::is_same_v<F, bool>) {
            if (s.type == train::SettingType::toggle) return cmd.add_flag(names, field, help);
          }
          return cmd.add_option(names, field, help);
        },
        s.field);
    opt->group(train::setting_group_title(s.group));
  }
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
  std::printf("  libraries  %s\n", cuda::library_versions().c_str());
  auto devs = cuda::devices();
  if (devs.empty()) std::printf("  devices    none found (GPU kernels will be skipped)\n");
  for (const auto& d : devs) {
    std::printf("  device %d   %s, sm_%d%d, %d SMs, %s\n", d.index, d.name.c_str(), d.compute_major, d.compute_minor,
                d.multiprocessors, train::human_bytes(static_cast<double>(d.total_memory_bytes)).c_str());
    // Note [Device memory the ledger cannot see]: with this process's context made, what is free
    // (on an idle GPU, total - free is the context, the figure kCudaContextReserveBytes bounds).
    const cuda::MemoryInfo m = cuda::memory_info(d.index);
    std::printf("    memory   %s free of %s with this process's CUDA context (context and other processes: %s; "
                "reserved before a context: %s)\n",
                train::human_bytes(static_cast<double>(m.free_bytes)).c_str(),
                train::human_bytes(static_cast<double>(m.total_bytes)).c_str(),
                train::human_bytes(static_cast<double>(m.total_bytes - m.free_bytes)).c_str(),
                train::human_bytes(static_cast<double>(kernels::kCudaContextReserveBytes)).c_str());
  }
#else
  std::printf("CUDA         not compiled in\n");
#endif
  if (comm::nccl_compiled_in())
    std::printf("NCCL         %s (the collectives over GPU memory; --comm nccl)\n", comm::nccl_version().c_str());
  else
    std::printf("NCCL         not compiled in (multi-GPU collectives go through MPI with host staging)\n");
  std::string devices;
  for (kernels::DeviceKind d : kernels::available_devices())
    devices += str_cat(devices.empty() ? "" : ", ", kernels::device_kind_name(d));
  std::printf("devices      %s (default %s)\n", devices.c_str(), kernels::device_kind_name(kernels::default_device()));
  return 0;
}

// `zerone estimate`: the settings are train's (the table's rows for estimate), derived into the
// engine's configuration by the same function train uses (train::zero_config).
// Note [Fit] (zero/planner.h): a row fits when its device bytes fit --device-mem-limit (if given),
// its memory (device + host on a CPU build) times --ranks-per-host fits the host memory
// (--host-mem, else this machine's physical memory) and its NVMe bytes the free disk under
// --nvme-path (when given). A given stage that does not fit gets the refusal's advice.
int cmd_estimate(train::TrainConfig a, int world, bool json, bool stage_given, const train::PlanMachineOptions& machine) {
  ZERONE_CHECK(world >= 1 && world <= 1048576, "--world ", world, " is out of range: expected an integer in 1..1048576");
  for (const train::Setting& s : train::settings())
    if (s.commands & train::kEstimate) train::check_setting(s, a);
  train::check_memory_settings(a);
  train::check_device_settings(a);
  DType dtype = train::resolve_precision(a.precision);
  std::unique_ptr<nn::Model> shape = nn::make_model(a.model, dtype, 64, /*allocate=*/false);
  shape->set_activation_checkpointing(a.activation_checkpointing);
  shape->set_cpu_checkpointing(a.cpu_checkpointing);
  train::count_for_run_device(*shape, a);  // --device, --cuda-attention: what attention saves there
  const nn::Model& model = *shape;
  // Image classifiers read one sample per row: --seq does not apply to them.
  const bool classifier = model.input_kind() == nn::InputKind::features;
  ZERONE_CHECK(!classifier || !a.is_given("--seq"), "--seq applies to token models; ", model.spec(),
               " reads one image per sample");
  const int seq = classifier ? 1 : a.seq;
  ZERONE_CHECK(seq <= model.max_seq_len(), "--seq ", seq, " exceeds the model's context length ", model.max_seq_len());
  const zero::ZeroConfig base = train::zero_config(a, dtype, model.unit_numels(), world);
  const optim::OptimizerOptions optimizer = train::optimizer_options(a);
  const kernels::DeviceKind device = kernels::device_or_default(a.device);
  const zero::CollectiveRoute route = train::planned_collective_route(a, world);
  auto rows = zero::estimate(model, world, dtype, a.micro_batch, seq, base, optimizer,
                             stage_given ? std::optional<int>(a.zero_stage) : std::nullopt, route);
  ZERONE_CHECK(machine.ranks_per_host >= 1 && machine.ranks_per_host <= world, "--ranks-per-host ",
               machine.ranks_per_host, " is out of range: expected 1..--world (", world, ")");
  ZERONE_CHECK(machine.host_mem_gib >= 0, "--host-mem ", machine.host_mem_gib, " must be at least 0");
  zero::MemoryBudget budget;
  budget.unified = train::unified_memory(a);
  budget.ranks_per_host = machine.ranks_per_host;
  // Note [Device budget] (train/plan.h): --device-mem-limit, and on cuda the GPU's usable memory.
  const train::DeviceBudget device_cap = train::device_budget(device, a.device_mem_limit, kernels::device_memory(device));
  budget.device_bytes = device_cap.bytes;
  budget.host_bytes = machine.host_mem_gib > 0 ? static_cast<int64_t>(machine.host_mem_gib * 1024.0 * 1024.0 * 1024.0)
                                               : physical_memory_bytes();
  if (!a.nvme_path.empty())
    budget.nvme_bytes = machine.disk_free_gib >= 0 ? static_cast<int64_t>(machine.disk_free_gib * 1024.0 * 1024.0 * 1024.0)
                                                   : static_cast<int64_t>(io::check_swap_path(a.nvme_path, "--nvme-path"));
  // Note [Gradient sums on the device]: a row whose sums would not fit on the device has them on
  // the host, as the run of that stage would (train::fit_grad_sums).
  std::vector<const char*> sums_place(rows.size(), nullptr);  // per row where it matters: "device" or "host"
  for (size_t i = 0; i < rows.size(); ++i) {
    zero::StageEstimate& r = rows[i];
    zero::ZeroConfig fitted = train::fit_grad_sums(a, model, dtype, world, seq, r.stage, base, budget, route);
    if (fitted.grad_sums_on_device != base.grad_sums_on_device)
      r = zero::estimate(model, world, dtype, a.micro_batch, seq, fitted, optimizer, r.stage, route)[0];
    fitted.stage = r.stage;
    if (a.grad_accum > 1 && zero::gradient_sums_placeable(fitted)) sums_place[i] = fitted.grad_sums_on_device ? "device" : "host";
  }
  auto fits = [&](const zero::StageEstimate& r) { return zero::overflows(zero::place_need(r, budget), budget).empty(); };
  // The advice for a given stage that does not fit, or when no stage fits for the run's own stage
  // (Note [Advice that leads somewhere]).
  auto advice = [&]() -> std::string {
    const zero::StageEstimate& row = stage_given ? rows[0] : rows[static_cast<size_t>(a.zero_stage)];
    if (stage_given ? fits(row) : std::any_of(rows.begin(), rows.end(), fits)) return "";
    a.seq = seq;
    std::string over;
    for (const std::string& o : zero::overflows(zero::place_need(row, budget), budget)) over += str_cat(over.empty() ? "" : "; ", o);
    return str_cat(stage_given ? "" : str_cat("no stage fits; at --zero-stage ", a.zero_stage, " "), "does not fit: ", over,
                   ". ", train::fit_advice(a, model, dtype, world, budget, row));
  };
  if (json) {
    nlohmann::ordered_json j;
    j["model"] = model.spec();
    j["parameters"] = model.num_parameters();
    j["world"] = world;
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
                          {"host", r.working_set.host}, {"host_scratch", r.working_set.host_scratch},
                          {"total", r.working_set.total()}};
      s["activation"] = r.activations + r.host_activations;
      s["activation_places"] = {{"device", r.activations}, {"host", r.host_activations}};
      s["staged_collectives"] = r.staged_collectives;  // host (Note [Staged collective bytes])
      s["backend_scratch"] = r.backend_scratch;        // device (Note [Backend scratch])
      // Note [Gradient sums on the device]: where the micro-steps' sums are, where that is a choice.
      if (const char* place = sums_place[static_cast<size_t>(&r - rows.data())]) s["grad_sums"] = place;
      s["total"] = r.total();
      // Where the bytes live (Note [Offload places]): device = model state there + working set +
      // activations; "places" has every (place, category) the ledger will show.
      s["device"] = r.device();
      s["host"] = r.host();
      s["nvme"] = r.nvme();
      s["model_state_places"] = train::places_json(r.model_state.placed);
      s["fits"] = fits(r);
      j["stages"].push_back(s);
    }
    j["device"] = kernels::device_kind_name(device);
    if (device == kernels::DeviceKind::cuda) j["cuda_attention"] = a.cuda_attention;
    j["budget"] = {{"unified", budget.unified}, {"ranks_per_host", budget.ranks_per_host},
                   {"device_per_rank", budget.device_bytes}, {"memory_per_host", budget.host_bytes},
                   {"nvme_free", budget.nvme_bytes}};
    if (budget.device_bytes > 0) j["budget"]["device_source"] = device_cap.source;
    if (const std::string text = advice(); !text.empty()) j["advice"] = text;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model %s (%zu parameters), world %d, device %s%s, %s, %s, micro-batch %d x seq %d, offload optimizer %s, "
              "param %s; bytes per rank:\n",
              model.spec().c_str(), model.num_parameters(), world, kernels::device_kind_name(device),
              device == kernels::DeviceKind::cuda ? str_cat(" (", a.cuda_attention, " attention)").c_str() : "",
              dtype_name(dtype),
              a.optimizer == "sgd" ? str_cat("sgd (momentum ", a.momentum, ")").c_str() : "adamw", a.micro_batch, seq,
              a.offload_optimizer.c_str(), a.offload_param.c_str());
  std::printf("fits: %s%s per host%s%s%s\n", budget.unified ? "device + host within " : "host within ",
              train::human_bytes(static_cast<double>(budget.host_bytes)).c_str(),
              budget.ranks_per_host > 1 ? str_cat(" (", budget.ranks_per_host, " ranks per host)").c_str() : "",
              budget.device_bytes > 0 ? str_cat(", device within ", train::human_bytes(static_cast<double>(budget.device_bytes)), " per rank (", device_cap.source, ")").c_str() : "",
              budget.nvme_bytes >= 0 ? str_cat(", NVMe within ", train::human_bytes(static_cast<double>(budget.nvme_bytes)), " free").c_str() : "");
  std::printf("%-6s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s%s\n", "stage", "param", "grad", "master", "optim",
              "model", "working set", "activation", "device", "host", "nvme", "in memory", "  fits");
  auto h = [](int64_t b) { return train::human_bytes(static_cast<double>(b)); };
  for (const auto& r : rows) {
    std::printf("%-6d %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s%s\n", r.stage, h(r.model_state.param).c_str(),
                h(r.model_state.grad).c_str(), h(r.model_state.master).c_str(), h(r.model_state.optim).c_str(),
                h(r.model_state.total()).c_str(), h(r.working_set.total()).c_str(), h(r.activations + r.host_activations).c_str(),
                h(r.device()).c_str(), h(r.host()).c_str(), h(r.nvme()).c_str(), h(r.total()).c_str(),
                fits(r) ? "  yes" : "  no");
  }
  if (!rows.empty() && rows[0].backend_scratch > 0)  // the same for every stage
    std::printf("device includes %s of the %s backend's own scratch (kernel operands, cuBLASLt's workspace)\n",
                h(rows[0].backend_scratch).c_str(), kernels::device_kind_name(device));
  std::string sums;
  for (size_t i = 0; i < rows.size(); ++i)
    if (sums_place[i]) sums += str_cat(sums.empty() ? "" : ", ", "stage ", rows[i].stage, " on the ", sums_place[i]);
  if (!sums.empty())
    std::printf("gradient sums of the micro-steps: %s (--grad-accumulators %s)\n", sums.c_str(), a.grad_accumulators.c_str());
  if (const std::string text = advice(); !text.empty()) std::printf("%s\n", text.c_str());
  return 0;
}

// `zerone plan`: the planner (zero/planner.h) over the run's settings; what the user gives is held
// fixed. Prints the plan (or --json); --out writes the chosen settings as a config that
// `zerone train --config FILE` runs unchanged. Exit 1 when nothing fits (the smallest budgets
// are printed).
int cmd_plan(train::TrainConfig a, int world, const train::PlanMachineOptions& machine_options, bool json,
             const std::string& out_path, size_t runners_up) {
  ZERONE_CHECK(world >= 1 && world <= 1048576, "--world ", world, " is out of range: expected an integer in 1..1048576");
  for (const train::Setting& s : train::settings())
    if (s.commands & train::kEstimate) train::check_setting(s, a);
  train::check_device_settings(a);
  ZERONE_CHECK(!a.cpu_checkpointing || a.activation_checkpointing || !a.is_given("--activation-checkpointing"),
               "--cpu-checkpointing keeps the inputs that activation checkpointing saves: it needs --activation-checkpointing");
  ZERONE_CHECK(machine_options.host_mem_gib >= 0, "--host-mem ", machine_options.host_mem_gib, " must be at least 0");
  ZERONE_CHECK(out_path.empty() || a.config_file.empty() || !io::same_file(out_path, a.config_file), "--out '", out_path,
               "' is the --config input: give another file");
  if (!out_path.empty()) io::check_atomic_output(out_path, "--out");  // before the planning, not after it
  const DType dtype = train::resolve_precision(a.precision);
  a.precision = dtype_name(dtype);
  std::unique_ptr<nn::Model> shape = nn::make_model(a.model, dtype, 64, /*allocate=*/false);
  train::count_for_run_device(*shape, a);  // --device, --cuda-attention: what attention saves there
  const bool classifier = shape->input_kind() == nn::InputKind::features;
  ZERONE_CHECK(!classifier || !a.is_given("--seq"), "--seq applies to token models; ", shape->spec(), " reads one image per sample");
  if (classifier) a.seq = 1;
  const train::PlanMachine machine = train::plan_machine(a, world, dtype, machine_options);
  const zero::PlanRequest request = train::plan_request(a, *shape, dtype, world, machine);
  const zero::Plan plan = zero::make_plan(request);
  if (json) std::printf("%s\n", train::plan_json(plan, request, machine, a).dump(2).c_str());
  else std::printf("%s", train::plan_text(plan, request, machine, a, runners_up).c_str());
  if (!plan.best) return 1;
  if (!out_path.empty()) {
    train::TrainConfig applied = a;
    train::apply_plan(plan.best->choice, applied);
    for (const char* flag : {"--model", "--seq", "--precision"}) applied.given.insert(flag);
    if (classifier) applied.given.erase("--seq");
    const std::string text = train::effective_config_json(applied, dtype_name(dtype)) + "\n";
    io::write_file_atomically(out_path, [&](std::FILE* f) {
      ZERONE_CHECK(std::fwrite(text.data(), 1, text.size(), f) == text.size(), "--out '", out_path, "': the write failed");
    });
    if (!json) std::printf("wrote '%s': zerone train --config %s runs this plan\n", out_path.c_str(), out_path.c_str());
  }
  return 0;
}

// The settings of estimate and plan: the flags given, then --config for the rest; a model is needed.
void read_settings(const CLI::App& cmd, train::TrainConfig& cfg, const std::string& config_path) {
  for (const CLI::Option* opt : cmd.get_options())
    if (opt->count() > 0) cfg.given.insert(opt->get_name());
  cfg.config_file = config_path;
  if (!config_path.empty()) train::apply_json_config(config_path, cfg);
  ZERONE_CHECK(!cfg.model.empty(), "--model is required (on the command line or as \"model\" in --config)");
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
  bool print_config = false;
  CLI::App* train_cmd = app.add_subcommand("train", "train a model (no arguments: the default run)");
  train_cmd->add_option("--config", config_path,
                        "JSON config: DeepSpeed's keys (docs/CONFIG.md) and zerone's (--print-config "
                        "writes them); flags override it");
  train_cmd->add_flag("--print-config", print_config,
                      "print the effective settings (after --config, flags and \"auto\") as a JSON config and exit");
  bool auto_fit = false;
  train_cmd->add_flag("--auto-fit", auto_fit,
                      "plan the memory settings first (zerone plan: stage, offload, checkpointing, buckets, micro-batch "
                      "with --train-batch-size) and train with the plan; settings given are kept")
      ->group(train::setting_group_title(train::SettingGroup::offload));
  add_setting_flags(*train_cmd, train_cfg, train::kTrain);

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
  CLI::App* sample_cmd = app.add_subcommand(
      "sample", "generate text from an llm.c checkpoint, a Hugging Face model directory or a zerone checkpoint");
  sample_cmd->add_option("--init", sample_opts.init,
                         "an llm.c GPT-2 file, a Hugging Face model directory (GPT-2 or LLaMA; decodes with its own "
                         "tokenizer when it has one) or a zerone checkpoint directory")->required();
  sample_cmd->add_option("--prompt", sample_opts.prompt, "prompt text, encoded with --tokenizer (default byte-level)");
  sample_cmd->add_option("--prompt-tokens", sample_opts.prompt_tokens, "prompt as token ids")->delimiter(',');
  sample_cmd->add_option("--tokenizer", sample_opts.tokenizer,
                         "tokenizer.json, encoder.json, SentencePiece .model or llm.c tokenizer file (decode only)");
  sample_cmd->add_option("--tokens", sample_opts.num_tokens, "tokens to generate");
  sample_cmd->add_option("--temperature", sample_opts.temperature, "sampling temperature (0: greedy)");
  sample_cmd->add_option("--top-k", sample_opts.top_k, "sample among the k most likely (0: all)");
  sample_cmd->add_option("--seed", sample_opts.seed, "sampling seed");
  for (auto [flag, field] : {std::pair{"--device", &sample_opts.device}, std::pair{"--cuda-attention", &sample_opts.cuda_attention}}) {
    const train::Setting& setting = *train::find_setting(flag);  // train's flag: the same help, choices and default
    sample_cmd->add_option(flag, *field, setting.help + " (" + train::range_text(setting) + ") [default: " +
                                             setting.default_text + "]");
  }
  sample_cmd->add_option("--precision", sample_opts.precision, train::find_setting("--precision")->help + " (" +
                         train::range_text(*train::find_setting("--precision")) + ") [default: " +
                         train::find_setting("--precision")->default_text + "]");

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
  // The dtype names are --precision's (f32 and f16 are read too).
  convert_cmd->add_option("--dtype", convert_opts.dtype,
                          str_cat("the dtype to write: ", train::range_text(*train::find_setting("--precision")),
                                  " [default: the source's]"));

  train::TrainConfig est;
  int est_world = 1;
  bool est_json = false;
  CLI::App* estimate_cmd = app.add_subcommand("estimate", "per-rank memory of each ZeRO stage, before running");
  estimate_cmd->add_option("--world", est_world, "data-parallel ranks")->required();
  estimate_cmd->add_flag("--json", est_json, "machine-readable output");
  std::string est_config;
  train::PlanMachineOptions est_machine;
  est_machine.ranks_per_host = 1;
  estimate_cmd->add_option("--config", est_config, "a JSON config of zerone train: its settings, flags override them");
  estimate_cmd->add_option("--ranks-per-host", est_machine.ranks_per_host, "ranks sharing one host's memory and disk [default: 1]");
  estimate_cmd->add_option("--host-mem", est_machine.host_mem_gib, "GiB of memory per host [default: this machine's physical memory]");
  estimate_cmd->add_option("--nvme-path", est.nvme_path, "the swap directory: NVMe bytes are checked against its free space");
  estimate_cmd->add_option("--disk-free", est_machine.disk_free_gib, "GiB free under --nvme-path [default: measured]");
  add_setting_flags(*estimate_cmd, est, train::kEstimate);

  train::TrainConfig plan_cfg;
  int plan_world = 1;
  bool plan_json = false;
  std::string plan_config, plan_out;
  size_t plan_runners = 6;
  train::PlanMachineOptions plan_machine;
  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "find the settings that fit this machine (or the budgets given) and run fastest, by the exact memory "
              "estimate and a cost model");
  plan_cmd->add_option("--config", plan_config, "a JSON config of zerone train: its settings (given ones are kept)");
  plan_cmd->add_option("--world", plan_world, "data-parallel ranks [default: 1]");
  plan_cmd->add_option("--ranks-per-host", plan_machine.ranks_per_host, "ranks on one host, sharing its memory and disk [default: --world]");
  plan_cmd->add_option("--train-batch-size", plan_cfg.train_batch_size,
                       "sequences per optimizer step over all ranks; without --micro-batch the planner chooses the micro-batch");
  plan_cmd->add_option("--nvme-path", plan_cfg.nvme_path, "swap directory: NVMe offload is considered (its free space is the budget)");
  plan_cmd->add_option("--host-mem", plan_machine.host_mem_gib, "GiB of memory per host [default: available now, less a reserve of 5% and 256 MiB per rank]");
  plan_cmd->add_option("--disk-free", plan_machine.disk_free_gib, "GiB free under --nvme-path [default: statvfs]");
  plan_cmd->add_option("--gemm-tflops", plan_machine.gemm_tflops,
                       "GEMM TFLOP/s per rank (with --device cuda the GPU's) [default: measured]");
  plan_cmd->add_option("--memory-bandwidth", plan_machine.memory_gbps, "host memory GB/s per rank [default: measured]");
  plan_cmd->add_option("--device-bandwidth", plan_machine.device_memory_gbps,
                       "with --device cuda: the GPU's memory GB/s [default: measured on the GPU]");
  plan_cmd->add_option("--host-device-bandwidth", plan_machine.host_device_gbps,
                       "with --device cuda: GB/s between host and GPU, the slower direction [default: measured on the GPU]");
  plan_cmd->add_option("--disk-bandwidth", plan_machine.disk_gbps, "GB/s under --nvme-path [default: measured]");
  plan_cmd->add_option("--link-bandwidth", plan_machine.link_gbps,
                       "GB/s per rank between ranks [default: half the memory bandwidth on one host, 1.25 across hosts]");
  plan_cmd->add_flag("--json", plan_json, "machine-readable output");
  plan_cmd->add_option("--out", plan_out, "write the chosen settings as a config for zerone train --config");
  plan_cmd->add_option("--runners-up", plan_runners, "runners-up to list [default: 6]");
  add_setting_flags(*plan_cmd, plan_cfg, train::kEstimate);
  // Every subcommand's flags are grouped in --help; the ones outside the table under "Options".

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
                 : estimate_cmd->parsed() ? "estimate " : plan_cmd->parsed() ? "plan " : convert_cmd->parsed() ? "convert " : report_cmd->parsed() ? "report " : "");
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
      // The test hooks (io/fault_env.h): read here, once, and handed down.
      const io::FaultEnv fault_env = io::FaultEnv::from_environment();
      for (const CLI::Option* opt : train_cmd->get_options())
        if (opt->count() > 0) train_cfg.given.insert(opt->get_name());
      train_cfg.config_file = config_path;
      if (!config_path.empty()) train::apply_json_config(config_path, train_cfg);
      if (auto_fit) train_cfg = train::auto_fit(train_cfg, *communicator);
      if (print_config) {
        const train::TrainConfig effective = train::resolve_settings(train_cfg, communicator->world_size());
        if (communicator->rank() == 0)
          std::printf("// zerone train --print-config: the effective settings; zerone train --config FILE runs the same\n%s\n",
                      train::effective_config_json(effective, dtype_name(train::resolve_precision(effective.precision))).c_str());
        return 0;
      }
      train::TrainResult result = train::run_training(train_cfg, *communicator, fault_env);
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
      convert_opts.fault_env = io::FaultEnv::from_environment();  // the test hooks (io/fault_env.h)
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
      read_settings(*estimate_cmd, est, est_config);
      return cmd_estimate(est, est_world, est_json, est.is_given("--zero-stage"), est_machine);
    } else if (plan_cmd->parsed()) {
      read_settings(*plan_cmd, plan_cfg, plan_config);
      return cmd_plan(plan_cfg, plan_world, plan_machine, plan_json, plan_out, plan_runners);
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
