// zerone/report: TensorBoard event files (framing, CRC-32C, the Event protobuf) read back by the
// reader, damaged files refused; the CSV monitor's layout; SVG charts' point counts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "zerone/core/error.h"
#include "zerone/report/monitors.h"
#include "zerone/report/svg_chart.h"
#include "zerone/report/tensorboard.h"

namespace zerone::report {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("zerone_report_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Crc32c, CheckValues) {
  // The CRC-32C check value (RFC 3720 / the Castagnoli catalogue) and the iSCSI test vector of 32 zeros.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  const uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(EventFile, ProtobufBytes) {
  // Hand-assembled from the Event/Summary field numbers: wall_time (1, fixed64), step (2, varint),
  // file_version (3, bytes), summary (5) { value (1) { tag (1), simple_value (2, fixed32) } }.
  const std::string version = encode_version_event(0.0);
  EXPECT_EQ(version, std::string("\x09\0\0\0\0\0\0\0\0\x1a\x0d" "brain.Event:2", 24));
  const std::string scalar = encode_scalar_event({0.0, 3, "a", 1.0f});
  EXPECT_EQ(scalar, std::string("\x09\0\0\0\0\0\0\0\0\x10\x03\x2a\x0a\x0a\x08\x0a\x01" "a\x15\x00\x00\x80\x3f", 23));
  // A step beyond 127 takes a two-byte varint: 300 = 0xac 0x02.
  EXPECT_NE(encode_scalar_event({0.0, 300, "a", 1.0f}).find("\x10\xac\x02"), std::string::npos);
}

TEST(EventFile, WrittenFileReadsBack) {
  const fs::path dir = temp_dir() / "tb";
  fs::create_directories(dir);
  std::string path;
  {
    EventFileWriter w(dir.string(), "--tensorboard");
    path = w.path();
    EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
    for (int i = 1; i <= 200; ++i) {
      ASSERT_EQ(w.add_scalar({1.7e9 + i, i * 64, "Train/Samples/train_loss", 5.0f / i}), 0);
      ASSERT_EQ(w.add_scalar({1.7e9 + i, i * 64, "Train/Samples/lr", 1e-3f}), 0);
    }
  }
  const EventFile f = read_event_file(path);
  EXPECT_EQ(f.file_version, "brain.Event:2");
  EXPECT_EQ(f.records, 401);
  ASSERT_EQ(f.scalars.size(), 400u);
  for (int i = 1; i <= 200; ++i) {
    const ScalarEvent& loss = f.scalars[2 * (i - 1)];
    EXPECT_EQ(loss.tag, "Train/Samples/train_loss");
    EXPECT_EQ(loss.step, i * 64);
    EXPECT_EQ(loss.value, 5.0f / i);
    EXPECT_EQ(loss.wall_time_s, 1.7e9 + i);
    EXPECT_EQ(f.scalars[2 * (i - 1) + 1].tag, "Train/Samples/lr");
  }

  // Damage: a flipped data byte, a flipped length byte, a truncated tail; each named.
  const std::string good = read_all(path);
  auto expect_refused = [&](std::string bytes, const std::string& what) {
    const fs::path bad = dir / "bad";
    std::ofstream(bad, std::ios::binary) << bytes;
    try {
      read_event_file(bad.string());
      ADD_FAILURE() << "accepted a file with " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  expect_refused(flipped, "CRC does not match");
  std::string length = good;
  length[0] ^= 1;
  expect_refused(length, "the length's CRC does not match");
  expect_refused(good.substr(0, good.size() - 3), "truncated");
  fs::remove_all(dir.parent_path());
}

TEST(CsvMonitor, DeepSpeedLayoutAndResume) {
  const fs::path dir = temp_dir() / "csv" / "job";
  {
    Monitors m("", "", dir.string(), "--csv-monitor", -1);
    for (int i = 1; i <= 4; ++i)
      ASSERT_FALSE(m.write({{"Train/Samples/train_loss", 1.0 / i, i * 8}, {"Train/Samples/lr", 0.5, i * 8}}, 0.0));
  }
  EXPECT_EQ(csv_file_name("Train/Samples/train_loss"), "Train_Samples_train_loss.csv");
  EXPECT_EQ(read_all(dir / "Train_Samples_train_loss.csv"), "step,train_loss\n8,1\n16,0.5\n24,0.3333333\n32,0.25\n");
  EXPECT_EQ(read_all(dir / "Train_Samples_lr.csv"), "step,lr\n8,0.5\n16,0.5\n24,0.5\n32,0.5\n");
  {
    // Resumed after 16 samples: rows 24 and 32 (written past the checkpoint) are replaced.
    Monitors m("", "", dir.string(), "--csv-monitor", 16);
    ASSERT_FALSE(m.write({{"Train/Samples/train_loss", 0.9, 24}}, 0.0));
  }
  EXPECT_EQ(read_all(dir / "Train_Samples_train_loss.csv"), "step,train_loss\n8,1\n16,0.5\n24,0.9\n");
  {
    // A new run starts afresh.
    Monitors m("", "", dir.string(), "--csv-monitor", -1);
    ASSERT_FALSE(m.write({{"Train/Samples/train_loss", 2.0, 8}}, 0.0));
  }
  EXPECT_EQ(read_all(dir / "Train_Samples_train_loss.csv"), "step,train_loss\n8,2\n");
  // A directory under a regular file cannot be created: an error naming the setting.
  std::ofstream(dir / "file") << "x";
  try {
    Monitors m("", "", (dir / "file" / "sub").string(), "csv_monitor", -1);
    ADD_FAILURE() << "accepted a directory under a file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("csv_monitor"), std::string::npos) << e.what();
  }
  fs::remove_all(dir.parent_path().parent_path());
}

TEST(SvgChart, OnePointPerValueThenThinned) {
  auto count_points = [](const std::string& svg) {
    const size_t at = svg.find("points=\"");
    const size_t end = svg.find('"', at + 8);
    size_t n = 1;
    for (size_t i = at + 8; i < end; ++i) n += svg[i] == ' ';
    return n;
  };
  Series s{"run", "loss", {}, {}, "#000"};
  for (int i = 0; i < 100; ++i) {
    s.x.push_back(i + 1);
    s.y.push_back(1.0 / (i + 1));
  }
  EXPECT_EQ(count_points(line_chart_svg({"c", "t", "x", "y"}, {s})), 100u);
  for (int i = 100; i < 100000; ++i) {
    s.x.push_back(i + 1);
    s.y.push_back(1.0 / (i + 1) + (i % 7) * 1e-6);
  }
  const std::string thinned = line_chart_svg({"c", "t", "x", "y"}, {s});
  EXPECT_LE(count_points(thinned), kMaxPoints);
  EXPECT_NE(thinned.find("data-thinned=\"1\""), std::string::npos);
  // Names are escaped.
  s.run = "<a&b>";
  EXPECT_NE(line_chart_svg({"c", "t", "x", "y"}, {s}).find("&lt;a&amp;b&gt;"), std::string::npos);
  EXPECT_EQ(line_chart_svg({"c", "t", "x", "y"}, {}), "");
}

}  // namespace
}  // namespace zerone::report
