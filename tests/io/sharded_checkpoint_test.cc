// zerone's sharded checkpoint format (io/sharded_checkpoint.h) below the trainer: pieces larger than
// a checksum block read back in any sub-range (the resharding case) in the stored and in another
// dtype, a damaged block fails only the reads that touch it, the manifest's coverage rules, the
// disk-to-disk copy path, and the directory protocol (publish, latest, keep-last).
#include "zerone/io/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "tests/test_util.h"
#include "zerone/core/dtype.h"
#include "zerone/core/error.h"

namespace zerone::io {
namespace {

using zerone::testing::TempDir;

constexpr uint64_t kBlockFloats = kChecksumBlockBytes / sizeof(float);

// A manifest for one unit of `numel` elements and the given files.
CheckpointManifest manifest_for(uint64_t numel, std::vector<CheckpointFile> files) {
  CheckpointManifest m;
  m.step = 7;
  m.model = "test";
  m.units.push_back({"unit0", numel, {{"w", {static_cast<int64_t>(numel)}, 0}}});
  m.files = std::move(files);
  return m;
}

std::vector<float> ramp(uint64_t n, float scale) {
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * scale + 0.25f;
  return v;
}

// Two rank files of one unit: [0, a) in rank 0, [a, n) in rank 1, each piece several blocks long.
struct TwoRanks {
  TempDir root;
  std::string dir;
  uint64_t a = 2 * kBlockFloats + 12345, n = 5 * kBlockFloats + 777;
  std::vector<float> values = ramp(n, 1e-3f);
  TwoRanks() {
    dir = create_checkpoint_tmp(root.path(), 7);
    CheckpointFileWriter w0(dir, "rank-00000.bin", 7), w1(dir, "rank-00001.bin", 7);
    w0.append(0, "param", DType::f32, 0, a, values.data());
    w1.append(0, "param", DType::f32, a, n - a, values.data() + a);
    dir = publish_checkpoint(root.path(), dir, manifest_for(n, {w0.finish(), w1.finish()}), 0);
  }
};

TEST(ShardedCheckpoint, AnySubRangeReadsBackAcrossBlocksAndFiles) {
  TwoRanks ck;
  CheckpointReader reader(ck.root.path());  // through `latest`
  EXPECT_EQ(reader.manifest().step, 7);
  for (auto [b, e] : std::vector<std::pair<uint64_t, uint64_t>>{{0, ck.n},
                                                                 {1, 2},
                                                                 {kBlockFloats - 3, kBlockFloats + 5},
                                                                 {ck.a - 10, ck.a + 10},
                                                                 {kBlockFloats, 2 * kBlockFloats},
                                                                 {3 * kBlockFloats + 1, ck.n}}) {
    std::vector<float> out(e - b, -1.0f);
    reader.read(0, "param", b, e - b, DType::f32, out.data());
    ASSERT_EQ(0, std::memcmp(out.data(), ck.values.data() + b, out.size() * sizeof(float))) << b << ".." << e;
    std::vector<bf16_t> narrow(e - b);
    reader.read(0, "param", b, e - b, DType::bf16, narrow.data());
    for (uint64_t i = 0; i < e - b; i += 997) ASSERT_EQ(narrow[i], f32_to_bf16(ck.values[b + i]));
  }
  reader.verify_files();
}

TEST(ShardedCheckpoint, ADamagedBlockFailsOnlyTheReadsThatTouchIt) {
  TwoRanks ck;
  const std::string file = ck.dir + "/rank-00001.bin";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(kChecksumBlockBytes + 100));  // rank 1's second block
    char c;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(kChecksumBlockBytes + 100));
    c ^= 0x40;
    f.write(&c, 1);
  }
  CheckpointReader reader(ck.dir);
  std::vector<float> out(100);
  reader.read(0, "param", ck.a, 100, DType::f32, out.data());  // rank 1's first block: fine
  try {
    reader.read(0, "param", ck.a + kBlockFloats + 10, 100, DType::f32, out.data());
    FAIL() << "a corrupted block was read without complaint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank-00001.bin' is corrupted: checksum mismatch in param of unit unit0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(reader.verify_files(), Error);
}

