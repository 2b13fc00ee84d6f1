#include "zerone/io/sharded_checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <set>

#include "zerone/core/error.h"

namespace zerone::io {
namespace {

using nlohmann::json;

constexpr const char* kManifestName = "manifest.json";
constexpr const char* kLatestName = "latest";
constexpr const char* kTmpPrefix = ".tmp-";
constexpr size_t kCrcChunkBytes = size_t{1} << 20;  // parallel crc granularity

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
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

DType dtype_from_name(const std::string& name, const std::string& what) {
  for (DType d : {DType::f32, DType::bf16, DType::f16})
    if (name == dtype_name(d)) return d;
  throw Error(str_cat(what, ": unknown dtype '", name, "' (expected f32, bf16 or f16)"));
}

// Note [Crash points]: tests kill the process at named moments of a save
// (ZERONE_CHECKPOINT_CRASH_AT=file|manifest|rename|latest|prune, in the save of step
// ZERONE_CHECKPOINT_CRASH_STEP) to prove that a save killed at any of them leaves the previous
// checkpoint usable (tests/zero/checkpoint_resume.sh). SIGKILL, so nothing is cleaned up, as
// after a power loss or the OOM killer.
void crash_point(const char* point, int64_t step) {
  static const char* const wanted = std::getenv("ZERONE_CHECKPOINT_CRASH_AT");
  static const char* const wanted_step = std::getenv("ZERONE_CHECKPOINT_CRASH_STEP");
  if (wanted != nullptr && std::strcmp(wanted, point) == 0 &&
      (wanted_step == nullptr || std::atoll(wanted_step) == step))
    ::raise(SIGKILL);
}

}  // namespace

// ------------------------------------------------------------------------------------ crc32

uint32_t crc32_of(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  if (bytes <= 2 * kCrcChunkBytes) return static_cast<uint32_t>(::crc32_z(crc, p, bytes));
  const size_t chunks = (bytes + kCrcChunkBytes - 1) / kCrcChunkBytes;
  std::vector<uint32_t> part(chunks);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < chunks; ++i) {
    const size_t b = i * kCrcChunkBytes, n = std::min(kCrcChunkBytes, bytes - b);
    part[i] = static_cast<uint32_t>(::crc32_z(0, p + b, n));
  }
  uLong out = crc;
  for (size_t i = 0; i < chunks; ++i) {
    const size_t n = std::min(kCrcChunkBytes, bytes - i * kCrcChunkBytes);
    out = ::crc32_combine(out, part[i], static_cast<z_off_t>(n));
  }
  return static_cast<uint32_t>(out);
}

// ------------------------------------------------------------------------------------ manifest

