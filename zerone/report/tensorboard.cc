#include "zerone/report/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "zerone/core/error.h"

namespace zerone::report {

namespace {

// The reflected CRC-32C table (polynomial 0x82F63B78).
std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian hosts (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}

void put_key(std::string& out, int field, int wire_type) { put_varint(out, static_cast<uint64_t>(field) << 3 | wire_type); }

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// A protobuf message being read (its own copy of the bytes); every accessor throws on malformed input.
class ProtoReader {
 public:
  ProtoReader(std::string data, const std::string& where)
      : data_(std::move(data)), p_(data_.data()), end_(data_.data() + data_.size()), where_(where) {}
  ProtoReader(const ProtoReader&) = delete;
  ProtoReader& operator=(const ProtoReader&) = delete;
  bool done() const { return p_ == end_; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      ZERONE_CHECK(p_ < end_, where_, ": truncated varint");
      const uint8_t b = static_cast<uint8_t>(*p_++);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw Error(str_cat(where_, ": varint longer than 10 bytes"));
  }
  template <typename T>
  T fixed() {
    ZERONE_CHECK(end_ - p_ >= static_cast<ptrdiff_t>(sizeof(T)), where_, ": truncated fixed field");
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string bytes() {
    const uint64_t n = varint();
    ZERONE_CHECK(static_cast<uint64_t>(end_ - p_) >= n, where_, ": a length-delimited field runs past the end");
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  void skip(int wire_type) {
    switch (wire_type) {
      case 0: varint(); break;
      case 1: fixed<uint64_t>(); break;
      case 2: bytes(); break;
      case 5: fixed<uint32_t>(); break;
      default: throw Error(str_cat(where_, ": unsupported wire type ", wire_type));
    }
  }

 private:
  std::string data_;
  const char* p_;
  const char* end_;
  std::string where_;
};

}  // namespace

uint32_t crc32c(const void* data, size_t bytes) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t bytes) {
  const uint32_t c = crc32c(data, bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string encode_version_event(double wall_time_s) {
  std::string e;
  put_key(e, 1, 1);
  put_fixed<double>(e, wall_time_s);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string encode_scalar_event(const ScalarEvent& event) {
  std::string value;
  put_bytes(value, 1, event.tag);
  put_key(value, 2, 5);
  put_fixed<float>(value, event.value);
  std::string summary;
  put_bytes(summary, 1, value);
  std::string e;
  put_key(e, 1, 1);
  put_fixed<double>(e, event.wall_time_s);
  put_key(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(event.step));
  put_bytes(e, 5, summary);
  return e;
}

EventFileWriter::EventFileWriter(const std::string& dir, const std::string& what) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  path_ = str_cat(dir, dir.empty() || dir.back() == '/' ? "" : "/", "events.out.tfevents.", static_cast<int64_t>(now), ".", host, ".",
                  ::getpid(), ".0");
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  ZERONE_CHECK(fd_ >= 0, what, ": cannot create event file '", path_, "': ", std::strerror(errno));
  if (int err = write_record(encode_version_event(now)); err != 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
    throw Error(str_cat(what, ": cannot write event file '", path_, "': ", std::strerror(err)));
  }
}

EventFileWriter::~EventFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

int EventFileWriter::add_scalar(const ScalarEvent& event) { return write_record(encode_scalar_event(event)); }

int EventFileWriter::write_record(const std::string& data) {
  std::string record;
  put_fixed<uint64_t>(record, data.size());
  put_fixed<uint32_t>(record, masked_crc32c(record.data(), 8));
  record += data;
  put_fixed<uint32_t>(record, masked_crc32c(data.data(), data.size()));
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      // O_APPEND: cut a partial record off again so that readers see whole records only.
      if (done > 0) {
        const off_t end = ::lseek(fd_, 0, SEEK_END);
        if (end >= static_cast<off_t>(done) && ::ftruncate(fd_, end - static_cast<off_t>(done)) != 0) return err;
      }
      return err;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

EventFile read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ZERONE_CHECK(in.good(), "cannot open event file '", path, "': ", std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  EventFile file;
  size_t pos = 0;
  while (pos < text.size()) {
    const std::string where = str_cat("event file '", path, "' record ", file.records + 1, " at byte ", pos);
    ZERONE_CHECK(text.size() - pos >= 12, where, ": truncated header");
    uint64_t length;
    uint32_t length_crc;
    std::memcpy(&length, text.data() + pos, 8);
    std::memcpy(&length_crc, text.data() + pos + 8, 4);
    ZERONE_CHECK(length_crc == masked_crc32c(text.data() + pos, 8), where, ": the length's CRC does not match");
    ZERONE_CHECK(text.size() - pos - 12 >= length + 4, where, ": truncated (", length, " bytes of data announced)");
    const std::string data = text.substr(pos + 12, length);
    uint32_t data_crc;
    std::memcpy(&data_crc, text.data() + pos + 12 + length, 4);
    ZERONE_CHECK(data_crc == masked_crc32c(data.data(), data.size()), where, ": the data's CRC does not match");
    pos += 12 + length + 4;
    ++file.records;
    ProtoReader event(data, where);
    double wall_time = 0;
    int64_t step = 0;
    std::vector<std::pair<std::string, float>> values;
    while (!event.done()) {
      const uint64_t key = event.varint();
      const int field = static_cast<int>(key >> 3), type = static_cast<int>(key & 7);
      if (field == 1 && type == 1) wall_time = event.fixed<double>();
      else if (field == 2 && type == 0) step = static_cast<int64_t>(event.varint());
      else if (field == 3 && type == 2) {
        const std::string version = event.bytes();
        if (file.records == 1) file.file_version = version;
      } else if (field == 5 && type == 2) {
        ProtoReader summary(event.bytes(), where + " summary");
        while (!summary.done()) {
          const uint64_t skey = summary.varint();
          if (skey >> 3 != 1 || (skey & 7) != 2) {
            summary.skip(static_cast<int>(skey & 7));
            continue;
          }
          ProtoReader value(summary.bytes(), where + " summary value");
          std::string tag;
          std::optional<float> simple;
          while (!value.done()) {
            const uint64_t vkey = value.varint();
            if (vkey == (1 << 3 | 2)) tag = value.bytes();
            else if (vkey == (2 << 3 | 5)) simple = value.fixed<float>();
            else value.skip(static_cast<int>(vkey & 7));
          }
          if (simple) values.emplace_back(tag, *simple);
        }
      } else {
        event.skip(type);
      }
    }
    for (auto& [tag, v] : values) file.scalars.push_back(ScalarEvent{wall_time, step, tag, v});
  }
  return file;
}

}  // namespace zerone::report