TEST(ShardedCheckpoint, PiecesMustCoverEveryElementOnce) {
  TempDir root;
  std::vector<float> v = ramp(100, 1.0f);
  for (auto pieces : std::vector<std::vector<std::pair<uint64_t, uint64_t>>>{{{0, 60}, {50, 100}},   // overlap
                                                                            {{0, 40}, {50, 100}},   // gap
                                                                            {{0, 90}}}) {          // short
    const std::string dir = create_checkpoint_tmp(root.path(), 1);
    CheckpointFileWriter w(dir, "rank-00000.bin", 1);
    for (auto [b, e] : pieces) w.append(0, "param", DType::f32, b, e - b, v.data() + b);
    const std::string published = publish_checkpoint(root.path(), dir, manifest_for(100, {w.finish()}), 0);
    EXPECT_THROW(CheckpointReader reader(published), Error);
  }
}

TEST(ShardedCheckpoint, CopiesAnExtentOfAnotherFileWithItsKnownChecksums) {
  TempDir root;
  std::vector<float> v = ramp(kBlockFloats + 50, 0.5f);
  const std::string swap = root.file("swap.bin");
  std::vector<char> raw(4096 + v.size() * sizeof(float));
  std::memcpy(raw.data() + 4096, v.data(), v.size() * sizeof(float));
  zerone::testing::write_bytes(swap, raw.data(), raw.size());
  std::vector<uint64_t> sums{checksum_of(v.data(), kChecksumBlockBytes),
                             checksum_of(v.data() + kBlockFloats, 50 * sizeof(float))};
  const std::string dir = create_checkpoint_tmp(root.path(), 2);
  CheckpointFileWriter w(dir, "rank-00000.bin", 2);
  EXPECT_EQ(w.append_from_file(0, "param", DType::f32, 0, v.size(), swap, 4096, sums), v.size() * sizeof(float));
  const std::string published = publish_checkpoint(root.path(), dir, manifest_for(v.size(), {w.finish()}), 0);
  CheckpointReader reader(published);
  std::vector<float> out(v.size());
  reader.read(0, "param", 0, v.size(), DType::f32, out.data());
  EXPECT_EQ(0, std::memcmp(out.data(), v.data(), out.size() * sizeof(float)));
  reader.verify_files();
}

TEST(ShardedCheckpoint, PublishPointsLatestAtTheNewestAndKeepsTheLastK) {
  TempDir root;
  std::vector<float> v = ramp(10, 1.0f);
  for (int64_t step : {1, 2, 3, 4}) {
    const std::string dir = create_checkpoint_tmp(root.path(), step);
    CheckpointFileWriter w(dir, "rank-00000.bin", step);
    w.append(0, "param", DType::f32, 0, 10, v.data());
    CheckpointManifest m = manifest_for(10, {w.finish()});
    m.step = step;
    publish_checkpoint(root.path(), dir, m, 2);
    EXPECT_EQ(find_latest_checkpoint(root.path()).value(), root.path() + "/" + checkpoint_step_name(step));
  }
  struct stat st;
  EXPECT_NE(::stat((root.path() + "/step-00000002").c_str(), &st), 0);
  EXPECT_EQ(::stat((root.path() + "/step-00000003").c_str(), &st), 0);
  EXPECT_EQ(::stat((root.path() + "/step-00000004").c_str(), &st), 0);
  // A writer destroyed before finish() leaves no file behind.
  const std::string dir = create_checkpoint_tmp(root.path(), 5);
  { CheckpointFileWriter w(dir, "rank-00000.bin", 5); }
  EXPECT_NE(::stat((dir + "/rank-00000.bin").c_str(), &st), 0);
  // Nothing to resume from: a missing root, an empty root.
  EXPECT_FALSE(find_latest_checkpoint(root.file("nothing")).has_value());
  TempDir empty;
  EXPECT_FALSE(find_latest_checkpoint(empty.path()).has_value());
}

}  // namespace
}  // namespace zerone::io
