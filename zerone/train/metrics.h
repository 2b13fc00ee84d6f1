// Per-step metrics: the JSONL file of DESIGN §4 and the terminal progress display.
//
// JSONL: one object per optimizer step, {"step","loss","lr","grad_norm","ms","tokens_per_s",
// "mem":{"<place>.<category>":bytes,...,"peak_rss":bytes}} plus "val_loss" on validation steps.
// Classifiers write "samples_per_s" in place of "tokens_per_s", and "val_accuracy" (a fraction)
// beside "val_loss" (at each epoch end and the last step).
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
};

// Bytes as "12.3 MiB".
std::string human_bytes(double bytes);

class Progress {
 public:
  Progress();  // decides between the live line (stdout is a terminal) and log lines
  void step(const StepRecord& record);
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
