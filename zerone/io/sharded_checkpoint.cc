#include "zerone/io/sharded_checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <set>

#include "zerone/core/error.h"
#include "zerone/io/aio.h"
#include "zerone/nn/model.h"

namespace zerone::io {
namespace {

using nlohmann::json;

constexpr const char* kManifestName = "manifest.json";
constexpr const char* kLatestName = "latest";
constexpr const char* kTmpPrefix = ".tmp-";

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

void fsync_directory(const std::string& dir) {
  FileDescriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ZERONE_CHECK(fd.get() >= 0 && ::fsync(fd.get()) == 0, "cannot fsync directory '", dir, "': ", std::strerror(errno));
}

std::vector<std::string> list_directory(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// "step-00000100" -> 100; nullopt for any other name.
std::optional<int64_t> parse_step_name(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// An integer of the manifest in [lo, hi]; floats, strings and values out of range are errors
// (nlohmann's get<int> would truncate 2^32+2 to 2).
int bounded_int(const nlohmann::json& v, const char* key, int64_t lo, int64_t hi, const std::string& what) {
  ZERONE_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi &&
                   !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)),
               what, ": \"", key, "\" is ", v.dump(), ", expected an integer in ", lo, "..", hi);
  return static_cast<int>(v.get<int64_t>());
}

DType dtype_from_name(const std::string& name, const std::string& what) {
  for (DType d : {DType::f32, DType::bf16, DType::f16})
    if (name == dtype_name(d)) return d;
  throw Error(str_cat(what, ": unknown dtype '", name, "' (expected f32, bf16 or f16)"));
}

// Note [Crash points]: tests kill the process at named moments of a save (copy, file, manifest,
// rename, latest, prune; io::FaultEnv::checkpoint_crash_at, in the save of checkpoint_crash_step)
// to prove that a save killed at any of them leaves the previous checkpoint usable
// (tests/zero/checkpoint_resume.sh). SIGKILL, so nothing is cleaned up, as after a power loss or
// the OOM killer. "POINT:TERM" sends one SIGTERM instead, the first time the save passes POINT: the
// save must still complete (tests/cli/checkpoint_runs.sh). FaultEnv::crash_point does it.

}  // namespace

std::vector<CheckpointUnit> checkpoint_units(const nn::Model& model) {
  std::vector<CheckpointUnit> units;
  for (const nn::FlatParam& unit : model.units()) {
    CheckpointUnit cu;
    cu.name = unit.name();
    cu.numel = unit.numel();
    for (const nn::TensorSpec& t : unit.tensors()) cu.tensors.push_back({t.name, t.shape, t.offset});
    units.push_back(std::move(cu));
  }
  return units;
}

// ------------------------------------------------------------------------------------ checksums

uint64_t checksum_of(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

namespace {
uint64_t checksum_of_list(const std::vector<uint64_t>& checksums) {
  std::vector<uint8_t> le(checksums.size() * 8);
  for (size_t i = 0; i < checksums.size(); ++i)
    for (int k = 0; k < 8; ++k) le[i * 8 + k] = static_cast<uint8_t>(checksums[i] >> (8 * k));
  return checksum_of(le.data(), le.size());
}

}  // namespace

// ------------------------------------------------------------------------------------ manifest

json checkpoint_file_to_json(const CheckpointFile& f) {
  json pieces = json::array();
  for (const CheckpointPiece& p : f.pieces)
    pieces.push_back({{"unit", p.unit}, {"tensor", p.tensor}, {"dtype", dtype_name(p.dtype)}, {"begin", p.begin},
                      {"count", p.count}, {"offset", p.offset}, {"xxh3", p.checksums}});
  return {{"name", f.name}, {"bytes", f.bytes}, {"xxh3_of_blocks", f.checksum}, {"pieces", pieces}};
}

CheckpointFile checkpoint_file_from_json(const json& f, const std::string& what) {
  auto get = [&](const json& obj, const char* key, const std::string& where) -> const json& {
    ZERONE_CHECK(obj.is_object() && obj.contains(key), what, ": ", where, " lacks \"", key, "\"");
    return obj.at(key);
  };
  try {
    CheckpointFile file;
    file.name = get(f, "name", "a file").get<std::string>();
    ZERONE_CHECK(!file.name.empty() && file.name.find('/') == std::string::npos && file.name[0] != '.', what,
                 ": file name '", file.name, "' is not a plain name in the checkpoint directory");
    file.bytes = get(f, "bytes", "file " + file.name).get<uint64_t>();
    file.checksum = get(f, "xxh3_of_blocks", "file " + file.name).get<uint64_t>();
    for (const json& p : get(f, "pieces", "file " + file.name)) {
      CheckpointPiece piece;
      piece.unit = bounded_int(get(p, "unit", "a piece"), "a piece's unit", 0, INT32_MAX, what);
      piece.tensor = get(p, "tensor", "a piece").get<std::string>();
      piece.dtype = dtype_from_name(get(p, "dtype", "a piece").get<std::string>(), what);
      piece.begin = get(p, "begin", "a piece").get<uint64_t>();
      piece.count = get(p, "count", "a piece").get<uint64_t>();
      piece.offset = get(p, "offset", "a piece").get<uint64_t>();
      piece.checksums = get(p, "xxh3", "a piece").get<std::vector<uint64_t>>();
      file.pieces.push_back(std::move(piece));
    }
    return file;
  } catch (const json::exception& e) {
    throw Error(str_cat(what, ": malformed file entry: ", e.what()));
  }
}

json manifest_to_json(const CheckpointManifest& m) {
  json j;
  j["format"] = kCheckpointFormat;
  j["version"] = m.version;
  j["step"] = m.step;
  j["model"] = m.model;
  j["precision"] = dtype_name(m.dtype);
  j["world_size"] = m.world_size;
  j["zero_stage"] = m.zero_stage;
  j["offload_optimizer"] = m.offload_optimizer;
  j["offload_param"] = m.offload_param;
  json units = json::array();
  for (const CheckpointUnit& u : m.units) {
    json tensors = json::array();
    for (const CheckpointTensor& t : u.tensors) tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}});
    units.push_back({{"name", u.name}, {"numel", u.numel}, {"tensors", tensors}});
  }
  j["units"] = units;
  j["optimizer"] = {{"type", m.optimizer}, {"state", m.optimizer_state}, {"steps", m.optimizer_steps}};
  j["trainer"] = m.trainer;
  json files = json::array();
  for (const CheckpointFile& f : m.files) files.push_back(checkpoint_file_to_json(f));
  j["files"] = files;
  return j;
}

