#include "zerone/train/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "zerone/core/error.h"
#include "zerone/core/memory.h"

namespace zerone::train {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "w");
  ZERONE_CHECK(file_ != nullptr, "--metrics: cannot create '", path, "': ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

namespace {

// The "mem" object of a metrics line, from the global ledger and peak RSS.
nlohmann::ordered_json memory_object() {
  nlohmann::ordered_json mem = nlohmann::ordered_json::object();
  const MemoryLedger& ledger = MemoryLedger::global();
  for (size_t p = 0; p < MemoryLedger::kPlaces; ++p) {
    for (size_t c = 0; c < MemoryLedger::kCategories; ++c) {
      auto place = static_cast<MemPlace>(p);
      auto category = static_cast<MemCategory>(c);
      int64_t bytes = ledger.current(place, category);
      if (bytes != 0) mem[str_cat(mem_place_name(place), ".", mem_category_name(category))] = bytes;
    }
  }
  mem["peak_rss"] = peak_rss_bytes();
  return mem;
}

}  // namespace

void MetricsWriter::write(const StepRecord& r) {
  if (file_ == nullptr) return;
  nlohmann::ordered_json line;
  line["step"] = r.step;
  line["loss"] = r.loss;
  line["lr"] = r.lr;
  line["grad_norm"] = r.grad_norm;
  line["ms"] = r.ms;
  line["tokens_per_s"] = r.tokens_per_s;
  line["mem"] = memory_object();
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  if (r.loss_scale) line["loss_scale"] = *r.loss_scale;
  if (r.skipped) line["skipped"] = true;
  std::string text = line.dump() + "\n";
  ZERONE_CHECK(std::fputs(text.c_str(), file_) >= 0 && std::fflush(file_) == 0, "--metrics: write to '", path_,
               "' failed: ", std::strerror(errno));
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

Progress::Progress() : live_(::isatty(STDOUT_FILENO) == 1) {}

void Progress::step(const StepRecord& r) {
  elapsed_s_ += r.ms / 1000.0;
  double eta_s = r.step > 0 ? elapsed_s_ / r.step * (r.total_steps - r.step) : 0.0;
  int eta = static_cast<int>(std::lround(eta_s));
  char line[320];
  std::snprintf(line, sizeof line, "step %*d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f ms | %.0f tok/s | ETA %dm%02ds | mem %s%s",
                static_cast<int>(std::to_string(r.total_steps).size()), r.step, r.total_steps, r.loss, r.lr,
                r.grad_norm, r.ms, r.tokens_per_s, eta / 60, eta % 60,
                human_bytes(static_cast<double>(MemoryLedger::global().current_total(MemPlace::host))).c_str(),
                r.skipped ? str_cat(" | overflow: step skipped, loss scale ", *r.loss_scale).c_str()
                          : (r.loss_scale ? str_cat(" | scale ", *r.loss_scale).c_str() : ""));
  if (live_) {
    std::printf("\r\033[K%s", line);
    line_open_ = true;
    std::fflush(stdout);
  } else {
    // Log lines: every step for short runs, about 50 lines for long ones, always the last.
    int every = std::max(1, r.total_steps / 50);
    if (r.step % every == 0 || r.step == r.total_steps || r.step == 1) {
      std::printf("%s\n", line);
      std::fflush(stdout);
    }
  }
}

void Progress::message(const std::string& text) {
  if (line_open_) {
    std::printf("\n");
    line_open_ = false;
  }
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void Progress::finish() {
  if (line_open_) std::printf("\n");
  line_open_ = false;
  std::fflush(stdout);
}

}  // namespace zerone::train
