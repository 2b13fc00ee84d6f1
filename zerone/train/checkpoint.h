// Checkpointing a training run: when and how the trainer saves (--checkpoint-dir, --checkpoint-every,
// --keep-last, --checkpoint-async) and what it restores on --resume. The format and the atomic
// directory protocol are zerone/io/sharded_checkpoint.h; what the engine contributes is Note
// [Checkpoint state] in zerone/zero/engine.h; the trainer adds its own state (TrainerState).
//
// Note [Saving a step]: a save is collective. Rank 0 creates ROOT/.tmp-step-N/; every rank writes
// rank-r.bin there (its partition of every tensor, engine.save_state) and fsyncs it; the ranks'
// file descriptions (sizes, checksums, pieces) are all-gathered to rank 0, which writes manifest.json
// and publishes the directory (Note [Atomic checkpoints]). With --checkpoint-async the step stalls
// only while the engine's pieces are copied into a host staging buffer; a background thread per
// rank writes the file, and the manifest is published at the first step boundary where every
// rank's thread is done (agreed on the loss all-reduce, so every rank does the collective part at
// the same step), or before the next save, or at the end of the run, whichever comes first. The
// staging buffers (the rank's checkpoint bytes, host memory) are kept between saves, as PyTorch's
// async save keeps its pinned staging, so a save stalls for a memcpy, not for page faults.
//
// Note [Resume]: the newest complete checkpoint is found through `latest` (find_resume_checkpoint).
// Parameters are read unit by unit as the engine materializes them; the optimizer state is read
// straight into this rank's shards (resume_optimizer; another world size, stage or offload reads
// the overlapping pieces), so memory while loading is one unit plus the rank's own state. The
// trainer state (resume_trainer_state) holds the data position in samples (consumed_samples,
// Note [Samples] in batch_source.h), the schedule's position and the loss scaler, so a run resumed
// at any world size, micro-batch and accumulation with the same global batch (micro-batch x
// accumulation x world) reads exactly the samples the uninterrupted run would and continues its
// trajectory (to the order of the gradient sums). Another global batch is a notice and trains on.
//
// Note [Resume position]: the position is a sample index of the endless stream, so it carries to
// another split unchanged. Two changes move it: another --seq (a token source's samples are
// --seq+1 tokens at multiples of --seq) and another epoch length (image data drops the remainder
// of floor(N / global batch) steps; other --data). Then the position is kept within its epoch in
// tokens (or images): epochs done x this run's samples per epoch + the same text offset rounded up
// to a whole sample, with a notice. A shuffled epoch is a permutation of samples of one length, so
// with another --seq the rest of that epoch is drawn anew (the notice says so); a --seq change
// also changes the global batch in tokens. Checkpoints written before positions were counted in
// samples hold "next_chunk", a global micro-batch index: it is next_chunk x their micro-batch
// samples, the same samples at any split in file order within the first epoch; beyond it, or
// shuffled, their chunk order cannot be continued (a notice), and another --seq is an error.
//
// Note [Settings a resume compares]: the manifest records every setting of the table marked
// changes_results (train/settings.h, result_settings), as the run that saved it resolved them. A
// resume names each one whose value differs in one notice line (old and new value) and trains on,
// except those handled on their own: the model and precision (errors, check_checkpoint_fits), the
// optimizer (its state must match, resume_optimizer), --init (not read on resume), --seed and
// --no-shuffle (errors: the data order and dropout keys), --micro-batch, --grad-accum and
// --train-batch-size (the global batch notice), --seq (Note [Resume position]) and --steps and
// --epochs (the run's length; a notice when the learning-rate schedule decays over --steps).
//
// Thread-safety: a Checkpointer belongs to the training thread; its writer thread touches only the
// staging buffers and the file.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "zerone/comm/communicator.h"
#include "zerone/io/fault_env.h"
#include "zerone/core/memory.h"
#include "zerone/io/sharded_checkpoint.h"
#include "zerone/train/batch_source.h"
#include "zerone/train/config.h"
#include "zerone/train/lr_schedule.h"
#include "zerone/zero/engine.h"
#include "zerone/zero/loss_scaler.h"

