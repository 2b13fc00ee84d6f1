#include "zerone/train/metrics.h"

#include <fcntl.h>
#include <libgen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "zerone/comm/communicator.h"
#include "zerone/core/error.h"
#include "zerone/core/memory.h"

namespace zerone::train {

namespace {

// Whether the live status line is open (Note [Metrics never cost a run]); global so that the
// top-level error printer can end it.
std::atomic<bool> g_status_line_open{false};

}  // namespace

void end_status_line() {
  if (g_status_line_open.exchange(false)) {
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }
}

void MetricsWriter::check_path(const std::string& path) {
  ZERONE_CHECK(path.back() != '/', "--metrics '", path, "' names a directory, expected a file path");
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    // Written in place (not renamed over), so a symlink would write through to its target.
    ZERONE_CHECK(S_ISREG(st.st_mode) || S_ISCHR(st.st_mode), "--metrics '", path, "' is ",
                 S_ISDIR(st.st_mode)    ? "a directory"
                 : S_ISFIFO(st.st_mode) ? "a named pipe"
                 : S_ISLNK(st.st_mode)  ? "a symbolic link"
                                        : "not a regular file",
                 ", expected a regular file (or a character device such as /dev/null) to write JSON lines to");
    ZERONE_CHECK(::access(path.c_str(), W_OK) == 0, "--metrics '", path, "' is not writable: ", std::strerror(errno));
    return;
  }
  ZERONE_CHECK(errno == ENOENT, "--metrics: cannot use '", path, "': ", std::strerror(errno));
  std::string copy = path;
  const std::string dir = ::dirname(copy.data());
  ZERONE_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "--metrics: directory '", dir, "' of '", path,
               "' does not exist: create it first");
  // Probe: create and remove the file, so that a name the filesystem refuses (/proc, too long) fails now.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  ZERONE_CHECK(fd >= 0, "--metrics: cannot create '", path, "': ", std::strerror(errno));
  ::close(fd);
  ::unlink(path.c_str());
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (!path.empty()) check_path(path);
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
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

std::optional<std::string> MetricsWriter::write(const StepRecord& r) {
  if (path_.empty()) return std::nullopt;
  nlohmann::ordered_json line;
  line["step"] = r.step;
  line["loss"] = r.loss;
  line["lr"] = r.lr;
  line["grad_norm"] = r.grad_norm;
  line["ms"] = r.ms;
  if (r.samples_per_s) line["samples_per_s"] = *r.samples_per_s;
  else line["tokens_per_s"] = r.tokens_per_s;
  line["mem"] = memory_object();
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  if (r.val_accuracy) line["val_accuracy"] = *r.val_accuracy;
  if (r.loss_scale) line["loss_scale"] = *r.loss_scale;
  if (r.skipped) line["skipped"] = true;
  line["timestamp"] = std::round(r.timestamp_s * 1000.0) / 1000.0;
  line["elapsed_s"] = std::round(r.elapsed_s * 1000.0) / 1000.0;
  line[r.samples_per_s ? "samples" : "tokens"] = r.seen;
  if (r.tflop_per_s) line["tflop_per_s"] = *r.tflop_per_s;
  if (r.mfu) line["mfu"] = *r.mfu;
  if (r.comm_bytes_intra && r.comm_bytes_inter) {
    line["comm_bytes"] = *r.comm_bytes_intra + *r.comm_bytes_inter;
    line["comm_bytes_intra"] = *r.comm_bytes_intra;
    line["comm_bytes_inter"] = *r.comm_bytes_inter;
  }
  if (!run_info_.is_null()) line["run"] = run_info_;
  const std::string text = line.dump() + "\n";

  int err = 0;
  if (fd_ < 0) {
    const int trunc = continue_after_ >= 0 ? 0 : O_TRUNC;
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | trunc | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd_ < 0) {
      err = errno;
    } else {
      struct stat st;
      regular_ = ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
      if (regular_ && continue_after_ >= 0) {
        // Keep the whole lines of steps <= continue_after_ (resume); stop at the first other line.
        std::string old(static_cast<size_t>(st.st_size), '\0');
        ssize_t got = ::pread(fd_, old.data(), old.size(), 0);
        size_t keep = 0;
        for (size_t pos = 0; got > 0 && pos < static_cast<size_t>(got);) {
          size_t nl = old.find('\n', pos);
          if (nl == std::string::npos || nl >= static_cast<size_t>(got)) break;
          auto j = nlohmann::json::parse(old.begin() + static_cast<std::ptrdiff_t>(pos),
                                         old.begin() + static_cast<std::ptrdiff_t>(nl), nullptr, false);
          if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
              j["step"].get<int64_t>() > continue_after_)
            break;
          keep = pos = nl + 1;
        }
        if (::ftruncate(fd_, static_cast<off_t>(keep)) != 0 || ::lseek(fd_, static_cast<off_t>(keep), SEEK_SET) < 0)
          err = errno;
        good_bytes_ = static_cast<int64_t>(keep);
      }
    }
  }
  size_t done = 0;
  while (err == 0 && done < text.size()) {
    ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) err = n < 0 ? errno : ENOSPC;
    else done += static_cast<size_t>(n);
  }
  if (err == 0) {
    good_bytes_ += static_cast<int64_t>(text.size());
    run_info_ = nullptr;
    if (failing_since_ == 0) return std::nullopt;
    std::string note = str_cat("--metrics: writing to '", path_, "' works again from step ", r.step, "; steps ",
                               failing_since_, "..", r.step - 1, " have no line");
    failing_since_ = 0;
    return note;
  }
  // Cut a partial line off again, so the file holds whole lines only.
  if (fd_ >= 0 && regular_ && done > 0) {
    if (::ftruncate(fd_, good_bytes_) != 0 || ::lseek(fd_, good_bytes_, SEEK_SET) < 0) regular_ = false;
  }
  ++missing_lines_;
  if (failing_since_ != 0) return std::nullopt;
  failing_since_ = r.step;
  return str_cat("--metrics: cannot write step ", r.step, " to '", path_, "': ", std::strerror(err),
                 "; training goes on (lines are retried each step)");
}