std::optional<int64_t> manifest_integer(const json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  } else if (!v.is_number_integer()) {
    return std::nullopt;
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return std::nullopt;
  return x;
}

CheckpointManifest manifest_from_json(const json& j, const std::string& what) {
  auto get = [&](const json& obj, const char* key, const std::string& where) -> const json& {
    ZERONE_CHECK(obj.is_object() && obj.contains(key), what, ": ", where, " lacks \"", key, "\"");
    return obj.at(key);
  };
  try {
    ZERONE_CHECK(j.is_object() && j.contains("format") && j["format"] == kCheckpointFormat, what,
                 " is not a zerone checkpoint manifest (\"format\" is not \"", kCheckpointFormat, "\")");
    CheckpointManifest m;
    m.version = bounded_int(get(j, "version", "the manifest"), "version", 0, INT32_MAX, what);
    ZERONE_CHECK(m.version == kCheckpointVersion, what, ": checkpoint format version ", m.version,
                 " is not supported (this zerone reads version ", kCheckpointVersion, ")");
    const json& step = get(j, "step", "the manifest");
    const std::optional<int64_t> step_value = manifest_integer(step, 0, INT32_MAX - 1);
    ZERONE_CHECK(step_value.has_value(), what, ": \"step\" ", step.dump(), " is out of range (expected an integer in 0..",
                 INT32_MAX - 1, ")");
    m.step = *step_value;
    m.model = get(j, "model", "the manifest").get<std::string>();
    m.dtype = dtype_from_name(get(j, "precision", "the manifest").get<std::string>(), what);
    m.world_size = bounded_int(get(j, "world_size", "the manifest"), "world_size", 1, 1 << 24, what);
    m.zero_stage = bounded_int(get(j, "zero_stage", "the manifest"), "zero_stage", 0, 3, what);
    m.offload_optimizer = get(j, "offload_optimizer", "the manifest").get<std::string>();
    m.offload_param = get(j, "offload_param", "the manifest").get<std::string>();
    ZERONE_CHECK(m.step >= 0 && m.step < INT32_MAX && m.world_size >= 1 && m.zero_stage >= 0 && m.zero_stage <= 3, what,
                 ": step, world_size or zero_stage out of range");
    for (const json& u : get(j, "units", "the manifest")) {
      CheckpointUnit unit;
      unit.name = get(u, "name", "a unit").get<std::string>();
      unit.numel = get(u, "numel", "a unit").get<uint64_t>();
      for (const json& t : get(u, "tensors", "unit " + unit.name))
        unit.tensors.push_back({get(t, "name", "a tensor").get<std::string>(),
                                get(t, "shape", "a tensor").get<std::vector<int64_t>>(),
                                get(t, "offset", "a tensor").get<uint64_t>()});
      m.units.push_back(std::move(unit));
    }
    const json& opt = get(j, "optimizer", "the manifest");
    m.optimizer = get(opt, "type", "\"optimizer\"").get<std::string>();
    m.optimizer_state = get(opt, "state", "\"optimizer\"").get<std::vector<std::string>>();
    // The optimizer counts its steps in an int (AdamW's bias correction needs them 0-based, >= 0).
    const json& steps = get(opt, "steps", "\"optimizer\"");
    const std::optional<int64_t> optimizer_steps = manifest_integer(steps, 0, INT32_MAX - 1);
    ZERONE_CHECK(optimizer_steps.has_value(), what, ": \"optimizer\" \"steps\" ", steps.dump(),
                 " is out of range (expected an integer in 0..", INT32_MAX - 1, ")");
    m.optimizer_steps = *optimizer_steps;
    m.trainer = get(j, "trainer", "the manifest");
    for (const json& f : get(j, "files", "the manifest")) m.files.push_back(checkpoint_file_from_json(f, what));
    return m;
  } catch (const json::exception& e) {
    throw Error(str_cat(what, ": malformed manifest: ", e.what()));
  }
}