namespace zerone::train {

// The trainer's part of a checkpoint (manifest "trainer").
struct TrainerState {
  int64_t step = 0;                // optimizer steps completed
  uint64_t consumed_samples = 0;   // the stream position the next step starts at (Note [Samples])
  uint64_t epoch_samples = 0;      // samples per epoch of the run that saved (0: not recorded)
  bool position_in_chunks = false; // read from an older checkpoint's "next_chunk" (Note [Resume position])
  int micro_batch = 0, seq = 0, grad_accum = 0, world_size = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t lr_advances = 0;   // LrSchedule position
  zero::LossScaler::State loss_scaler;
  int64_t skipped_steps = 0; // fp16 overflows so far
  // (key, value) of every changes_results setting (Note [Settings a resume compares]); empty in
  // checkpoints written before they were recorded.
  std::vector<std::pair<std::string, std::string>> settings;
};
nlohmann::json trainer_state_to_json(const TrainerState& state);
// Throws Error naming `what` for a missing or mistyped key.
TrainerState trainer_state_from_json(const nlohmann::json& json, const std::string& what);

// What the manifest records of the run besides the tensors.
struct CheckpointRunInfo {
  std::string model_spec;
  DType dtype = DType::f32;
  int zero_stage = 0;
  std::string offload_optimizer = "none", offload_param = "none";
  std::vector<io::CheckpointUnit> units;
};

class Checkpointer {
 public:
  // `env`: the test hooks (Note [Crash points]); it must outlive the Checkpointer.
  Checkpointer(std::string root, int keep_last, bool async, CheckpointRunInfo info, comm::Communicator& comm,
               const io::FaultEnv& env = io::FaultEnv::none());
  // Waits for a background write (its error, if any, is lost: the destructor runs during unwinding).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Saves the state after `state.step` (collective). Synchronous: returns when the checkpoint is
  // published. Async: returns once the state is staged (after publishing a previous save that was
  // still pending). Throws Error naming the file for an I/O failure (the previous checkpoint stays).
  void save(zero::ZeroEngine& engine, const TrainerState& state);
  // Async: whether this rank's background write has finished (true when none is pending). The
  // trainer sums this over ranks with the loss and calls publish_pending() when all are done.
  bool pending() const { return pending_ != nullptr; }
  bool writer_done() const;
  // Collective: waits for this rank's write and publishes the pending checkpoint. No-op when none.
  void publish_pending();
  // The step of the newest checkpoint this run published (0: none).
  int64_t last_published_step() const { return last_published_; }
  // Seconds the training thread spent in save() for the last save (the stall), and the bytes and
  // seconds of this rank's last file write.
  double last_stall_s() const { return last_stall_s_; }
  // The last published checkpoint: bytes of all ranks' files (rank 0 only; 0 elsewhere), and the
  // seconds this rank spent writing and fsyncing its file.
  uint64_t last_bytes() const { return last_bytes_; }
  // Bytes of this rank's last save that were copied disk to disk (NVMe-resident optimizer state).
  uint64_t last_copied_bytes() const { return last_copied_bytes_; }
  double last_write_s() const { return last_write_s_; }

 private:
  struct Pending;
  void finish(Pending& p);

  std::string root_;
  int keep_last_;
  bool async_;
  CheckpointRunInfo info_;
  comm::Communicator& comm_;
  const io::FaultEnv& env_;
  std::unique_ptr<Pending> pending_;
  std::vector<Buffer> staging_;  // async: host copies of this rank's pieces (kept between saves)
  int64_t last_published_ = 0;
  double last_stall_s_ = 0.0;
  uint64_t last_bytes_ = 0;
  uint64_t last_copied_bytes_ = 0;
  double last_write_s_ = 0.0;
};

// Checks a checkpoint opened for --resume (or, `weights_only`, --init of a zerone checkpoint, whose
// parameters convert to any precision) against the run's model and precision. Throws Error naming
// the checkpoint and what differs (another model, precision or unit layout), before anything is loaded.
void check_checkpoint_fits(const io::CheckpointReader& reader, const nn::Model& model, DType dtype,
                           bool weights_only = false);
// Throws Error when the checkpoint --resume found holds weights only (zerone convert --to zerone):
// it has no optimizer or trainer state to continue, and --init takes it.
void check_resumable(const io::CheckpointReader& reader);

// --resume: the newest complete checkpoint in cfg.checkpoint_dir, opened and checked to hold a run,
// or nullptr when none is there yet (the run starts at step 1). `lead` prints the notices (a
// skipped damaged checkpoint, nothing found, --init not read). Throws Error for a damaged pointer
// or a weights-only checkpoint.
std::unique_ptr<io::CheckpointReader> find_resume_checkpoint(const TrainConfig& cfg, bool lead);

// The trainer state of the checkpoint, checked against this run (`cfg` resolved, `world` ranks,
// its training `source`, which decides the samples per epoch), with consumed_samples moved to this
// run's stream position (Note [Resume position]). Prints (lead) one notice per change: the global
// batch, --seq, every result setting (Note [Settings a resume compares]). Throws Error naming the
// checkpoint for a damaged state or a change that cannot work (another --seed or data order).
TrainerState resume_trainer_state(const io::CheckpointReader& reader, const TrainConfig& cfg, int world,
                                  const BatchSource& source, bool lead);

// Reads this rank's optimizer state from the checkpoint into the engine (collective only in what
// the engine does). Throws Error naming the checkpoint when it holds another optimizer's state.
void resume_optimizer(io::CheckpointReader& reader, zero::ZeroEngine& engine);

// The schedule's position, the fp16 loss scaler (when `scaler` is not null) and the overflow count
// of `state` into the run's objects.
void resume_progress(const TrainerState& state, LrSchedule& schedule, zero::LossScaler* scaler, int64_t& skipped_steps);

}  // namespace zerone::train
