// Per-step metrics: the JSONL file of DESIGN §4 and the terminal progress display.
//
// JSONL: one object per optimizer step, {"step","loss","lr","grad_norm","ms","tokens_per_s",
// "mem":{"<place>.<category>":bytes,...,"peak_rss":bytes}} plus "val_loss" on validation steps.
// Lines are flushed as written so a crashed run keeps every finished step.
// Progress: on a terminal, one status line rewritten in place; otherwise plain log lines.
// Thread-safety: one thread.
#pragma once

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
  std::optional<float> val_loss;
  std::optional<double> loss_scale;  // fp16: the scale this step's backward used
  bool skipped = false;              // fp16: gradients overflowed, no update
};

class MetricsWriter {
 public:
  // Empty path: writes nothing. Throws Error if the file cannot be created.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const StepRecord& record);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

// Bytes as "12.3 MiB".
std::string human_bytes(double bytes);

class Progress {
 public:
  Progress();  // decides between the live line (stdout is a terminal) and log lines
  void step(const StepRecord& record);
  // A line that must stay visible (validation, warnings, the summary).
  void message(const std::string& text);
  void finish();

 private:
  bool live_;
  bool line_open_ = false;
  double elapsed_s_ = 0.0;
};

}  // namespace zerone::train