// ------------------------------------------------------------------------------------ writer

CheckpointFileWriter::CheckpointFileWriter(const std::string& dir, const std::string& name, int64_t step,
                                           const FaultEnv& env)
    : path_(join(dir, name)), env_(env), step_(step) {
  file_.name = name;
  fd_ = FileDescriptor(::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  ZERONE_CHECK(fd_.get() >= 0, "cannot create checkpoint file '", path_, "': ", std::strerror(errno));
}

CheckpointFileWriter::~CheckpointFileWriter() {
  if (!finished_) {
    fd_ = FileDescriptor();
    ::unlink(path_.c_str());
  }
}

void CheckpointFileWriter::append(int unit, const std::string& tensor, DType dtype, uint64_t begin, uint64_t count,
                                  const void* data) {
  CheckpointPiece piece = next_piece(unit, tensor, dtype, begin, count);
  const auto* bytes = static_cast<const char*>(data);
  const uint64_t total = piece.bytes();
  const size_t blocks = static_cast<size_t>((total + kChecksumBlockBytes - 1) / kChecksumBlockBytes);
  piece.checksums.resize(blocks);
  // One thread hashes while another writes (the write is a copy into the page cache, throttled to
  // the disk's pace by writeback); exceptions cannot leave an OpenMP region, so they are carried out.
  std::exception_ptr write_error;
  const int threads = blocks > 1 && omp_get_max_threads() >= 2 ? 2 : 1;
#pragma omp parallel sections num_threads(threads)
  {
#pragma omp section
    for (size_t k = 0; k < blocks; ++k) {
      const uint64_t b = k * kChecksumBlockBytes;
      piece.checksums[k] = checksum_of(bytes + b, std::min(kChecksumBlockBytes, total - b));
    }
#pragma omp section
    try {
      pwrite_all(fd_.get(), bytes, total, file_.bytes, path_);
    } catch (...) {
      write_error = std::current_exception();
    }
  }
  if (write_error) std::rethrow_exception(write_error);
  commit(std::move(piece));
}

CheckpointPiece CheckpointFileWriter::next_piece(int unit, const std::string& tensor, DType dtype, uint64_t begin,
                                                 uint64_t count) const {
  ZERONE_ASSERT(!finished_, "append after finish");
  CheckpointPiece piece;
  piece.unit = unit;
  piece.tensor = tensor;
  piece.dtype = dtype;
  piece.begin = begin;
  piece.count = count;
  piece.offset = file_.bytes;
  return piece;
}

void CheckpointFileWriter::commit(CheckpointPiece piece) {
  block_checksums_.insert(block_checksums_.end(), piece.checksums.begin(), piece.checksums.end());
  file_.bytes += piece.bytes();
  file_.pieces.push_back(std::move(piece));
  if (file_.pieces.size() == 2) env_.crash_point("file", step_);
}

uint64_t CheckpointFileWriter::append_from_file(int unit, const std::string& tensor, DType dtype, uint64_t begin,
                                                uint64_t count, const std::string& path, uint64_t offset,
                                                const std::vector<uint64_t>& checksums) {
  CheckpointPiece piece = next_piece(unit, tensor, dtype, begin, count);
  piece.checksums = checksums;
  const uint64_t total = piece.bytes();
  ZERONE_ASSERT(checksums.size() == (total + kChecksumBlockBytes - 1) / kChecksumBlockBytes, "checksums of ", tensor);
  env_.crash_point("copy", step_);
  FileDescriptor src = open_swap_file_for_reading(path);
  ZERONE_CHECK(src.get() >= 0, "cannot open '", path, "' to copy ", tensor, " into checkpoint file '", path_, "': ",
               std::strerror(errno));
  loff_t in = static_cast<loff_t>(offset), out = static_cast<loff_t>(file_.bytes);
  uint64_t done = 0;
  std::vector<char> bounce;
  while (done < total) {
    ssize_t n = ::copy_file_range(src.get(), &in, fd_.get(), &out, total - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
      // The kernel cannot copy between these files: copy through a bounded buffer instead.
      bounce.resize(std::min<uint64_t>(kChecksumBlockBytes, total - done));
      const uint64_t chunk = bounce.size();
      read_exactly(src.get(), bounce.data(), chunk, static_cast<uint64_t>(in), path);
      pwrite_all(fd_.get(), bounce.data(), chunk, static_cast<uint64_t>(out), path_);
      in += static_cast<loff_t>(chunk);
      out += static_cast<loff_t>(chunk);
      done += chunk;
      continue;
    }
    ZERONE_CHECK(n > 0, "cannot copy ", tensor, " from '", path, "' into checkpoint file '", path_, "': ",
                 n < 0 ? std::strerror(errno) : "the source ended early");
    done += static_cast<uint64_t>(n);
  }
  commit(std::move(piece));
  return total;
}

CheckpointFile CheckpointFileWriter::finish() {
  file_.checksum = checksum_of_list(block_checksums_);
  ZERONE_CHECK(::fsync(fd_.get()) == 0, "cannot write checkpoint file '", path_, "' (fsync): ", std::strerror(errno));
  const int fd = fd_.get();
  (void)fd;
  fd_ = FileDescriptor();  // close (errors after a successful fsync cannot lose data)
  finished_ = true;
  return file_;
}

// ------------------------------------------------------------------------------------ directories

std::string checkpoint_step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

bool is_checkpoint_directory(const std::string& path) {
  struct stat st;
  return is_directory(path) && ::stat(join(path, kManifestName).c_str(), &st) == 0;
}

namespace {

constexpr const char* kLockName = ".zerone-lock";

// Names a root may hold beside its checkpoints: the lock, temporaries of saves in progress or
// killed (".tmp-step-N", "latest.tmp.<pid>").
bool is_bookkeeping_name(const std::string& name) {
  return name == kLockName || name.compare(0, std::strlen(kTmpPrefix), kTmpPrefix) == 0 ||
         name.compare(0, std::strlen(kLatestName) + 5, std::string(kLatestName) + ".tmp.") == 0;
}

// The step directories of `root` that hold a manifest, newest first.
std::vector<std::pair<int64_t, std::string>> step_directories(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& entry : list_directory(root))
    if (std::optional<int64_t> s = parse_step_name(entry); s && is_checkpoint_directory(join(root, entry)))
      steps.emplace_back(*s, entry);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Whether the manifest of checkpoint directory `dir` parses and passes manifest_from_json.
bool manifest_is_sound(const std::string& dir) {
  try {
    const std::string path = join(dir, kManifestName);
    manifest_from_json(json::parse(read_text_file(path, "checkpoint manifest", size_t{1} << 30)), path);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::optional<std::string> find_latest_checkpoint(const std::string& root, std::string* notice) {
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) {
    ZERONE_CHECK(errno == ENOENT, "--checkpoint-dir '", root, "': ", std::strerror(errno));
    return std::nullopt;
  }
  ZERONE_CHECK(S_ISDIR(st.st_mode), "--checkpoint-dir '", root, "' is not a directory");
  const std::string latest = join(root, kLatestName);
  // lstat: a dangling symlink is a broken pointer (read_text_file says so), not a missing one.
  if (::lstat(latest.c_str(), &st) == 0) {
    ZERONE_CHECK(!is_directory(latest), "'", latest, "' is a directory", S_ISLNK(st.st_mode) ? " (a symlink to one)" : "",
                 ", but zerone's checkpoint pointer is a text file naming the newest checkpoint (step-NNNNNNNN): ",
                 "replace it with such a file or remove it");
    std::string name = read_text_file(latest, "checkpoint pointer", 4096);
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
    ZERONE_CHECK(parse_step_name(name).has_value(), "'", latest, "' holds '", name,
                 "', expected the name of a checkpoint directory (step-NNNNNNNN)");
    const std::string dir = join(root, name);
    ZERONE_CHECK(is_directory(dir), "'", latest, "' names '", name, "', which does not exist in '", root,
                 "' (the checkpoint was removed?): remove '", latest, "' to start over, or restore the directory");
    ZERONE_CHECK(is_checkpoint_directory(dir), "'", latest, "' names '", dir, "', which has no ", kManifestName,
                 " (not a complete zerone checkpoint)");
    return dir;
  }
  // No pointer. A step directory is renamed into place complete before `latest` is written (Note
  // [Atomic checkpoints]), so one with a sound manifest is a checkpoint whose pointer a kill cut off.
  for (const auto& [step, entry] : step_directories(root)) {
    if (!manifest_is_sound(join(root, entry))) continue;
    if (notice != nullptr)
      *notice = str_cat("'", latest, "' is missing (a save stopped before writing it): resuming from the newest ",
                        "complete checkpoint '", join(root, entry), "'");
    return join(root, entry);
  }
  // Only an empty root (or one with a crashed save's temporaries) means "nothing yet".
  for (const std::string& name : list_directory(root)) {
    if (is_bookkeeping_name(name)) continue;
    throw Error(str_cat("--checkpoint-dir '", root, "' holds '", name, "' but no '", kLatestName,
                        "' pointer: it is not a zerone checkpoint directory (give an empty or new directory)"));
  }
  return std::nullopt;
}

CheckpointDirLock::CheckpointDirLock(const std::string& root) {
  const std::string path = join(root, kLockName);
  fd_ = FileDescriptor(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  ZERONE_CHECK(fd_.get() >= 0, "--checkpoint-dir '", root, "': cannot create the lock file '", path, "': ",
               std::strerror(errno));
  if (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS) return;  // a filesystem without locks: unguarded
    ZERONE_CHECK(errno == EWOULDBLOCK, "--checkpoint-dir '", root, "': cannot lock '", path, "': ", std::strerror(errno));
    char text[32] = {0};
    const ssize_t n = ::pread(fd_.get(), text, sizeof text - 1, 0);
    const long holder = n > 0 ? std::atol(text) : 0;
    throw Error(str_cat("--checkpoint-dir '", root, "' is in use by another zerone run (",
                        holder > 0 ? str_cat("process ", holder) : std::string("another process"), " holds '", path,
                        "'): two runs in one directory would replace each other's checkpoints; wait for it to ",
                        "end or give another --checkpoint-dir"));
  }
  const std::string pid = str_cat(::getpid(), "\n");
  if (::ftruncate(fd_.get(), 0) == 0) {
    const ssize_t ignored = ::pwrite(fd_.get(), pid.data(), pid.size(), 0);
    (void)ignored;
  }
}

std::optional<std::string> describe_checkpoint_run(const std::string& root) {
  struct stat st;
  const std::string latest = join(root, kLatestName);
  if (::lstat(latest.c_str(), &st) == 0) {
    std::string name;
    try {
      name = read_text_file(latest, "checkpoint pointer", 4096);
    } catch (const Error&) {
    }
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
    return str_cat("its 'latest' names ", name.empty() ? std::string("a checkpoint") : str_cat("'", name, "'"));
  }
  const auto steps = step_directories(root);
  if (steps.empty()) return std::nullopt;
  return str_cat("it holds ", steps.size() == 1 ? steps[0].second : str_cat(steps.back().second, " .. ", steps[0].second));
}

void remove_stale_checkpoint_temporaries(const std::string& root) noexcept {
  try {
    for (const std::string& name : list_directory(root))
      if (name.compare(0, std::strlen(kTmpPrefix) + 5, std::string(kTmpPrefix) + "step-") == 0)
        remove_tree(join(root, name));
    remove_stale_temporaries(root, kLatestName);
  } catch (...) {
  }
}

std::string resolve_checkpoint_path(const std::string& path) {
  if (is_checkpoint_directory(path)) return path;
  struct stat st;
  if (is_directory(path) && ::lstat(join(path, kLatestName).c_str(), &st) == 0) {
    std::optional<std::string> dir = find_latest_checkpoint(path);
    if (dir) return *dir;
  }
  ZERONE_CHECK(is_directory(path), "'", path, "' is not a directory, so not a zerone checkpoint");
  throw Error(str_cat("'", path, "' is not a zerone checkpoint: it holds neither ", kManifestName, " nor a '",
                      kLatestName, "' pointer"));
}

void check_checkpoint_root(const std::string& root, const std::string& what) {
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) {
    ZERONE_CHECK(errno == ENOENT, what, " '", root, "': ", std::strerror(errno));
    std::string copy = root;
    while (copy.size() > 1 && copy.back() == '/') copy.pop_back();
    const size_t slash = copy.rfind('/');
    const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : copy.substr(0, slash);
    ZERONE_CHECK(is_directory(parent), what, " '", root, "' cannot be created: its parent '", parent,
                 "' is not an existing directory");
    ZERONE_CHECK(::mkdir(root.c_str(), 0755) == 0 || errno == EEXIST, what, " '", root, "' cannot be created: ",
                 std::strerror(errno));
  } else {
    ZERONE_CHECK(S_ISDIR(st.st_mode), what, " '", root, "' is not a directory");
  }
  const std::string probe = join(root, str_cat(kTmpPrefix, "probe.", ::getpid()));
  ZERONE_CHECK(::mkdir(probe.c_str(), 0755) == 0, what, " '", root, "' is not writable: cannot create '", probe, "': ",
               std::strerror(errno));
  ::rmdir(probe.c_str());
}

void remove_tree(const std::string& path) noexcept {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const std::string& name : list_directory(path)) remove_tree(join(path, name));
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

std::string create_checkpoint_tmp(const std::string& root, int64_t step) {
  const std::string tmp = join(root, kTmpPrefix + checkpoint_step_name(step));
  remove_tree(tmp);
  ZERONE_CHECK(::mkdir(tmp.c_str(), 0755) == 0, "cannot create checkpoint directory '", tmp, "': ", std::strerror(errno));
  return tmp;
}

std::string publish_checkpoint(const std::string& root, const std::string& tmp, const CheckpointManifest& manifest,
                               int keep_last, const FaultEnv& env) {
  const std::string text = manifest_to_json(manifest).dump(1) + "\n";
  env.crash_point("manifest", manifest.step);
  const std::string name = checkpoint_step_name(manifest.step);
  const std::string final_dir = join(root, name);
  try {
    // `latest` never moves back: a newer step there is another run's (Note [One run per checkpoint directory]).
    const std::string latest = join(root, kLatestName);
    struct stat latest_st;
    if (::lstat(latest.c_str(), &latest_st) == 0 && !is_directory(latest)) {
      std::string current;
      try {
        current = read_text_file(latest, "checkpoint pointer", 4096);
      } catch (const Error&) {
      }
      while (!current.empty() && (current.back() == '\n' || current.back() == '\r' || current.back() == ' ')) current.pop_back();
      const std::optional<int64_t> current_step = parse_step_name(current);
      ZERONE_CHECK(!current_step || *current_step <= manifest.step, "cannot publish checkpoint '", final_dir, "': '",
                   latest, "' names the newer '", current, "' of another run (the pointer never moves back)");
    }
    write_file_atomically(join(tmp, kManifestName),
                          [&](std::FILE* f) { write_all(f, text.data(), text.size(), join(tmp, kManifestName)); });
    fsync_directory(tmp);
  } catch (...) {
    remove_tree(tmp);  // a full disk or a refused save leaves no half-written step behind
    throw;
  }
  env.crash_point("rename", manifest.step);
  // A checkpoint of the same step (a run restarted from an older one) is replaced: move it aside
  // first, so that there is never a moment without a complete one where `latest` points.
  const std::string old = join(root, str_cat(kTmpPrefix, "old-", name));
  if (is_directory(final_dir)) {
    remove_tree(old);
    ZERONE_CHECK(::rename(final_dir.c_str(), old.c_str()) == 0, "cannot move the old '", final_dir, "' aside: ",
                 std::strerror(errno));
  }
  ZERONE_CHECK(::rename(tmp.c_str(), final_dir.c_str()) == 0, "cannot rename '", tmp, "' to '", final_dir, "': ",
               std::strerror(errno));
  fsync_directory(root);
  env.crash_point("latest", manifest.step);
  const std::string latest = join(root, kLatestName);
  write_file_atomically(latest, [&](std::FILE* f) {
    const std::string line = name + "\n";
    write_all(f, line.data(), line.size(), latest);
  });
  env.crash_point("prune", manifest.step);
  remove_tree(old);
  // Prune: the newest keep_last complete checkpoints up to this one stay (steps after it are not
  // this run's to remove); stale temporaries of other steps go.
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& entry : list_directory(root)) {
    if (std::optional<int64_t> s = parse_step_name(entry); s && *s <= manifest.step && is_directory(join(root, entry)))
      steps.emplace_back(*s, entry);
  }
  std::sort(steps.begin(), steps.end());
  if (keep_last > 0 && steps.size() > static_cast<size_t>(keep_last)) {
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < steps.size(); ++i)
      if (steps[i].second != name) remove_tree(join(root, steps[i].second));
  }
  return final_dir;
}

