// Per-step metrics: the JSONL file of DESIGN §4 and the terminal progress display.
//
// JSONL: one object per optimizer step, {"step","loss","lr","grad_norm","ms","tokens_per_s",
// "mem":{"<place>.<category>":bytes,...,"peak_rss":bytes}} plus "val_loss" on validation steps.
// Classifiers write "samples_per_s" in place of "tokens_per_s", and "val_accuracy" (a fraction)
// beside "val_loss" (at each epoch end and the last step). Every line also has "timestamp" (Unix
// seconds at the step's end), "elapsed_s" (seconds since `zerone train` started, start-up
// included), "tokens" (classifiers: "samples") trained on so far, resumed steps included, and, for
// models whose FLOPs are known (the transformers), "tflop_per_s" (model FLOPs of the step over its
// wall time, all ranks) and "mfu" (that over world x the per-rank peak). The first line a process
// writes carries "run": the settings, machine and peak (docs/metrics.md lists every field).
// Note [Metrics never cost a run]: each line is written whole with write(2) as soon as its step
// ends, so a crashed run keeps every finished step. The path is checked at start-up but the file
// is created (truncated) only by the first line, so a run that fails before its first step leaves
// an existing file alone. A failed write (disk full, EIO) is a warning, not an error: the partial
// line is cut off again and training goes on to its checkpoint; a later line that succeeds says so.
// Progress: on a terminal, one status line rewritten in place; otherwise (a file, a pipe, or any
// rank under an MPI launcher, whose stdout Open MPI makes a pty even when it goes to a file) plain
// log lines.
// Thread-safety: one thread; end_status_line() may be called from any thread before exit.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zerone/core/memory.h"

namespace zerone::train {

struct StepRecord {
  int step = 0;
  int total_steps = 0;
  float loss = 0.0f;
  float lr = 0.0f;
  float grad_norm = 0.0f;
  double ms = 0.0;
  double tokens_per_s = 0.0;
  std::optional<double> samples_per_s;  // classifiers, in place of tokens_per_s
  std::optional<float> val_loss;
  std::optional<float> val_accuracy;
  std::optional<double> loss_scale;  // fp16: the scale this step's backward used
  bool skipped = false;              // fp16: gradients overflowed, no update
  double timestamp_s = 0.0;          // Unix time at the end of the step
  double elapsed_s = 0.0;            // since `zerone train` started (start-up included)
  int64_t seen = 0;                  // tokens (classifiers: samples) trained on so far, resumed steps included
  std::optional<double> tflop_per_s; // model FLOPs of the step / its wall time, summed over ranks
  std::optional<double> mfu;         // tflop_per_s / (world x peak TFLOP/s per rank), a fraction
  // World > 1: bytes this rank's collectives sent during the step, to peers on its own host and
  // on other hosts (Note [Counting traffic] in comm/traffic.h).
  std::optional<uint64_t> comm_bytes_intra, comm_bytes_inter;
};

class MetricsWriter {
 public:
  // Start-up check of a metrics path (Error naming --metrics otherwise): a regular file or a
  // character device (/dev/null), or a new file in an existing writable directory; never a
  // directory, a named pipe (opening it would block) or a socket.
  static void check_path(const std::string& path);
  // Empty path: writes nothing. Runs check_path; creates nothing yet (see the Note).
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // Writes one line, whole or not at all. Returns a warning for the user when a write fails (the
  // first of a series) or succeeds again after failures; nullopt otherwise.
  std::optional<std::string> write(const StepRecord& record);
  // A resumed run (--resume from step `step`): the first write keeps the existing file's lines of
  // steps 1..step (a crashed run may have written lines past its last checkpoint, which the
  // resumed run writes again), drops the rest, and appends. A file that is not JSON lines is
  // replaced as for a new run.
  void continue_after(int64_t step) { continue_after_ = step; }
  // The "run" object (settings, machine, peak) that the first line this writer writes carries.
  void set_run_info(nlohmann::ordered_json info) { run_info_ = std::move(info); }
  // Steps whose line could not be written.
  int missing_lines() const { return missing_lines_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  bool regular_ = false;     // a regular file (cut back on failure), not a device
  int64_t good_bytes_ = 0;   // length of the complete lines written
  int missing_lines_ = 0;
  int failing_since_ = 0;    // first step of the current series of failures; 0: writes succeed
  int64_t continue_after_ = -1;  // >= 0: keep lines of steps up to this one (resume)
  nlohmann::ordered_json run_info_;  // null once written
};

// The end-of-run summary (rank 0): what the run did, how fast, where its time and memory went
// and what it wrote. The trainer adds every step's record and fills the rest at the end.
class RunSummary {
 public:
  void add(const StepRecord& record);
  bool empty() const { return steps_ == 0; }

