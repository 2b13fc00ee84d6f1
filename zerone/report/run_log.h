// A training run's metrics JSONL file (train/metrics.h, docs/metrics.md), read for `zerone report`.
//
// Failure: read_run_log throws Error naming the file (and line) when it cannot be opened, holds no
// step, or holds a line that is not a metrics object ({"step": integer, "loss": number, ...}).
// A last line without its newline that does not parse is a run still being written: it is left
// out and counted in `partial_lines`.
// Thread-safety: plain values.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zerone::report {

struct RunLog {
  std::string path;
  std::string name;                     // legend name: the file name without ".jsonl"
  nlohmann::json run;                   // the first "run" object (settings, machine); null if none
  std::vector<nlohmann::json> steps;    // one object per line, in file order
  int partial_lines = 0;
  bool classifier() const;              // counts samples, not tokens
};

RunLog read_run_log(const std::string& path);

// Reads every path; names that would repeat get their directory prepended ("a/m", "b/m").
std::vector<RunLog> read_run_logs(const std::vector<std::string>& paths);

}  // namespace zerone::report
