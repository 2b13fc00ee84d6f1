// zerone's own checkpoints: a directory per saved step, written by every rank in parallel, readable
// at any world size, ZeRO stage or offload setting (DESIGN §4).
//
// Note [Checkpoint layout]:
//   ROOT/latest                 text "step-00000100\n": the newest complete checkpoint, replaced
//                               atomically after that checkpoint is in place
//   ROOT/step-00000100/         one saved step, renamed into place only when complete:
//     manifest.json             written by rank 0 last: format, version, step, model spec and unit
//                               layout (tensor names, shapes, offsets), precision, world size,
//                               stage, offload, optimizer, the trainer's state, and for every rank
//                               file its size, checksum and the pieces it holds
//     rank-00000.bin ...        raw little-endian tensor bytes, one file per saving rank
//   ROOT/.tmp-step-00000100/    a save in progress (a crashed save's leftovers are removed by the next)
// A piece is a run of elements [begin, begin+count) of one tensor ("param" in the compute dtype,
// or an optimizer state in f32: "master", "exp_avg", ...) of one unit's flat, unpadded buffer. Each
// piece carries a checksum per kChecksumBlockBytes block, so a reader that needs only part of it
// (another world size) verifies what it reads without reading the rest.
//
// Note [Checksums]: XXH3-64 (Debian's libxxhash), not crc32: zlib's crc32 runs at ~1 GB/s per core
// here, below the disk, while XXH3 runs at memory speed. A file's checksum is the XXH3-64 of its
// blocks' checksums in file order (a hash list), so it costs nothing extra to write and a whole-file
// verification reads each byte once. Pieces of a (unit, tensor) from all
// files together cover [0, numel) exactly once; the reader checks that before anything is loaded.
//
// Note [Atomic checkpoints]: a save writes ROOT/.tmp-step-N/, fsyncs every file and the directory,
// renames it to ROOT/step-N, fsyncs ROOT, then replaces ROOT/latest (write, fsync, rename, fsync).
// A process killed at any instant leaves either the previous `latest` (and its directory) or the
// new one, both complete. Older checkpoints beyond --keep-last are removed only after `latest`
// points at the new one.
//
// Thread-safety: a CheckpointFileWriter is used by one thread at a time (it may be a background
// thread); a CheckpointReader may be read from one thread at a time; the free functions are
// independent.
#pragma once

#include "zerone/io/fault_env.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "zerone/core/dtype.h"
#include "zerone/io/file.h"

namespace zerone::nn {
class Model;
}

namespace zerone::io {

inline constexpr const char* kCheckpointFormat = "zerone-checkpoint";
inline constexpr int kCheckpointVersion = 1;
inline constexpr uint64_t kChecksumBlockBytes = uint64_t{16} << 20;

struct CheckpointPiece {
  int unit = 0;
  std::string tensor;
  DType dtype = DType::f32;
  uint64_t begin = 0, count = 0;  // elements
  uint64_t offset = 0;            // bytes from the start of the file
  std::vector<uint64_t> checksums;  // XXH3-64 of each kChecksumBlockBytes of the piece's bytes (the last may be short)
  uint64_t bytes() const { return count * dtype_size(dtype); }
};

struct CheckpointFile {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint64_t checksum = 0;  // XXH3-64 of the file's block checksums in file order (Note [Checksums])
  std::vector<CheckpointPiece> pieces;
};

struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // elements from the start of the unit
};
struct CheckpointUnit {
  std::string name;
  uint64_t numel = 0;
  std::vector<CheckpointTensor> tensors;
};

struct CheckpointManifest {
  int version = kCheckpointVersion;
  int64_t step = 0;
  std::string model;  // spec string (nn::make_model)
  DType dtype = DType::f32;
  int world_size = 1;
  int zero_stage = 0;
  std::string offload_optimizer = "none", offload_param = "none";
  std::vector<CheckpointUnit> units;
  std::string optimizer;                  // "adamw", "sgd", or "" (weights only)
  std::vector<std::string> optimizer_state;  // state tensor names every unit has (f32)
  int64_t optimizer_steps = 0;
  nlohmann::json trainer = nlohmann::json::object();  // the trainer's own state (train/checkpoint.h)
  std::vector<CheckpointFile> files;
};