Progress::Progress() : live_(::isatty(STDOUT_FILENO) == 1 && !comm::launched_by_mpi()) {}

void Progress::step(const StepRecord& r) {
  elapsed_s_ += r.ms / 1000.0;
  double eta_s = r.step > 0 ? elapsed_s_ / r.step * (r.total_steps - r.step) : 0.0;
  int eta = static_cast<int>(std::lround(eta_s));
  char line[400];
  const std::string val = r.val_accuracy ? str_cat(" | val loss ", r.val_loss.value_or(0.0f), " acc ", *r.val_accuracy * 100.0f, "%")
                                         : "";
  std::snprintf(line, sizeof line, "step %*d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f ms | %.0f %s | ETA %dm%02ds | mem %s%s%s",
                static_cast<int>(std::to_string(r.total_steps).size()), r.step, r.total_steps, r.loss, r.lr,
                r.grad_norm, r.ms, r.samples_per_s.value_or(r.tokens_per_s), r.samples_per_s ? "samples/s" : "tok/s",
                eta / 60, eta % 60,
                // In memory: device + host (this CPU build's device is host memory); nvme is on disk.
                human_bytes(static_cast<double>(MemoryLedger::global().current_total(MemPlace::device) +
                                                MemoryLedger::global().current_total(MemPlace::host))).c_str(),
                r.skipped ? str_cat(" | overflow: step skipped, loss scale ", *r.loss_scale).c_str()
                          : (r.loss_scale ? str_cat(" | scale ", *r.loss_scale).c_str() : ""),
                val.c_str());
  if (live_) {
    std::printf("\r\033[K%s", line);
    g_status_line_open = true;
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

void Progress::starting(int step, int total_steps) {
  if (!live_) return;
  std::printf("\r\033[Kstep %d/%d: running (the first step also prepares the kernels) ...", step, total_steps);
  g_status_line_open = true;
  std::fflush(stdout);
}

void Progress::message(const std::string& text) {
  end_status_line();
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void Progress::warning(const std::string& text) {
  end_status_line();
  std::fflush(stdout);
  std::fprintf(stderr, "zerone: warning: %s\n", text.c_str());
  std::fflush(stderr);
}

void Progress::finish() { end_status_line(); }

void RunSummary::add(const StepRecord& r) {
  const int64_t step_seen = r.ms > 0.0 ? static_cast<int64_t>(std::llround(r.samples_per_s.value_or(r.tokens_per_s) * r.ms / 1000.0)) : 0;
  if (steps_ == 0) {
    first_step_ = r.step;
    seen_first_ = r.seen - step_seen;
  }
  ++steps_;
  last_step_ = r.step;
  seen_last_ = r.seen;
  step_s_ += r.ms / 1000.0;
  if (r.tflop_per_s) {
    model_tflop_ += *r.tflop_per_s * r.ms / 1000.0;
    flop_step_s_ += r.ms / 1000.0;
  }
  final_loss_ = r.loss;
  if (r.val_loss) {
    final_val_ = r.val_loss;
    if (!best_val_ || *r.val_loss < *best_val_) {
      best_val_ = r.val_loss;
      best_val_step_ = r.step;
    }
  }
  if (r.val_accuracy) final_accuracy_ = r.val_accuracy;
  if (r.skipped) ++skipped_;
}

namespace {

// "4.92M" style counts for tokens and samples.
std::string human_count(double n) {
  char text[32];
  if (n >= 1e9) std::snprintf(text, sizeof text, "%.2fG", n / 1e9);
  else if (n >= 1e6) std::snprintf(text, sizeof text, "%.2fM", n / 1e6);
  else if (n >= 1e4) std::snprintf(text, sizeof text, "%.1fk", n / 1e3);
  else std::snprintf(text, sizeof text, "%.0f", n);
  return text;
}

std::string fixed_digits(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

}  // namespace

std::vector<std::string> RunSummary::lines() const {
  std::vector<std::string> out;
  if (steps_ == 0) return out;
  const char* unit = classifier ? "samples" : "tokens";
  const double seen = static_cast<double>(seen_last_ - seen_first_);
  std::string head = str_cat("summary: ", steps_, steps_ == 1 ? " step" : " steps",
                             first_step_ > 1 ? str_cat(" (", first_step_, "..", last_step_, ", resumed)") : "", " in ",
                             fixed_digits(step_s_, step_s_ < 10 ? 2 : 1), " s of ", fixed_digits(wall_s, wall_s < 10 ? 2 : 1), " s (start-up, validation and saving ",
                             fixed_digits(std::max(0.0, wall_s - step_s_), 1), " s); ", human_count(seen), " ", unit, ", ",
                             human_count(step_s_ > 0 ? seen / step_s_ : 0.0), " ", unit, "/s on average");
  if (flop_step_s_ > 0) {
    const double tflops = model_tflop_ / flop_step_s_;
    head += str_cat(", ", fixed_digits(tflops, 3), " TFLOP/s");
    if (peak_tflop_per_s && *peak_tflop_per_s > 0)
      head += str_cat(" (MFU ", fixed_digits(100.0 * tflops / (world * *peak_tflop_per_s), 1), "% of ", world > 1 ? str_cat(world, " x ") : "",
                      fixed_digits(*peak_tflop_per_s, 3), " TFLOP/s, ", peak_source, ")");
  }
  out.push_back(head);
  std::string loss = str_cat("  loss: final training ", fixed_digits(final_loss_, 4));
  if (final_val_) loss += str_cat(", final validation ", fixed_digits(*final_val_, 4), ", best validation ",
                                  fixed_digits(*best_val_, 4), " (step ", best_val_step_, ")");
  if (final_accuracy_) loss += str_cat(", final validation accuracy ", fixed_digits(*final_accuracy_ * 100.0, 2), "%");
  if (skipped_ > 0) loss += str_cat("; ", skipped_, " steps skipped (fp16 overflow)");
  out.push_back(loss);
  if (profiled_steps > 0 && profiled_wall_s > 0) {
    auto pct = [&](double s) { return fixed_digits(100.0 * s / profiled_wall_s, 1) + "%"; };
    const double waits_s = comm_s + optimizer_s + transfer_s + io_s;
    const double rest_s = std::max(0.0, profiled_wall_s - (compute_is_remainder ? 0.0 : compute_s) - waits_s);
    const std::string compute = compute_is_remainder
                                    ? str_cat("device compute and launches ", pct(rest_s), " (the rest: its kernels run asynchronously)")
                                    : str_cat("compute ", pct(compute_s));
    out.push_back(str_cat("  time of steps 2..", last_step_, ": ", compute, ", communication (exposed) ", pct(comm_s),
                          ", optimizer ", pct(optimizer_s),
                          optimizer_hidden_share >= 0.0005
                              ? str_cat(" (", fixed_digits(100.0 * optimizer_hidden_share, 1), "% of its work hidden)")
                              : "",
                          ", transfers (exposed) ", pct(transfer_s),
                          ", I/O (data, swap) ", pct(io_s), compute_is_remainder ? "" : str_cat(", ", remainder_name, " ", pct(rest_s)),
                          " (", fixed_digits(1000.0 * profiled_wall_s / profiled_steps, 1), " ms/step; --profile itemizes)"));
  }
  for (const PlacePeak& p : memory) {
    std::string text = str_cat("  peak memory, ", p.place, ": ", human_bytes(static_cast<double>(p.peak_bytes)));
    if (p.estimate_bytes) text += str_cat(" (zerone estimate ", human_bytes(static_cast<double>(*p.estimate_bytes)), ")");
    std::string parts;
    for (const auto& [category, bytes] : p.categories)
      parts += str_cat(parts.empty() ? "" : ", ", category, " ", human_bytes(static_cast<double>(bytes)));
    if (!parts.empty()) text += str_cat(": ", parts);
    out.push_back(text);
  }
  if (peak_rss_bytes > 0) out.push_back(str_cat("  peak RSS (rank 0 process): ", human_bytes(static_cast<double>(peak_rss_bytes))));
  if (!written.empty()) {
    std::string list;
    for (const std::string& w : written) list += str_cat(list.empty() ? "" : "; ", w);
    out.push_back(str_cat("  wrote: ", list));
  }
  return out;
}

}  // namespace zerone::train