// ------------------------------------------------------------------------------------ reader

struct CheckpointReader::Impl {
  // (unit, tensor) -> (file index, piece index), sorted by begin.
  std::map<std::pair<int, std::string>, std::vector<std::pair<size_t, size_t>>> index;
  std::map<std::string, DType> tensor_dtypes;
  mutable std::vector<FileDescriptor> fds;
  mutable uint64_t bytes_read = 0;
  mutable double read_seconds = 0.0;
};

CheckpointReader::CheckpointReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  dir_ = resolve_checkpoint_path(path);
  const std::string manifest_path = join(dir_, kManifestName);
  const std::string text = read_text_file(manifest_path, "checkpoint manifest", size_t{1} << 30);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(str_cat("'", manifest_path, "' is not valid JSON (a truncated or corrupted manifest?): ", e.what()));
  }
  manifest_ = manifest_from_json(j, str_cat("'", manifest_path, "'"));
  const auto& units = manifest_.units;
  impl_->fds.resize(manifest_.files.size());
  for (size_t fi = 0; fi < manifest_.files.size(); ++fi) {
    const CheckpointFile& f = manifest_.files[fi];
    const std::string file_path = join(dir_, f.name);
    struct stat st;
    ZERONE_CHECK(::stat(file_path.c_str(), &st) == 0, "checkpoint '", dir_, "' is missing its file '", f.name, "' (",
                 std::strerror(errno), ")");
    ZERONE_CHECK(S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) == f.bytes, "checkpoint file '", file_path,
                 "' has ", st.st_size, " bytes, the manifest records ", f.bytes, " (truncated or replaced)");
    for (size_t pi = 0; pi < f.pieces.size(); ++pi) {
      const CheckpointPiece& p = f.pieces[pi];
      ZERONE_CHECK(p.unit >= 0 && static_cast<size_t>(p.unit) < units.size(), "'", manifest_path, "': a piece of '",
                   f.name, "' names unit ", p.unit, " of ", units.size());
      // Written so that no sum or product can wrap around (the numbers are the manifest's).
      const uint64_t numel = units[p.unit].numel, esize = dtype_size(p.dtype);
      ZERONE_CHECK(p.count > 0 && p.count <= numel && p.begin <= numel - p.count && p.offset <= f.bytes &&
                       p.count <= (f.bytes - p.offset) / esize &&
                       p.checksums.size() == (p.bytes() + kChecksumBlockBytes - 1) / kChecksumBlockBytes,
                   "'", manifest_path, "': piece ", p.tensor, " [", p.begin, ", +", p.count, ") of unit ", p.unit, " in '",
                   f.name, "' does not fit the unit or the file");
      auto [it, inserted] = impl_->tensor_dtypes.emplace(p.tensor, p.dtype);
      ZERONE_CHECK(it->second == p.dtype, "'", manifest_path, "': tensor ", p.tensor, " is stored in two dtypes");
      impl_->index[{p.unit, p.tensor}].emplace_back(fi, pi);
    }
  }
  // Every unit has every tensor, covered exactly once: nothing is half-loaded later.
  for (const auto& [tensor, dtype] : impl_->tensor_dtypes) {
    for (size_t u = 0; u < units.size(); ++u) {
      auto it = impl_->index.find({static_cast<int>(u), tensor});
      ZERONE_CHECK(it != impl_->index.end(), "checkpoint '", dir_, "' lacks ", tensor, " of unit ", units[u].name,
                   " (a rank file missing from the manifest?)");
      auto& list = it->second;
      std::sort(list.begin(), list.end(), [&](auto a, auto b) {
        return manifest_.files[a.first].pieces[a.second].begin < manifest_.files[b.first].pieces[b.second].begin;
      });
      uint64_t covered = 0;
      for (auto [fi, pi] : list) {
        const CheckpointPiece& p = manifest_.files[fi].pieces[pi];
        ZERONE_CHECK(p.begin == covered, "checkpoint '", dir_, "': ", tensor, " of unit ", units[u].name,
                     p.begin < covered ? " is stored twice from element " : " has a gap at element ", std::min(p.begin, covered));
        covered += p.count;
      }
      ZERONE_CHECK(covered == units[u].numel, "checkpoint '", dir_, "': ", tensor, " of unit ", units[u].name,
                   " covers ", covered, " of ", units[u].numel, " elements");
    }
  }
}

