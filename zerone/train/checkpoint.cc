#include "zerone/train/checkpoint.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include "zerone/core/error.h"
#include "zerone/nn/model.h"
#include "zerone/train/interrupt.h"
#include "zerone/train/settings.h"

namespace zerone::train {
namespace {

using nlohmann::json;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

json trainer_state_to_json(const TrainerState& s) {
  json settings = json::object();
  for (const auto& [key, value] : s.settings) settings[key] = value;
  return {{"step", s.step},
          {"consumed_samples", s.consumed_samples},
          {"epoch_samples", s.epoch_samples},
          {"micro_batch", s.micro_batch},
          {"seq", s.seq},
          {"grad_accum", s.grad_accum},
          {"world_size", s.world_size},
          {"seed", s.seed},
          {"shuffle", s.shuffle},
          {"rng", "counter-based: every random number is a function of (seed, step, position)"},
          {"lr_schedule_advances", s.lr_advances},
          {"loss_scaler",
           {{"scale", s.loss_scaler.scale},
            {"hysteresis_left", s.loss_scaler.hysteresis_left},
            {"iteration", s.loss_scaler.iteration},
            {"last_overflow", s.loss_scaler.last_overflow}}},
          {"skipped_steps", s.skipped_steps},
          {"settings", settings}};
}

TrainerState trainer_state_from_json(const json& j, const std::string& what) {
  // Every number is range-checked as written (a float or a value beyond 64 bits is no count), and
  // printed as written: nlohmann's get<int> would wrap 1e30 to INT64_MIN or truncate 2^32+2 to 2.
  auto field = [&](const json& obj, const char* key) -> const json& {
    ZERONE_CHECK(obj.is_object() && obj.contains(key), what, ": the trainer state is incomplete: it lacks \"", key, "\"");
    return obj.at(key);
  };
  auto integer = [&](const json& obj, const char* key, int64_t lo, int64_t hi, const std::string& expected) {
    const json& v = field(obj, key);
    const std::optional<int64_t> x = io::manifest_integer(v, lo, hi);
    ZERONE_CHECK(x.has_value(), what, ": trainer state \"", key, "\" ", v.dump(), " is out of range (expected ", expected, ")");
    return *x;
  };
  constexpr int64_t kIntMax = INT32_MAX;
  TrainerState s;
  s.step = integer(j, "step", 0, kIntMax - 1, "0..2147483646");
  s.micro_batch = static_cast<int>(integer(j, "micro_batch", 1, kIntMax, ">= 1"));
  s.seq = static_cast<int>(integer(j, "seq", 1, kIntMax, ">= 1"));
  s.grad_accum = static_cast<int>(integer(j, "grad_accum", 1, kIntMax, ">= 1"));
  s.world_size = static_cast<int>(integer(j, "world_size", 1, kIntMax, ">= 1"));
  // Note [Resume position]: every step reads at least one sample; 2^62 keeps sample x seq and the
  // position arithmetic inside 64 bits for any seq this run takes.
  constexpr int64_t kMaxSamples = int64_t{1} << 62;
  if (j.is_object() && j.contains("consumed_samples")) {
    s.consumed_samples = static_cast<uint64_t>(
        integer(j, "consumed_samples", s.step, kMaxSamples, str_cat("step..2^62 = ", s.step, "..", kMaxSamples)));
    s.epoch_samples = static_cast<uint64_t>(integer(j, "epoch_samples", 1, kMaxSamples, "1..2^62"));
  } else {
    // Older checkpoints: the global micro-batch chunk index; 2^32 chunks per step is beyond any global batch.
    constexpr int64_t kMaxChunksPerStep = int64_t{1} << 32;
    const int64_t chunk = integer(j, "next_chunk", s.step, s.step * kMaxChunksPerStep,
                                  str_cat("step..step x 2^32 = ", s.step, "..", s.step * kMaxChunksPerStep));
    ZERONE_CHECK(chunk <= kMaxSamples / s.micro_batch, what, ": trainer state \"next_chunk\" ", chunk, " x micro-batch ",
                 s.micro_batch, " is out of range (expected at most 2^62 samples)");
    s.consumed_samples = static_cast<uint64_t>(chunk) * static_cast<uint64_t>(s.micro_batch);
    s.position_in_chunks = true;
  }
  const json& seed = field(j, "seed");
  ZERONE_CHECK(seed.is_number_unsigned() || (seed.is_number_integer() && seed.get<int64_t>() >= 0), what,
               ": trainer state \"seed\" ", seed.dump(), " is out of range (expected 0..18446744073709551615)");
  s.seed = seed.get<uint64_t>();
  const json& shuffle = field(j, "shuffle");
  ZERONE_CHECK(shuffle.is_boolean(), what, ": trainer state \"shuffle\" is ", shuffle.dump(), ", expected true or false");
  s.shuffle = shuffle.get<bool>();
  s.lr_advances = integer(j, "lr_schedule_advances", 0, s.step, "0..step");
  const json& ls = field(j, "loss_scaler");
  const json& scale = field(ls, "scale");
  ZERONE_CHECK(scale.is_number() && std::isfinite(scale.get<double>()) && scale.get<double>() > 0.0, what,
               ": trainer state \"scale\" ", scale.dump(), " is out of range (expected a positive number)");
  s.loss_scaler.scale = scale.get<double>();
  s.loss_scaler.hysteresis_left = static_cast<int>(integer(ls, "hysteresis_left", 0, kIntMax, "0..2147483647"));
  s.loss_scaler.iteration = integer(ls, "iteration", 0, INT64_MAX, ">= 0");
  s.loss_scaler.last_overflow = integer(ls, "last_overflow", -1, INT64_MAX, ">= -1");
  s.skipped_steps = integer(j, "skipped_steps", 0, s.step, "0..step");
  if (j.contains("settings")) {
    const json& settings = j.at("settings");
    ZERONE_CHECK(settings.is_object(), what, ": trainer state \"settings\" is ", settings.dump(), ", expected an object");
    for (const auto& [key, value] : settings.items()) {
      ZERONE_CHECK(value.is_string(), what, ": trainer state setting \"", key, "\" is ", value.dump(), ", expected a string");
      s.settings.emplace_back(key, value.get<std::string>());
    }
  }
  return s;
}

// ------------------------------------------------------------------------------------ saving

struct Checkpointer::Pending {
  TrainerState state;
  std::string tmp;
  std::string optimizer_type;
  std::vector<std::string> optimizer_state;
  int64_t optimizer_steps = 0;
  io::CheckpointFile file;
  double write_s = 0.0;  // writing and fsyncing this rank's file
  // Async: the staged pieces and the thread writing them.
  struct Staged {
    int unit;
    std::string tensor;
    DType dtype;
    size_t begin, count;
    const void* data;  // in Checkpointer::staging_
  };
  std::vector<Staged> staged;
  std::thread writer;
  std::atomic<bool> done{false};
  std::exception_ptr error;
};

Checkpointer::Checkpointer(std::string root, int keep_last, bool async, CheckpointRunInfo info,
                           comm::Communicator& comm, const io::FaultEnv& env)
    : root_(std::move(root)), keep_last_(keep_last), async_(async), info_(std::move(info)), comm_(comm), env_(env) {}

Checkpointer::~Checkpointer() {
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

bool Checkpointer::writer_done() const { return !pending_ || pending_->done.load(); }

void Checkpointer::save(zero::ZeroEngine& engine, const TrainerState& state) {
  const auto t0 = std::chrono::steady_clock::now();
  publish_pending();
  auto p = std::make_unique<Pending>();
  p->state = state;
  // Rank 0 makes the temporary directory; the barrier orders it before every rank's file.
  if (comm_.rank() == 0) p->tmp = io::create_checkpoint_tmp(root_, state.step);
  comm_.barrier_async().wait();
  if (comm_.rank() != 0) p->tmp = root_ + "/.tmp-" + io::checkpoint_step_name(state.step);
  p->optimizer_type = engine.optimizer().type_name();
  p->optimizer_state = engine.optimizer().state_names();
  p->optimizer_steps = engine.optimizer().steps_taken();
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.bin", comm_.rank());
  // The rank's file is created here, on the training thread: state that already lives in a file
  // (NVMe offload) is copied into it now, disk to disk, before the next step changes it (Note
  // [Checkpoints of swapped state]); everything else is written now (sync) or from staging (async).
  const auto w0 = std::chrono::steady_clock::now();
  auto writer = std::make_unique<io::CheckpointFileWriter>(p->tmp, name, state.step, env_);
  last_copied_bytes_ = 0;
  const zero::ZeroEngine::ExtentSink copy_extent = [&](int u, const std::string& tensor, size_t begin, size_t count,
                                                       const std::string& path, uint64_t offset,
                                                       const std::vector<uint64_t>& checksums) {
    last_copied_bytes_ += writer->append_from_file(u, tensor, DType::f32, begin, count, path, offset, checksums);
  };
  // A failed write (a full disk) leaves no temporary directory behind on a single rank; with more
  // ranks others may still be writing into it, and the next run's start-up sweep removes it.
  struct RemoveTmpUnlessDone {
    const std::string& tmp;
    bool armed;
    ~RemoveTmpUnlessDone() {
      if (armed) io::remove_tree(tmp);
    }
  } cleanup{p->tmp, comm_.world_size() == 1};
  if (!async_) {
    engine.save_state(
        [&](int u, const std::string& tensor, DType dtype, size_t begin, size_t count, const void* data) {
          writer->append(u, tensor, dtype, begin, count, data);
        },
        copy_extent);
    p->file = writer->finish();
    writer.reset();
    p->write_s = seconds_since(w0);
    last_stall_s_ = seconds_since(t0);  // the whole save stalls training
    finish(*p);
    cleanup.armed = false;
    return;
  }
  // Async: copy every piece into host staging (the stall), then write in the background.
  // The staging buffers of the previous async save are reused (same pieces, same sizes every save),
  // so the stall is a memcpy, not page faults (Note [Saving a step]).
  size_t piece = 0;
  engine.save_state(
      [&](int u, const std::string& tensor, DType dtype, size_t begin, size_t count, const void* data) {
        const size_t bytes = count * dtype_size(dtype);
        if (piece == staging_.size()) staging_.emplace_back();
        Buffer& copy = staging_[piece++];
        if (copy.bytes() != bytes) copy = Buffer(bytes, MemCategory::scratch, MemPlace::host);
        // In 4 MiB chunks over the OpenMP team: one core's memcpy does not saturate memory bandwidth.
        constexpr size_t kChunk = size_t{4} << 20;
        const size_t chunks = (bytes + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
        for (size_t c = 0; c < chunks; ++c)
          std::memcpy(static_cast<char*>(copy.data()) + c * kChunk, static_cast<const char*>(data) + c * kChunk,
                      std::min(kChunk, bytes - c * kChunk));
        p->staged.push_back({u, tensor, dtype, begin, count, copy.data()});
      },
      copy_extent);
  staging_.resize(piece);
  Pending* raw = p.get();
  p->writer = std::thread([raw, w0, file_writer = std::move(writer)] {
    omp_set_num_threads(1);  // the training thread keeps the cores
    try {
      for (Pending::Staged& s : raw->staged) file_writer->append(s.unit, s.tensor, s.dtype, s.begin, s.count, s.data);
      raw->file = file_writer->finish();
      raw->write_s = seconds_since(w0);
    } catch (...) {
      raw->error = std::current_exception();
    }
    raw->done.store(true);
  });
  cleanup.armed = false;  // the writer thread owns the file now; finish() reports its failure
  pending_ = std::move(p);
  last_stall_s_ = seconds_since(t0);
}

void Checkpointer::publish_pending() {
  if (!pending_) return;
  std::unique_ptr<Pending> p = std::move(pending_);
  if (p->writer.joinable()) p->writer.join();
  finish(*p);
}

void Checkpointer::finish(Pending& p) {
  if (p.error) {
    if (comm_.world_size() == 1) io::remove_tree(p.tmp);
    std::rethrow_exception(p.error);
  }
  // Every rank's file description to rank 0: lengths first, then the texts padded to the longest.
  const std::string mine = io::checkpoint_file_to_json(p.file).dump();
  const int world = comm_.world_size();
  uint64_t my_len = mine.size();
  std::vector<uint64_t> lens(static_cast<size_t>(world));
  comm_.all_gather_async(&my_len, lens.data(), sizeof my_len).wait();
  const uint64_t longest = *std::max_element(lens.begin(), lens.end());
  std::string padded = mine;
  padded.resize(longest, ' ');
  std::string all(longest * static_cast<size_t>(world), ' ');
  comm_.all_gather_async(padded.data(), all.data(), longest).wait();
  uint64_t total_bytes = 0;
  if (comm_.rank() == 0) {
    io::CheckpointManifest m;
    m.step = p.state.step;
    m.model = info_.model_spec;
    m.dtype = info_.dtype;
    m.world_size = world;
    m.zero_stage = info_.zero_stage;
    m.offload_optimizer = info_.offload_optimizer;
    m.offload_param = info_.offload_param;
    m.units = info_.units;
    m.optimizer = p.optimizer_type;
    m.optimizer_state = p.optimizer_state;
    m.optimizer_steps = p.optimizer_steps;
    m.trainer = trainer_state_to_json(p.state);
    for (int r = 0; r < world; ++r) {
      const std::string text = all.substr(static_cast<size_t>(r) * longest, lens[r]);
      m.files.push_back(io::checkpoint_file_from_json(json::parse(text), str_cat("rank ", r, "'s checkpoint file")));
      total_bytes += m.files.back().bytes;
    }
    io::publish_checkpoint(root_, p.tmp, m, keep_last_, env_);  // removes p.tmp if it fails
  }
  // Every rank returns once the checkpoint is published (rank 0's failure ends the job first).
  comm_.barrier_async().wait();
  last_published_ = p.state.step;
  last_write_s_ = p.write_s;
  last_bytes_ = total_bytes;
}

// ------------------------------------------------------------------------------------ loading

void check_resumable(const io::CheckpointReader& reader) {
  const io::CheckpointManifest& m = reader.manifest();
  ZERONE_CHECK(!m.optimizer.empty() || (m.trainer.is_object() && m.trainer.contains("step")), "checkpoint '",
               reader.path(), "' holds weights only (no optimizer or trainer state; written by zerone convert?), so ",
               "there is no run to resume: start one from it with --init '", reader.path(), "'");
}

void check_checkpoint_fits(const io::CheckpointReader& reader, const nn::Model& model, DType dtype, bool weights_only) {
  const io::CheckpointManifest& m = reader.manifest();
  const std::string where = str_cat("checkpoint '", reader.path(), "'");
  // Compared in canonical form: "gpt2-124m" and its full spec are one model.
  const std::string held = nn::make_model(m.model, dtype, 64, false)->spec();
  ZERONE_CHECK(held == model.spec(), where, " holds model ", held, ", not ", model.spec());
  // Weights alone (--init) convert to the run's precision, as Hugging Face and llm.c sources do;
  // a resumed run continues the optimizer state of the precision it was trained in.
  ZERONE_CHECK(weights_only || m.dtype == dtype, where, " was trained in ", dtype_name(m.dtype), ", this run computes in ",
               dtype_name(dtype), ": resume with --precision ", m.dtype == DType::f32 ? "fp32" : dtype_name(m.dtype),
               " (--init takes its weights in any precision)");
  reader.check_layout(model);
  ZERONE_CHECK(reader.has_tensor("param") && (weights_only || reader.tensor_dtype("param") == dtype), where,
               " holds no parameters", weights_only ? "" : str_cat(" in ", dtype_name(dtype)));
}

// ------------------------------------------------------------------------------------ resuming

namespace {

void notice(bool lead, const std::string& text) {
  if (lead) std::fprintf(stderr, "zerone: notice: %s\n", text.c_str());
}

// Note [Resume position]: `consumed` samples of the saving run's stream (epochs of `saved_epoch`
// samples of `saved_seq` tokens) as a position in this run's stream.
uint64_t carry_position(uint64_t consumed, uint64_t saved_epoch, int saved_seq, uint64_t epoch, int seq) {
  const uint64_t epochs = consumed / saved_epoch, within = consumed % saved_epoch;
  // In 128 bits: within < 2^62 samples of up to 2^31 tokens.
  const unsigned __int128 tokens = static_cast<unsigned __int128>(within) * static_cast<uint64_t>(saved_seq);
  const uint64_t in_epoch = static_cast<uint64_t>((tokens + seq - 1) / static_cast<uint64_t>(seq));
  return epochs * epoch + std::min(in_epoch, epoch);
}

// Note [Settings a resume compares]: the result settings handled on their own.
bool compared_elsewhere(const std::string& key) {
  static const char* const kOwn[] = {"model", "precision", "optimizer", "init", "seed", "no_shuffle", "micro_batch",
                                     "grad_accum", "train_batch_size", "seq", "steps", "epochs"};
  return std::find(std::begin(kOwn), std::end(kOwn), key) != std::end(kOwn);
}

}  // namespace

std::unique_ptr<io::CheckpointReader> find_resume_checkpoint(const TrainConfig& cfg, bool lead) {
  std::string found_notice;
  std::optional<std::string> dir = io::find_latest_checkpoint(cfg.checkpoint_dir, &found_notice);
  if (!dir) {
    notice(lead, str_cat("--resume: no checkpoint in '", cfg.checkpoint_dir, "' yet, starting at step 1"));
    return nullptr;
  }
  if (!found_notice.empty()) notice(lead, found_notice);
  auto reader = std::make_unique<io::CheckpointReader>(*dir);
  check_resumable(*reader);
  if (!cfg.init.empty()) notice(lead, str_cat("resuming from '", *dir, "': --init '", cfg.init, "' is not read"));
  return reader;
}

TrainerState resume_trainer_state(const io::CheckpointReader& reader, const TrainConfig& cfg, int world,
                                  const BatchSource& source, bool lead) {
  const std::string where = str_cat("checkpoint '", reader.path(), "'");
  TrainerState state = trainer_state_from_json(reader.manifest().trainer, where);
  ZERONE_CHECK(state.step == reader.manifest().step, where, ": the trainer state is at step ", state.step,
               ", the manifest at step ", reader.manifest().step, " (a damaged or edited manifest)");
  ZERONE_CHECK(state.seed == cfg.seed && state.shuffle == !cfg.no_shuffle, where, " was trained with --seed ", state.seed,
               state.shuffle ? "" : " --no-shuffle", ": resume with the same data order");
  const int64_t next = state.step + 1;
  // The data position (Note [Resume position]).
  const int T = cfg.seq;
  if (state.position_in_chunks) {
    ZERONE_CHECK(state.seq == T, where, " counts its data position in micro-batches of ", state.micro_batch, " x ",
                 state.seq, " tokens (written before positions were counted in samples): resume with --seq ", state.seq);
    if (state.shuffle || state.consumed_samples > source.samples_per_epoch())
      notice(lead, str_cat(where, " counts its data position in micro-batches (written before positions were counted in ",
                           "samples): it continues at sample ", state.consumed_samples, ", but ",
                           state.shuffle ? "shuffled epochs now permute samples, not micro-batches"
                                         : "epochs now end after the last whole sample, not the last whole micro-batch",
                           ", so the samples from here on are not the ones the run that saved it would have read"));
  } else if (state.seq != T || state.epoch_samples != source.samples_per_epoch()) {
    const uint64_t carried = carry_position(state.consumed_samples, state.epoch_samples, state.seq,
                                            source.samples_per_epoch(), T);
    if (state.seq != T)
      notice(lead, str_cat("--seq changes from ", state.seq, " to ", T, " at step ", next, ": the data position is kept in ",
                           "tokens (sample ", state.consumed_samples, " of ", state.seq, " tokens is sample ", carried, " of ",
                           T, "), the global batch is ", T, " tokens per sequence from here on",
                           state.shuffle ? ", and the shuffled order of the rest of this epoch is drawn anew over the new "
                                           "sequences (some of its text may be read twice or not at all)"
                                         : ""));
    else
      notice(lead, str_cat("an epoch of the training data is ", source.samples_per_epoch(), " samples, it was ",
                           state.epoch_samples, " when the checkpoint was saved (another --data or global batch): the ",
                           "position is kept within its epoch (sample ", state.consumed_samples, " is sample ", carried, ")"));
    state.consumed_samples = carried;
  }
  const int64_t global = static_cast<int64_t>(cfg.micro_batch) * cfg.grad_accum * world;
  const int64_t saved_global = static_cast<int64_t>(state.micro_batch) * state.grad_accum * state.world_size;
  if (global != saved_global)
    notice(lead, str_cat("the global batch changes from ", saved_global, " to ", global, " sequences at step ", next));
  // Note [Settings a resume compares].
  if (state.settings.empty()) {
    notice(lead, str_cat(where, " does not record the settings it was trained with (written before they were ",
                         "recorded): a changed learning rate or optimizer setting cannot be named"));
    return state;
  }
  auto saved_value = [&](const std::string& key) -> const std::string* {
    for (const auto& [k, v] : state.settings)
      if (k == key) return &v;
    return nullptr;
  };
  const bool decays_over_steps = cfg.total_steps == 0 && (cfg.lr_schedule == "cosine" || cfg.lr_schedule == "warmup-decay" ||
                                                          cfg.lr_schedule == "warmup-cosine");
  for (const auto& [key, now] : result_settings(cfg)) {
    const std::string* saved = saved_value(key);
    const std::string name = setting_name(cfg, find_setting_by_key(key)->flag);
    if (key == "steps" && decays_over_steps && saved && *saved != now)
      notice(lead, str_cat(name, " changes from ", *saved, " to ", now, ": the ", cfg.lr_schedule, " schedule decays over ",
                           "--steps, so the learning rate from step ", next, " on is not the one the saving run would have ",
                           "used (--total-steps ", *saved, " keeps it)"));
    if (compared_elsewhere(key)) continue;
    if (!saved) notice(lead, str_cat(name, " is ", now, " from step ", next, "; ", where, " does not record it"));
    else if (*saved != now) notice(lead, str_cat(name, " changes from ", *saved, " to ", now, " at step ", next));
  }
  return state;
}

void resume_optimizer(io::CheckpointReader& reader, zero::ZeroEngine& engine) {
  const io::CheckpointManifest& m = reader.manifest();
  const std::vector<std::string> needed = engine.optimizer().state_names();
  auto state_names = [](const std::vector<std::string>& names) {
    std::string list;
    for (const std::string& n : names) list += str_cat(list.empty() ? "" : ", ", n);
    return list;
  };
  ZERONE_CHECK(m.optimizer == engine.optimizer().type_name() && m.optimizer_state == needed, "checkpoint '", reader.path(),
               "' holds ", m.optimizer.empty() ? "no optimizer" : m.optimizer, " state (", state_names(m.optimizer_state),
               "), this run's optimizer is ", engine.optimizer().type_name(), " (", state_names(needed), ")",
               m.optimizer.empty() ? " (a weights-only checkpoint starts a run with --init, not --resume)" : "");
  engine.load_optimizer_state(
      [&](int u, const std::string& tensor, size_t begin, size_t count, float* out) {
        throw_if_interrupted();
        reader.read(u, tensor, begin, count, DType::f32, out);
      },
      m.optimizer_steps);
}

void resume_progress(const TrainerState& state, LrSchedule& schedule, zero::LossScaler* scaler, int64_t& skipped_steps) {
  schedule.set_advances(state.lr_advances);
  if (scaler) scaler->set_state(state.loss_scaler);
  skipped_steps = state.skipped_steps;
}

}  // namespace zerone::train
