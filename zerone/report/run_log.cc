#include "zerone/report/run_log.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "zerone/core/error.h"

namespace zerone::report {

bool RunLog::classifier() const {
  for (const nlohmann::json& s : steps) {
    if (s.contains("samples_per_s")) return true;
    if (s.contains("tokens_per_s")) return false;
  }
  return false;
}

RunLog read_run_log(const std::string& path) {
  struct stat st;
  ZERONE_CHECK(::stat(path.c_str(), &st) == 0, "cannot open metrics file '", path, "': ", std::strerror(errno));
  ZERONE_CHECK(!S_ISDIR(st.st_mode), "metrics file '", path, "' is a directory, expected a JSONL file written by zerone train --metrics");
  std::ifstream in(path, std::ios::binary);
  ZERONE_CHECK(in.good(), "cannot open metrics file '", path, "': ", std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  ZERONE_CHECK(!in.bad(), "cannot read metrics file '", path, "': ", std::strerror(errno));
  const std::string text = buffer.str();
  RunLog log;
  log.path = path;
  std::string base = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  if (base.size() > 6 && base.compare(base.size() - 6, 6, ".jsonl") == 0) base.resize(base.size() - 6);
  log.name = base;
  size_t pos = 0;
  int line_number = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    const bool complete = nl != std::string::npos;
    if (!complete) nl = text.size();
    ++line_number;
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() && !complete) {
      ++log.partial_lines;
      break;
    }
    ZERONE_CHECK(!j.is_discarded(), "metrics file '", path, "' line ", line_number, " is not JSON: '",
                 line.substr(0, 60), line.size() > 60 ? "...'" : "'", " (expected one JSON object per step, as zerone train --metrics writes)");
    ZERONE_CHECK(j.is_object() && j.contains("step") && j["step"].is_number_integer() && j.contains("loss") &&
                     j["loss"].is_number(),
                 "metrics file '", path, "' line ", line_number, " is not a metrics line: expected an object with an integer ",
                 "\"step\" and a number \"loss\"");
    if (log.run.is_null() && j.contains("run") && j["run"].is_object()) log.run = j["run"];
    log.steps.push_back(std::move(j));
  }
  ZERONE_CHECK(!log.steps.empty(), "metrics file '", path, "' holds no steps (an empty file: did the run write its first step?)");
  return log;
}

std::vector<RunLog> read_run_logs(const std::vector<std::string>& paths) {
  std::vector<RunLog> logs;
  std::map<std::string, int> count;
  for (const std::string& p : paths) {
    logs.push_back(read_run_log(p));
    ++count[logs.back().name];
  }
  for (RunLog& log : logs)
    if (count[log.name] > 1) log.name = log.path.size() > 6 && log.path.ends_with(".jsonl") ? log.path.substr(0, log.path.size() - 6) : log.path;
  return logs;
}

}  // namespace zerone::report