CheckpointReader::~CheckpointReader() = default;

void CheckpointReader::check_layout(const nn::Model& model) const {
  const std::string where = str_cat("checkpoint '", dir_, "'");
  const std::vector<CheckpointUnit> units = checkpoint_units(model);
  ZERONE_CHECK(manifest_.units.size() == units.size(), where, " has ", manifest_.units.size(), " units, the model ",
               units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    const CheckpointUnit &a = manifest_.units[u], &b = units[u];
    bool same = a.name == b.name && a.numel == b.numel && a.tensors.size() == b.tensors.size();
    for (size_t t = 0; same && t < a.tensors.size(); ++t)
      same = a.tensors[t].name == b.tensors[t].name && a.tensors[t].shape == b.tensors[t].shape &&
             a.tensors[t].offset == b.tensors[t].offset;
    ZERONE_CHECK(same, where, ": unit ", u, " ('", a.name, "', ", a.numel, " elements) does not match the model's '",
                 b.name, "' (", b.numel, " elements)");
  }
}

bool CheckpointReader::has_tensor(const std::string& tensor) const { return impl_->tensor_dtypes.count(tensor) > 0; }

DType CheckpointReader::tensor_dtype(const std::string& tensor) const {
  auto it = impl_->tensor_dtypes.find(tensor);
  ZERONE_CHECK(it != impl_->tensor_dtypes.end(), "checkpoint '", dir_, "' holds no ", tensor);
  return it->second;
}

