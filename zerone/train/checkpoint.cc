#include "zerone/train/checkpoint.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include "zerone/core/error.h"
#include "zerone/nn/model.h"

namespace zerone::train {
namespace {

using nlohmann::json;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

json trainer_state_to_json(const TrainerState& s) {
  return {{"step", s.step},
          {"next_chunk", s.next_chunk},
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
          {"skipped_steps", s.skipped_steps}};
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
  // Every step reads at least one micro-batch chunk; 2^32 per step is beyond any global batch.
  constexpr int64_t kMaxChunksPerStep = int64_t{1} << 32;
  s.next_chunk = static_cast<uint64_t>(
      integer(j, "next_chunk", s.step, s.step * kMaxChunksPerStep, str_cat("step..step x 2^32 = ", s.step, "..",
                                                                         s.step * kMaxChunksPerStep)));
  s.micro_batch = static_cast<int>(integer(j, "micro_batch", 1, kIntMax, ">= 1"));
  s.seq = static_cast<int>(integer(j, "seq", 1, kIntMax, ">= 1"));
  s.grad_accum = static_cast<int>(integer(j, "grad_accum", 1, kIntMax, ">= 1"));
  s.world_size = static_cast<int>(integer(j, "world_size", 1, kIntMax, ">= 1"));
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

}  // namespace zerone::train
