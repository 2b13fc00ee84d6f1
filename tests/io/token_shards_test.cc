#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "tests/test_util.h"
#include "zerone/io/token_shards.h"

namespace zerone::io {
namespace {

using zerone::testing::expect_error;
using zerone::testing::TempDir;
using zerone::testing::write_bytes;

std::vector<int32_t> iota(size_t n, int32_t mod) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i % mod);
  return v;
}

TEST(TokenShards, RoundTripsBothVersionsAcrossFiles) {
  TempDir dir;
  write_token_shard(dir.file("d_000.bin"), iota(100, 1000));
  std::vector<int32_t> big = iota(50, 1000);
  big[3] = 70000;  // needs uint32: version 7
  write_token_shard(dir.file("d_001.bin"), big);
  auto raw = zerone::testing::read_bytes(dir.file("d_001.bin"));
  int32_t header[3];
  std::memcpy(header, raw.data(), sizeof header);
  EXPECT_EQ(header[0], kShardMagicU32);
  EXPECT_EQ(header[1], 7);
  TokenDataset data(dir.file("d_*.bin"));
  EXPECT_EQ(data.num_files(), 2u);
  ASSERT_EQ(data.num_tokens(), 150u);
  std::vector<int32_t> out(20);
  data.read(90, 20, out.data(), 100000);  // crosses the file boundary
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out[i], 90 + i);
  EXPECT_EQ(out[13], 70000);
}

TEST(TokenShards, BadFilesGiveClearErrors) {
  TempDir dir;
  expect_error([&] { TokenDataset d(dir.file("none_*.bin")); }, "no file matches");
  write_bytes(dir.file("short.bin"), "abc", 3);
  expect_error([&] { TokenDataset d(dir.file("short.bin")); }, "truncated");
  int32_t header[256] = {12345, 1, 0};
  write_bytes(dir.file("magic.bin"), header, sizeof header);
  expect_error([&] { TokenDataset d(dir.file("magic.bin")); }, "magic 12345");
  header[0] = kShardMagicU16;
  header[1] = 3;
  write_bytes(dir.file("version.bin"), header, sizeof header);
  expect_error([&] { TokenDataset d(dir.file("version.bin")); }, "version 3");
  header[1] = 1;
  header[2] = 10;  // claims 10 tokens, holds none
  write_bytes(dir.file("cut.bin"), header, sizeof header);
  expect_error([&] { TokenDataset d(dir.file("cut.bin")); }, "truncated");
}

TEST(TokenShards, TokenOutsideVocabularyNamesFileAndPosition) {
  TempDir dir;
  std::vector<int32_t> t = iota(20, 10);
  t[7] = 600;
  write_token_shard(dir.file("t.bin"), t);
  TokenDataset data(dir.file("t.bin"));
  std::vector<int32_t> out(20);
  expect_error([&] { data.read(0, 20, out.data(), 512); }, "token 600 at position 7");
}

TEST(DataLoader, NoShuffleReadsConsecutiveChunksAsLlmc) {
  InMemoryTokens tokens(iota(1000, 1000));
  DataLoader loader(tokens, 2, 4, 1000, /*shuffle=*/false, 0);
  std::vector<int32_t> x(8), y(8);
  loader.load(3 * 2, x.data(), y.data());  // step 3 (samples 6, 7) starts at token 3 * B * T = 24
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(x[i], 24 + i);
    EXPECT_EQ(y[i], 25 + i);
  }
  EXPECT_EQ(loader.samples_per_epoch(), 249u);  // (1000 - 1) / 4
  EXPECT_EQ(loader.batches_per_epoch(), 124u);
  loader.load(248, x.data(), y.data());  // the last sample of the epoch, then the first of the next
  const std::vector<int32_t> straddle = {992, 993, 994, 995, 0, 1, 2, 3};
  EXPECT_EQ(x, straddle);
  EXPECT_EQ(y[3], 996);
  EXPECT_EQ(y[7], 4);
}

// Note [Samples]: the samples a stream position names do not depend on the micro-batch.
TEST(DataLoader, SamplesDoNotDependOnTheMicroBatch) {
  InMemoryTokens tokens(iota(801, 1000));
  for (bool shuffle : {false, true}) {
    DataLoader by1(tokens, 1, 8, 1000, shuffle, 42), by3(tokens, 3, 8, 1000, shuffle, 42);
    std::vector<int32_t> x1(8), y1(8), x3(24), y3(24);
    for (uint64_t first = 0; first < 300; first += 3) {  // crosses three epochs of 100 samples
      by3.load(first, x3.data(), y3.data());
      for (int b = 0; b < 3; ++b) {
        by1.load(first + b, x1.data(), y1.data());
        EXPECT_TRUE(std::equal(x1.begin(), x1.end(), x3.begin() + b * 8)) << "sample " << first + b;
        EXPECT_TRUE(std::equal(y1.begin(), y1.end(), y3.begin() + b * 8)) << "sample " << first + b;
      }
    }
  }
}

TEST(DataLoader, ShuffleIsADeterministicPermutationPerEpoch) {
  InMemoryTokens tokens(iota(801, 1000));
  DataLoader a(tokens, 1, 8, 1000, true, 42), b(tokens, 1, 8, 1000, true, 42);
  std::vector<int32_t> x(8), y(8), x2(8), y2(8);
  std::set<int32_t> starts;
  for (uint64_t c = 0; c < 100; ++c) {
    a.load(c, x.data(), y.data());
    b.load(c, x2.data(), y2.data());
    EXPECT_EQ(x, x2);
    EXPECT_EQ(x[0] % 8, 0);
    starts.insert(x[0]);
  }
  EXPECT_EQ(starts.size(), 100u) << "every sample once per epoch";
}

TEST(DataLoader, TooFewTokensIsAnError) {
  InMemoryTokens tokens(iota(8, 10));
  expect_error([&] { DataLoader l(tokens, 2, 4, 10, false, 0); }, "fewer than one batch");
}

}  // namespace
}  // namespace zerone::io
