#include "zerone/report/monitors.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "zerone/core/error.h"

namespace zerone::report {

namespace {

// mkdir -p; throws Error naming `what`.
void make_directories(const std::string& dir, const std::string& what) {
  ZERONE_CHECK(!dir.empty(), what, ": an empty directory");
  std::string partial;
  for (size_t pos = 0; pos != std::string::npos;) {
    const size_t next = dir.find('/', pos + 1);
    partial = dir.substr(0, next);
    pos = next;
    if (partial.empty() || partial == "/") continue;
    struct stat st;
    if (::stat(partial.c_str(), &st) == 0) {
      ZERONE_CHECK(S_ISDIR(st.st_mode), what, ": '", partial, "' is not a directory (it should hold '", dir, "')");
      continue;
    }
    ZERONE_CHECK(::mkdir(partial.c_str(), 0755) == 0 || errno == EEXIST, what, ": cannot create directory '", partial,
                 "': ", std::strerror(errno));
  }
}

std::string format_value(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.7g", v);  // the values are floats: 7 digits, 0.0001 not 0.000100000005
  return text;
}

}  // namespace

std::string csv_file_name(const std::string& tag) {
  std::string name = tag;
  for (char& c : name)
    if (c == '/' || c == ' ') c = '_';
  return name + ".csv";
}

Monitors::Monitors(const std::string& tensorboard_dir, const std::string& tensorboard_what, const std::string& csv_dir,
                   const std::string& csv_what, int64_t resume_after_samples)
    : csv_dir_(csv_dir), resume_after_(resume_after_samples) {
  if (!tensorboard_dir.empty()) {
    make_directories(tensorboard_dir, tensorboard_what);
    tensorboard_ = std::make_unique<EventFileWriter>(tensorboard_dir, tensorboard_what);
  }
  if (!csv_dir_.empty()) {
    make_directories(csv_dir_, csv_what);
    // Probe: a file can be created there (a read-only directory fails now, not at step 1).
    const std::string probe = csv_dir_ + "/.zerone-probe";
    std::FILE* f = std::fopen(probe.c_str(), "w");
    ZERONE_CHECK(f != nullptr, csv_what, ": cannot write into '", csv_dir_, "': ", std::strerror(errno));
    std::fclose(f);
    std::remove(probe.c_str());
  }
}

Monitors::~Monitors() = default;

std::optional<std::string> Monitors::write(const std::vector<MonitorEvent>& events, double wall_time_s) {
  int err = 0;
  std::string what;
  for (const MonitorEvent& e : events) {
    if (tensorboard_) {
      if (int r = tensorboard_->add_scalar(ScalarEvent{wall_time_s, e.samples, e.tag, static_cast<float>(e.value)}); r != 0) {
        err = r;
        what = tensorboard_->path();
      } else {
        ++scalars_;
      }
    }
    if (csv_dir_.empty()) continue;
    const std::string path = csv_dir_ + "/" + csv_file_name(e.tag);
    std::string prefix;
    if (!csv_started_[path]) {
      // Note [CSV monitor layout]: a resumed run keeps the rows up to where it resumes.
      std::string kept;
      if (resume_after_ >= 0) {
        std::ifstream in(path);
        std::string line;
        bool header = true;
        while (std::getline(in, line)) {
          if (header) {
            kept += line + "\n";
            header = false;
            continue;
          }
          char* end = nullptr;
          const long long x = std::strtoll(line.c_str(), &end, 10);
          if (end == line.c_str() || *end != ',' || x > resume_after_) break;
          kept += line + "\n";
        }
      }
      const std::string header = "step," + e.tag.substr(e.tag.find_last_of('/') == std::string::npos ? 0 : e.tag.find_last_of('/') + 1) + "\n";
      prefix = kept.empty() ? header : kept;
    }
    std::FILE* f = std::fopen(path.c_str(), prefix.empty() ? "a" : "w");
    bool ok = f != nullptr;
    const std::string row = prefix + std::to_string(e.samples) + "," + format_value(e.value) + "\n";
    if (ok) ok = std::fwrite(row.data(), 1, row.size(), f) == row.size();
    if (f) ok = std::fclose(f) == 0 && ok;
    if (!ok) {
      err = errno ? errno : EIO;
      what = path;
    } else {
      csv_started_[path] = true;
    }
  }
  if (err == 0) {
    failing_ = false;
    return std::nullopt;
  }
  if (failing_) return std::nullopt;
  failing_ = true;
  return str_cat("monitor: cannot write '", what, "': ", std::strerror(err), "; training goes on");
}

std::vector<std::string> Monitors::written() const {
  std::vector<std::string> out;
  if (tensorboard_) out.push_back(str_cat("tensorboard '", tensorboard_->path(), "' (", scalars_, " scalars)"));
  if (!csv_dir_.empty()) out.push_back(str_cat("csv_monitor '", csv_dir_, "' (", csv_started_.size(), " files)"));
  return out;
}

}  // namespace zerone::report