json checkpoint_file_to_json(const CheckpointFile& f) {
  json pieces = json::array();
  for (const CheckpointPiece& p : f.pieces)
    pieces.push_back({{"unit", p.unit}, {"tensor", p.tensor}, {"dtype", dtype_name(p.dtype)}, {"begin", p.begin},
                      {"count", p.count}, {"offset", p.offset}, {"crc32", p.crcs}});
  return {{"name", f.name}, {"bytes", f.bytes}, {"crc32", f.crc32}, {"pieces", pieces}};
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
    file.crc32 = get(f, "crc32", "file " + file.name).get<uint32_t>();
    for (const json& p : get(f, "pieces", "file " + file.name)) {
      CheckpointPiece piece;
      piece.unit = get(p, "unit", "a piece").get<int>();
      piece.tensor = get(p, "tensor", "a piece").get<std::string>();
      piece.dtype = dtype_from_name(get(p, "dtype", "a piece").get<std::string>(), what);
      piece.begin = get(p, "begin", "a piece").get<uint64_t>();
      piece.count = get(p, "count", "a piece").get<uint64_t>();
      piece.offset = get(p, "offset", "a piece").get<uint64_t>();
      piece.crcs = get(p, "crc32", "a piece").get<std::vector<uint32_t>>();
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

CheckpointManifest manifest_from_json(const json& j, const std::string& what) {
  auto get = [&](const json& obj, const char* key, const std::string& where) -> const json& {
    ZERONE_CHECK(obj.is_object() && obj.contains(key), what, ": ", where, " lacks \"", key, "\"");
    return obj.at(key);
  };
  try {
    ZERONE_CHECK(j.is_object() && j.contains("format") && j["format"] == kCheckpointFormat, what,
                 " is not a zerone checkpoint manifest (\"format\" is not \"", kCheckpointFormat, "\")");
    CheckpointManifest m;
    m.version = get(j, "version", "the manifest").get<int>();
    ZERONE_CHECK(m.version == kCheckpointVersion, what, ": checkpoint format version ", m.version,
                 " is not supported (this zerone reads version ", kCheckpointVersion, ")");
    m.step = get(j, "step", "the manifest").get<int64_t>();
    m.model = get(j, "model", "the manifest").get<std::string>();
    m.dtype = dtype_from_name(get(j, "precision", "the manifest").get<std::string>(), what);
    m.world_size = get(j, "world_size", "the manifest").get<int>();
    m.zero_stage = get(j, "zero_stage", "the manifest").get<int>();
    m.offload_optimizer = get(j, "offload_optimizer", "the manifest").get<std::string>();
    m.offload_param = get(j, "offload_param", "the manifest").get<std::string>();
    ZERONE_CHECK(m.step >= 0 && m.world_size >= 1 && m.zero_stage >= 0 && m.zero_stage <= 3, what,
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
    m.optimizer_steps = get(opt, "steps", "\"optimizer\"").get<int64_t>();
    m.trainer = get(j, "trainer", "the manifest");
    for (const json& f : get(j, "files", "the manifest")) m.files.push_back(checkpoint_file_from_json(f, what));
    return m;
  } catch (const json::exception& e) {
    throw Error(str_cat(what, ": malformed manifest: ", e.what()));
  }
}

// ------------------------------------------------------------------------------------ writer

CheckpointFileWriter::CheckpointFileWriter(const std::string& dir, const std::string& name, int64_t step)
    : path_(join(dir, name)), step_(step) {
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
  ZERONE_ASSERT(!finished_, "append after finish");
  CheckpointPiece piece;
  piece.unit = unit;
  piece.tensor = tensor;
  piece.dtype = dtype;
  piece.begin = begin;
  piece.count = count;
  piece.offset = file_.bytes;
  const auto* bytes = static_cast<const char*>(data);
  const uint64_t total = piece.bytes();
  for (uint64_t b = 0; b < total; b += kCrcBlockBytes) {
    const uint64_t n = std::min(kCrcBlockBytes, total - b);
    piece.crcs.push_back(crc32_of(bytes + b, n));
    file_.crc32 = static_cast<uint32_t>(::crc32_combine(file_.crc32, piece.crcs.back(), static_cast<z_off_t>(n)));
    uint64_t done = 0;
    while (done < n) {
      ssize_t w = ::pwrite(fd_.get(), bytes + b + done, n - done, static_cast<off_t>(file_.bytes + done));
      if (w < 0 && errno == EINTR) continue;
      ZERONE_CHECK(w > 0, "cannot write checkpoint file '", path_, "': ", w < 0 ? std::strerror(errno) : "no progress");
      done += static_cast<uint64_t>(w);
    }
    file_.bytes += n;
  }
  file_.pieces.push_back(std::move(piece));
  if (file_.pieces.size() == 2) crash_point("file", step_);
}

CheckpointFile CheckpointFileWriter::finish() {
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

std::optional<std::string> find_latest_checkpoint(const std::string& root) {
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) {
    ZERONE_CHECK(errno == ENOENT, "--checkpoint-dir '", root, "': ", std::strerror(errno));
    return std::nullopt;
  }
  ZERONE_CHECK(S_ISDIR(st.st_mode), "--checkpoint-dir '", root, "' is not a directory");
  const std::string latest = join(root, kLatestName);
  if (::stat(latest.c_str(), &st) == 0) {
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
  // No pointer: only an empty root (or one with a crashed save's temporaries) means "nothing yet".
  for (const std::string& name : list_directory(root)) {
    if (name.compare(0, std::strlen(kTmpPrefix), kTmpPrefix) == 0) continue;
    throw Error(str_cat("--checkpoint-dir '", root, "' holds '", name, "' but no '", kLatestName,
                        "' pointer: it is not a zerone checkpoint directory (give an empty or new directory)"));
  }
  return std::nullopt;
}

std::string resolve_checkpoint_path(const std::string& path) {
  if (is_checkpoint_directory(path)) return path;
  struct stat st;
  if (is_directory(path) && ::stat(join(path, kLatestName).c_str(), &st) == 0) {
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
                               int keep_last) {
  const std::string text = manifest_to_json(manifest).dump(1) + "\n";
  crash_point("manifest", manifest.step);
  write_file_atomically(join(tmp, kManifestName), [&](std::FILE* f) { write_all(f, text.data(), text.size(), join(tmp, kManifestName)); });
  fsync_directory(tmp);
  crash_point("rename", manifest.step);
  const std::string name = checkpoint_step_name(manifest.step);
  const std::string final_dir = join(root, name);
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
  crash_point("latest", manifest.step);
  const std::string latest = join(root, kLatestName);
  write_file_atomically(latest, [&](std::FILE* f) {
    const std::string line = name + "\n";
    write_all(f, line.data(), line.size(), latest);
  });
  crash_point("prune", manifest.step);
  remove_tree(old);
  // Prune: the newest keep_last complete checkpoints stay; stale temporaries of other steps go.
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& entry : list_directory(root)) {
    if (std::optional<int64_t> s = parse_step_name(entry); s && is_directory(join(root, entry)))
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
  mutable std::vector<char> bounce;
  mutable uint64_t bytes_read = 0;
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
      ZERONE_CHECK(p.count > 0 && p.begin + p.count <= units[p.unit].numel && p.offset + p.bytes() <= f.bytes &&
                       p.crcs.size() == (p.bytes() + kCrcBlockBytes - 1) / kCrcBlockBytes,
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

bool CheckpointReader::has_tensor(const std::string& tensor) const { return impl_->tensor_dtypes.count(tensor) > 0; }

DType CheckpointReader::tensor_dtype(const std::string& tensor) const {
  auto it = impl_->tensor_dtypes.find(tensor);
  ZERONE_CHECK(it != impl_->tensor_dtypes.end(), "checkpoint '", dir_, "' holds no ", tensor);
  return it->second;
}

void CheckpointReader::read(int unit, const std::string& tensor, uint64_t begin, uint64_t count, DType out_dtype,
                            void* out) const {
  if (count == 0) return;
  auto it = impl_->index.find({unit, tensor});
  ZERONE_CHECK(it != impl_->index.end(), "checkpoint '", dir_, "' holds no ", tensor, " of unit ", unit);
  const uint64_t end = begin + count;
  ZERONE_ASSERT(end <= manifest_.units[unit].numel, "read past the unit");
  const size_t out_size = dtype_size(out_dtype);
  std::vector<float> widened;
  for (auto [fi, pi] : it->second) {
    const CheckpointPiece& p = manifest_.files[fi].pieces[pi];
    if (p.begin + p.count <= begin || p.begin >= end) continue;
    const std::string file_path = join(dir_, manifest_.files[fi].name);
    if (impl_->fds[fi].get() < 0) impl_->fds[fi] = open_regular_file(file_path, "checkpoint file");
    const size_t esize = dtype_size(p.dtype);
    // The bytes of the piece this read needs, widened to whole crc blocks.
    const uint64_t want_b = (std::max(begin, p.begin) - p.begin) * esize;
    const uint64_t want_e = (std::min(end, p.begin + p.count) - p.begin) * esize;
    for (uint64_t block = want_b / kCrcBlockBytes; block * kCrcBlockBytes < want_e; ++block) {
      const uint64_t bb = block * kCrcBlockBytes, be = std::min(p.bytes(), bb + kCrcBlockBytes);
      if (impl_->bounce.size() < be - bb) impl_->bounce.resize(be - bb);
      read_exactly(impl_->fds[fi].get(), impl_->bounce.data(), be - bb, p.offset + bb, file_path);
      impl_->bytes_read += be - bb;
      const uint32_t crc = crc32_of(impl_->bounce.data(), be - bb);
      ZERONE_CHECK(crc == p.crcs[block], "checkpoint file '", file_path, "' is corrupted: checksum mismatch in ", tensor,
                   " of unit ", manifest_.units[unit].name, " (bytes ", p.offset + bb, "..", p.offset + be, ": crc32 ",
                   crc, ", the manifest records ", p.crcs[block], ")");
      // Elements of this block that the read wants.
      const uint64_t eb = std::max(want_b, bb) / esize, ee = std::min(want_e, be) / esize;  // piece-relative
      const char* src = impl_->bounce.data() + (eb * esize - bb);
      char* dst = static_cast<char*>(out) + (p.begin + eb - begin) * out_size;
      const size_t n = ee - eb;
      if (p.dtype == out_dtype) {
        std::memcpy(dst, src, n * esize);
      } else {
        widened.resize(n);
        convert_to_f32(src, p.dtype, widened.data(), n);
        convert_from_f32(widened.data(), dst, out_dtype, n);
      }
    }
  }
}

uint64_t CheckpointReader::bytes_read() const { return impl_->bytes_read; }

void CheckpointReader::verify_files() const {
  std::vector<char> buf(kCrcBlockBytes);
  for (const CheckpointFile& f : manifest_.files) {
    const std::string file_path = join(dir_, f.name);
    FileDescriptor fd = open_regular_file(file_path, "checkpoint file");
    uint32_t crc = 0;
    for (uint64_t off = 0; off < f.bytes; off += kCrcBlockBytes) {
      const uint64_t n = std::min<uint64_t>(kCrcBlockBytes, f.bytes - off);
      read_exactly(fd.get(), buf.data(), n, off, file_path);
      crc = crc32_of(buf.data(), n, crc);
    }
    ZERONE_CHECK(crc == f.crc32, "checkpoint file '", file_path, "' is corrupted: crc32 ", crc, ", the manifest records ",
                 f.crc32);
  }
}

}  // namespace zerone::io