nlohmann::json manifest_to_json(const CheckpointManifest& manifest);
// An integer of a manifest in [lo, hi] (numbers written as floats, strings, values beyond 64 bits
// are not), or nullopt; the caller's error prints the value as written (json.dump()).
std::optional<int64_t> manifest_integer(const nlohmann::json& value, int64_t lo, int64_t hi);
// One file's entry of the manifest (ranks send theirs to rank 0 in this form).
nlohmann::json checkpoint_file_to_json(const CheckpointFile& file);
// Throws Error naming `what` for anything missing or malformed.
CheckpointFile checkpoint_file_from_json(const nlohmann::json& json, const std::string& what);
// Throws Error naming `what` (the manifest's path) and the key for anything missing or malformed,
// and for another format or an unknown version.
CheckpointManifest manifest_from_json(const nlohmann::json& json, const std::string& what);

// The units' layout (names, numels, tensors) of `model`, as a manifest records it.
std::vector<CheckpointUnit> checkpoint_units(const nn::Model& model);

// XXH3-64 of `bytes` at `data` (Note [Checksums]).
uint64_t checksum_of(const void* data, size_t bytes);

// Writes one rank's data file. The file is created new (an existing one is an error) and removed
// again if the writer is destroyed before finish(). Throws Error naming the file and the failed
// operation (a full disk: "No space left on device").
class CheckpointFileWriter {
 public:
  // `step`: the step being saved; `env`: where crash points come from (Note [Crash points]).
  CheckpointFileWriter(const std::string& dir, const std::string& name, int64_t step,
                       const FaultEnv& env = FaultEnv::none());
  ~CheckpointFileWriter();
  CheckpointFileWriter(const CheckpointFileWriter&) = delete;
  CheckpointFileWriter& operator=(const CheckpointFileWriter&) = delete;

  // Appends `count` elements of `dtype` at `data` as elements [begin, begin+count) of `tensor` of
  // `unit`. `data` is only read during the call. With two or more OpenMP threads available the
  // checksums are computed on one while the bytes are written on the other.
  void append(int unit, const std::string& tensor, DType dtype, uint64_t begin, uint64_t count, const void* data);
  // The same piece taken from bytes [offset, offset + count*size) of the file at `path`, whose
  // block checksums the caller already knows: copied disk to disk (copy_file_range; a buffered
  // copy where the kernel cannot), never hashed again (Note [Checkpoints of swapped state] in
  // optim/adamw.h). Returns the bytes copied.
  uint64_t append_from_file(int unit, const std::string& tensor, DType dtype, uint64_t begin, uint64_t count,
                            const std::string& path, uint64_t offset, const std::vector<uint64_t>& checksums);
  // Makes the file durable (fsync) and closes it; returns what the manifest records of it.
  CheckpointFile finish();

 private:
  // A piece starting at the end of the file; commit() records it once its bytes are written.
  CheckpointPiece next_piece(int unit, const std::string& tensor, DType dtype, uint64_t begin, uint64_t count) const;
  void commit(CheckpointPiece piece);

  std::string path_;
  const FaultEnv& env_;
  int64_t step_;
  FileDescriptor fd_;
  CheckpointFile file_;
  std::vector<uint64_t> block_checksums_;  // every block of the file so far, in order
  bool finished_ = false;
};

// The checkpoint directory names.
std::string checkpoint_step_name(int64_t step);  // "step-00000100"

// What `root` holds, for --resume: the path of the checkpoint `latest` names, or nullopt when there
// is nothing to resume from (`root` missing or empty, or holding only a crashed save's temporary).
// Without `latest` (a process killed between a step directory's rename and the pointer's), the
// newest step directory whose manifest parses and checks is taken, and `notice` (optional) says so.
// Throws Error naming the path for `latest` naming a missing or incomplete directory, or a `root`
// that holds something that is not zerone checkpoints.
std::optional<std::string> find_latest_checkpoint(const std::string& root, std::string* notice = nullptr);

