// TensorBoard event files: the writer behind DeepSpeed's `tensorboard` block (--tensorboard) and a
// reader for tests and tools.
//
// Note [Event file format]: a file is a sequence of TFRecords, each
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// where masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 over CRC-32C (Castagnoli).
// Each data is a serialized tensorflow.Event protobuf: wall_time (field 1, double), step (2,
// int64), file_version (3, string; the first record: "brain.Event:2"), summary (5, a Summary
// whose repeated value (1) holds tag (1, string) and simple_value (2, float)). The handful of
// protobuf fields is encoded here directly (varints, fixed64/32, length-delimited): libprotobuf
// would need the TensorFlow .proto files and a code generator for five fields. File name:
// events.out.tfevents.<unix seconds>.<host>.<pid>.0, as TensorBoard's writers name them.
// Each record is written whole with one write(2), so TensorBoard can read a file while it grows.
// Thread-safety: one writer per thread; the functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zerone::report {

uint32_t crc32c(const void* data, size_t bytes);
uint32_t masked_crc32c(const void* data, size_t bytes);

struct ScalarEvent {
  double wall_time_s = 0.0;
  int64_t step = 0;
  std::string tag;
  float value = 0.0f;
};

class EventFileWriter {
 public:
  // Creates a new event file in the existing directory `dir` and writes its version record.
  // Throws Error naming `what` (the flag or config key) and the path when it cannot.
  EventFileWriter(const std::string& dir, const std::string& what);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;
  // Appends one scalar record; returns errno (0: written) and never throws.
  int add_scalar(const ScalarEvent& event);
  const std::string& path() const { return path_; }

 private:
  int write_record(const std::string& data);
  std::string path_;
  int fd_ = -1;
};

// Serialized Event protobufs (Note [Event file format]).
std::string encode_version_event(double wall_time_s);
std::string encode_scalar_event(const ScalarEvent& event);

struct EventFile {
  std::string file_version;          // of the first record
  std::vector<ScalarEvent> scalars;  // every simple_value, in file order
  int records = 0;
};

// Reads a whole event file, verifying both CRCs of every record; throws Error naming the file,
// the record and what is wrong (a bad CRC, a truncated record, a malformed protobuf).
EventFile read_event_file(const std::string& path);

}  // namespace zerone::report
