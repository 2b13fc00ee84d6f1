// DeepSpeed's monitors for a training run (rank 0): `tensorboard` (event files, tensorboard.h) and
// `csv_monitor` (one CSV per metric), fed the same events as DeepSpeed's engine writes them: a
// (tag, value, x) triple per metric and step, x being the global samples trained on so far, tags
// "Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/loss_scale" (fp16), plus zerone's
// "Train/Samples/grad_norm" and "Train/Samples/val_loss" (validation steps).
//
// Note [CSV monitor layout]: as DeepSpeed's csvMonitor: DIR/<tag with '/' and ' ' as '_'>.csv,
// a header "step,<last part of the tag>", then "x,value" rows. A new run starts each file afresh;
// a resumed run keeps the rows with x up to where it resumes and appends (DeepSpeed appends to
// whatever is there). TensorBoard: one new event file per process in DIR (TensorBoard merges the
// files of a directory).
// Failure: the constructor creates the directories and throws Error naming the flag or config key
// when it cannot (Note [No late errors]); a write that fails later is a warning (Note [Metrics
// never cost a run] in train/metrics.h), returned by write().
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zerone/report/tensorboard.h"

namespace zerone::report {

struct MonitorEvent {
  std::string tag;
  double value = 0.0;
  int64_t samples = 0;  // the x axis: global samples so far
};

class Monitors {
 public:
  // Empty directories: that monitor is off. `resume_after_samples` >= 0: a resumed run (CSV rows
  // past it are dropped). `*_what`: the flag or config key, for messages.
  Monitors(const std::string& tensorboard_dir, const std::string& tensorboard_what, const std::string& csv_dir,
           const std::string& csv_what, int64_t resume_after_samples);
  ~Monitors();
  bool enabled() const { return tensorboard_ || !csv_dir_.empty(); }
  // Writes every event; returns a warning for the first failure of a series, nullopt otherwise.
  std::optional<std::string> write(const std::vector<MonitorEvent>& events, double wall_time_s);
  // "tensorboard 'DIR/events...' (N scalars)", "csv_monitor 'DIR' (K files)".
  std::vector<std::string> written() const;

 private:
  std::unique_ptr<EventFileWriter> tensorboard_;
  int64_t scalars_ = 0;
  std::string csv_dir_;
  int64_t resume_after_ = -1;
  std::map<std::string, bool> csv_started_;  // file -> header (or kept rows) in place
  bool failing_ = false;
};

// The CSV file name DeepSpeed gives a tag (Note [CSV monitor layout]).
std::string csv_file_name(const std::string& tag);

}  // namespace zerone::report