// Note [One run per checkpoint directory]: two runs saving into one root would replace and prune
// each other's checkpoints. A run holds an exclusive flock(2) on ROOT/.zerone-lock (which holds its
// pid, for the message) from start-up to exit; the kernel releases it however the process ends, so
// a killed run never leaves a stale lock (on a filesystem without flock the run goes unguarded).
// Under MPI rank 0 holds it for the job. A run that is not
// --resume'd refuses a root that already holds checkpoints (describe_checkpoint_run), so it never
// moves `latest` back to its own step 1 or prunes another run's steps.
class CheckpointDirLock {
 public:
  // Takes the lock on `root` (an existing directory). Throws Error naming the root and the
  // process that holds it.
  explicit CheckpointDirLock(const std::string& root);
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  FileDescriptor fd_;
};
// "'latest' names step-00000030" or "it holds step-00000010 .. step-00000020": what marks `root`
// as another run's checkpoints; nullopt when it holds none.
std::optional<std::string> describe_checkpoint_run(const std::string& root);
// Start-up sweep under the lock (Note [Stale temporaries] in io/file.h): removes the temporaries
// of saves that were killed (.tmp-step-*, latest.tmp.<pid> of a process that is gone). Never throws.
void remove_stale_checkpoint_temporaries(const std::string& root) noexcept;
// Whether `path` is one checkpoint directory (holds manifest.json).
bool is_checkpoint_directory(const std::string& path);
// A checkpoint directory given as either a checkpoint or a root with `latest` (zerone convert,
// --init). Throws Error naming the path when it is neither.
std::string resolve_checkpoint_path(const std::string& path);

// Start-up check of --checkpoint-dir: it exists as a directory (or can be created: its parent
// exists) and is writable, probed by creating and removing a file. Throws Error naming `what`.
void check_checkpoint_root(const std::string& root, const std::string& what);

// The temporary directory of the save of `step` under `root`: created empty (a leftover of the
// same name from a crashed save is removed first). Returns its path. Throws Error.
std::string create_checkpoint_tmp(const std::string& root, int64_t step);
// Writes manifest.json into `tmp`, fsyncs `tmp`, renames it to ROOT/step-N, fsyncs ROOT, points
// `latest` at it, then removes checkpoints beyond the newest `keep_last` (0: keep all) and stale
// temporaries. Returns the final path. Throws Error naming what failed; `latest` then still names
// the previous checkpoint.
std::string publish_checkpoint(const std::string& root, const std::string& tmp, const CheckpointManifest& manifest,
                               int keep_last, const FaultEnv& env = FaultEnv::none());
// Removes a directory tree (best effort, for temporaries). Never throws.
void remove_tree(const std::string& path) noexcept;

// A checkpoint opened for reading: the manifest parsed and checked (format, version, every file
// present with the recorded size, every (unit, tensor) covered exactly once), files opened lazily.
class CheckpointReader {
 public:
  // `dir` is a checkpoint directory (or a root with `latest`). Throws Error naming the path.
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return dir_; }
  const CheckpointManifest& manifest() const { return manifest_; }
  // Checks that the manifest's units are `model`'s (names, sizes, tensor names, shapes, offsets),
  // before anything is read into it. Throws Error naming the first unit that differs.
  void check_layout(const nn::Model& model) const;
  bool has_tensor(const std::string& tensor) const;
  // The dtype `tensor` is stored in. Throws Error if absent.
  DType tensor_dtype(const std::string& tensor) const;
  // Reads elements [begin, begin+count) of `tensor` of `unit` into `out`, converted to `out_dtype`
  // (widening is exact; narrowing rounds to nearest even). Every checksum block it touches is read
  // whole and verified (the next block is read ahead). Throws Error naming the file and the tensor
  // on a checksum mismatch or a read failure. Blocks are read on the OpenMP team. Memory: one block
  // of bounce buffer per thread, only for blocks not wanted whole in their stored dtype.
  void read(int unit, const std::string& tensor, uint64_t begin, uint64_t count, DType out_dtype, void* out) const;
  // Reads every file whole and checks its checksum against the manifest.
  void verify_files() const;
  // Bytes read from the data files so far (whole checksum blocks), and the seconds spent in read().
  uint64_t bytes_read() const;
  double read_seconds() const;

 private:
  struct Impl;
  std::string dir_;
  CheckpointManifest manifest_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zerone::io