  // Filled by the trainer before lines():
  bool classifier = false;               // counts samples, not tokens
  double wall_s = 0.0;                   // `zerone train` from start to end
  std::optional<double> peak_tflop_per_s;  // per rank
  std::string peak_source;               // "--peak-tflops" or "measured ..."
  int world = 1;
  // Where the time of steps 2.. went (Profiler categories), over profiled_wall_s of steps. Where
  // the device's kernels run asynchronously (a GPU's), compute_s is not measured and the summary
  // counts the remainder as the device's compute (Note [Exposed time], core/profiler.h), unless
  // --profile itemized it (Note [Device compute itemized]): then compute_s is the device's, and
  // the remainder, named remainder_name, the GPU's idle between operations.
  double profiled_wall_s = 0.0, compute_s = 0.0, comm_s = 0.0, optimizer_s = 0.0, transfer_s = 0.0, io_s = 0.0;
  int profiled_steps = 0;
  bool compute_is_remainder = false;
  std::string remainder_name = "other";  // what the rest is, when compute_s is measured
  double optimizer_hidden_share = 0.0;  // of the optimizer's work, what overlap hid (Profiler::hidden_share)
  // Peak bytes per (place, category) on rank 0, and zerone estimate's figures per place.
  struct PlacePeak {
    std::string place;
    int64_t peak_bytes = 0;                  // the sum of the categories' peaks (an upper bound of the place's peak)
    std::optional<int64_t> estimate_bytes;   // zerone estimate's figure for this place
    std::vector<std::pair<std::string, int64_t>> categories;  // nonzero peaks
  };
  std::vector<PlacePeak> memory;
  int64_t peak_rss_bytes = 0;
  std::vector<std::string> written;      // "metrics 'm.jsonl' (300 lines)", ...

  // The summary as lines for the terminal, without trailing newlines.
  std::vector<std::string> lines() const;

 private:
  int steps_ = 0, first_step_ = 0, last_step_ = 0;
  double step_s_ = 0.0;                  // the steps' wall time
  int64_t seen_first_ = 0, seen_last_ = 0;  // before the first step of this process, after the last
  double model_tflop_ = 0.0;             // model TFLOPs of the steps with known FLOPs
  double flop_step_s_ = 0.0;             // their wall time
  float final_loss_ = 0.0f;
  std::optional<float> final_val_, best_val_, final_accuracy_;
  int best_val_step_ = 0;
  int skipped_ = 0;
};

using zerone::human_bytes;  // core/memory.h

class Progress {
 public:
  Progress();  // decides between the live line (stdout is a terminal) and log lines
  void step(const StepRecord& record);
  // On a terminal: a status line saying the first step is running, until its line replaces it
  // (a large model's first step takes seconds; the screen should not sit still).
  void starting(int step, int total_steps);
  // A line that must stay visible (validation, warnings, the summary).
  void message(const std::string& text);
  // "zerone: warning: <text>" on stderr, after ending the status line.
  void warning(const std::string& text);
  void finish();

 private:
  bool live_;
  double elapsed_s_ = 0.0;
};

// Ends the live status line, if one is open, so that what is printed next (an error) starts on a
// line of its own. Safe to call at any time.
void end_status_line();

}  // namespace zerone::train