void CheckpointReader::read(int unit, const std::string& tensor, uint64_t begin, uint64_t count, DType out_dtype,
                            void* out) const {
  if (count == 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  auto it = impl_->index.find({unit, tensor});
  ZERONE_CHECK(it != impl_->index.end(), "checkpoint '", dir_, "' holds no ", tensor, " of unit ", unit);
  const uint64_t end = begin + count;
  ZERONE_ASSERT(end <= manifest_.units[unit].numel, "read past the unit");
  const size_t out_size = dtype_size(out_dtype);
  // One task per checksum block the read touches. The kernel is told up front which bytes are
  // wanted (it reads ahead with a deep queue), and the blocks are read and verified on the
  // OpenMP team, so several reads are in flight while others are hashed.
  struct Task {
    size_t file;
    const CheckpointPiece* piece;
    uint64_t block_begin, block_end;  // bytes of the piece
    uint64_t elem_begin, elem_end;    // the elements of the piece this read wants from the block
    uint64_t checksum;
    char* dst;
  };
  std::vector<Task> tasks;
  for (auto [fi, pi] : it->second) {
    const CheckpointPiece& p = manifest_.files[fi].pieces[pi];
    if (p.begin + p.count <= begin || p.begin >= end) continue;
    if (impl_->fds[fi].get() < 0)
      impl_->fds[fi] = open_regular_file(join(dir_, manifest_.files[fi].name), "checkpoint file");
    const size_t esize = dtype_size(p.dtype);
    // The bytes of the piece this read needs, widened to whole checksum blocks.
    const uint64_t want_b = (std::max(begin, p.begin) - p.begin) * esize;
    const uint64_t want_e = (std::min(end, p.begin + p.count) - p.begin) * esize;
    const uint64_t first = want_b / kChecksumBlockBytes, last = (want_e - 1) / kChecksumBlockBytes;
    const uint64_t range_b = first * kChecksumBlockBytes, range_e = std::min(p.bytes(), (last + 1) * kChecksumBlockBytes);
    ::posix_fadvise(impl_->fds[fi].get(), static_cast<off_t>(p.offset + range_b), static_cast<off_t>(range_e - range_b),
                    POSIX_FADV_WILLNEED);
    for (uint64_t block = first; block <= last; ++block) {
      const uint64_t bb = block * kChecksumBlockBytes, be = std::min(p.bytes(), bb + kChecksumBlockBytes);
      const uint64_t eb = std::max(want_b, bb) / esize, ee = std::min(want_e, be) / esize;
      tasks.push_back({fi, &p, bb, be, eb, ee, p.checksums[block], static_cast<char*>(out) + (p.begin + eb - begin) * out_size});
    }
  }
  std::exception_ptr error;
  std::vector<std::vector<char>> bounce(static_cast<size_t>(omp_get_max_threads()));
  uint64_t bytes = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : bytes) if (tasks.size() > 1)
  for (size_t t = 0; t < tasks.size(); ++t) {
    const Task& k = tasks[t];
    const CheckpointPiece& p = *k.piece;
    const size_t esize = dtype_size(p.dtype);
    const std::string& file_name = manifest_.files[k.file].name;
    try {
      // A whole block wanted in its own dtype is read straight into place and verified there.
      const bool direct = p.dtype == out_dtype && k.elem_begin * esize == k.block_begin && k.elem_end * esize == k.block_end;
      char* buf = k.dst;
      if (!direct) {
        std::vector<char>& mine = bounce[static_cast<size_t>(omp_get_thread_num())];
        if (mine.size() < k.block_end - k.block_begin) mine.resize(k.block_end - k.block_begin);
        buf = mine.data();
      }
      read_exactly(impl_->fds[k.file].get(), buf, k.block_end - k.block_begin, p.offset + k.block_begin,
                   join(dir_, file_name));
      bytes += k.block_end - k.block_begin;
      ZERONE_CHECK(checksum_of(buf, k.block_end - k.block_begin) == k.checksum, "checkpoint file '", join(dir_, file_name),
                   "' is corrupted: checksum mismatch in ", tensor, " of unit ", manifest_.units[unit].name, " (bytes ",
                   p.offset + k.block_begin, "..", p.offset + k.block_end, " of the file)");
      if (!direct) {
        const char* src = buf + (k.elem_begin * esize - k.block_begin);
        const size_t n = k.elem_end - k.elem_begin;
        if (p.dtype == out_dtype) {
          std::memcpy(k.dst, src, n * esize);
        } else {
          std::vector<float> widened(n);
          convert_to_f32(src, p.dtype, widened.data(), n);
          convert_from_f32(widened.data(), k.dst, out_dtype, n);
        }
      }
    } catch (...) {
#pragma omp critical(zerone_checkpoint_read_error)
      if (!error) error = std::current_exception();
    }
  }
  impl_->bytes_read += bytes;
  impl_->read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (error) std::rethrow_exception(error);
}

uint64_t CheckpointReader::bytes_read() const { return impl_->bytes_read; }
double CheckpointReader::read_seconds() const { return impl_->read_seconds; }

void CheckpointReader::verify_files() const {
  std::vector<char> buf(kChecksumBlockBytes);
  for (const CheckpointFile& f : manifest_.files) {
    const std::string file_path = join(dir_, f.name);
    FileDescriptor fd = open_regular_file(file_path, "checkpoint file");
    std::vector<uint64_t> blocks;
    for (const CheckpointPiece& p : f.pieces)
      for (uint64_t b = 0; b < p.bytes(); b += kChecksumBlockBytes) {
        const uint64_t n = std::min(kChecksumBlockBytes, p.bytes() - b);
        read_exactly(fd.get(), buf.data(), n, p.offset + b, file_path);
        blocks.push_back(checksum_of(buf.data(), n));
      }
    ZERONE_CHECK(checksum_of_list(blocks) == f.checksum, "checkpoint file '", file_path,
                 "' is corrupted: its checksum differs from the manifest's");
  }
}

}  // namespace zerone::io
