#include "zerone/io/token_shards.h"

#include <algorithm>
#include <cstring>

#include "zerone/core/error.h"
#include "zerone/core/rng.h"

namespace zerone::io {

TokenDataset::TokenDataset(const std::string& pattern, const std::string& what) {
  for (const std::string& path : glob_files(pattern, what)) {
    size_t size = 0;
    FileDescriptor fd = open_regular_file(path, what, &size);
    const size_t header_bytes = kShardHeaderInts * sizeof(int32_t);
    ZERONE_CHECK(size >= header_bytes, "token shard '", path, "' is truncated: ", size,
                 " bytes, expected at least the ", header_bytes, "-byte header");
    int32_t header[kShardHeaderInts];
    read_exactly(fd.get(), header, header_bytes, 0, path);
    int bytes_per_token = 0;
    if (header[0] == kShardMagicU16) {
      ZERONE_CHECK(header[1] == 1, "token shard '", path, "': version ", header[1], " with magic 20240520, expected 1");
      bytes_per_token = 2;
    } else if (header[0] == kShardMagicU32) {
      ZERONE_CHECK(header[1] == 7, "token shard '", path, "': version ", header[1], " with magic 20240801, expected 7");
      bytes_per_token = 4;
    } else {
      throw Error(str_cat("'", path, "' is not an llm.c token shard: magic ", header[0],
                          ", expected 20240520 (uint16 tokens) or 20240801 (uint32 tokens)"));
    }
    ZERONE_CHECK(header[2] >= 0, "token shard '", path, "': negative token count ", header[2]);
    size_t n = static_cast<size_t>(header[2]);
    size_t expected = header_bytes + n * bytes_per_token;
    ZERONE_CHECK(size == expected, "token shard '", path, "' is ", size < expected ? "truncated" : "too long",
                 ": header says ", n, " tokens (", expected, " bytes), the file has ", size, " bytes");
    files_.push_back(Shard{path, std::move(fd), total_tokens_, n, bytes_per_token});
    total_tokens_ += n;
  }
}

size_t TokenDataset::shard_of(size_t position) const {
  // Few shards: a linear scan is fine.
  size_t s = 0;
  while (s + 1 < files_.size() && files_[s].first_token + files_[s].num_tokens <= position) ++s;
  return s;
}

void TokenDataset::read_raw(const Shard& shard, size_t local, size_t count, uint32_t* out) const {
  const uint64_t offset = kShardHeaderInts * sizeof(int32_t) + static_cast<uint64_t>(local) * shard.bytes_per_token;
  if (shard.bytes_per_token == 4) {
    read_exactly(shard.fd.get(), out, count * 4, offset, shard.path);
    return;
  }
  // uint16: read into the upper half of `out` (bytes [2*count, 4*count)), then widen front to back:
  // writing out[i] ends at byte 4i+3, below the next unread input at 2*count+2i+2.
  auto* narrow = reinterpret_cast<uint16_t*>(out) + count;
  read_exactly(shard.fd.get(), narrow, count * 2, offset, shard.path);
  for (size_t i = 0; i < count; ++i) out[i] = narrow[i];
}

void TokenDataset::read(size_t offset, size_t count, int32_t* out, int vocab_size) const {
  ZERONE_ASSERT(offset + count <= total_tokens_, "read past the dataset end");
  size_t s = shard_of(offset);
  size_t done = 0;
  while (done < count) {
    const Shard& shard = files_[s];
    size_t local = offset + done - shard.first_token;
    size_t take = std::min(count - done, shard.num_tokens - local);
    auto* tokens = reinterpret_cast<uint32_t*>(out + done);
    read_raw(shard, local, take, tokens);
    for (size_t i = 0; i < take; ++i) {
      ZERONE_CHECK(tokens[i] < static_cast<uint32_t>(vocab_size), "token shard '", shard.path, "': token ", tokens[i],
                   " at position ", local + i, " is out of range for the model's vocabulary of ", vocab_size);
    }
    done += take;
    ++s;
  }
}

std::optional<size_t> TokenDataset::find_token_outside(int vocab_size, size_t begin, size_t end) const {
  ZERONE_ASSERT(begin <= end && end <= total_tokens_);
  constexpr size_t kBlockTokens = size_t{1} << 18;  // 1 MiB of uint32 per read
  std::vector<uint32_t> block(kBlockTokens);
  size_t pos = begin;
  while (pos < end) {
    const Shard& shard = files_[shard_of(pos)];
    size_t local = pos - shard.first_token;
    size_t take = std::min({end - pos, shard.num_tokens - local, kBlockTokens});
    read_raw(shard, local, take, block.data());
    uint32_t max_id = 0;
    for (size_t i = 0; i < take; ++i) max_id = std::max(max_id, block[i]);
    if (max_id >= static_cast<uint32_t>(vocab_size)) {
      for (size_t i = 0; i < take; ++i)
        if (block[i] >= static_cast<uint32_t>(vocab_size)) return pos + i;
    }
    pos += take;
  }
  return std::nullopt;
}

std::string TokenDataset::describe(size_t position) const {
  const Shard& shard = files_[shard_of(position)];
  uint32_t token = 0;
  read_raw(shard, position - shard.first_token, 1, &token);
  return str_cat("token ", token, " at position ", position - shard.first_token, " of '", shard.path, "'");
}

void InMemoryTokens::read(size_t offset, size_t count, int32_t* out, int vocab_size) const {
  ZERONE_ASSERT(offset + count <= tokens_.size(), "read past the end of ", name_);
  for (size_t i = 0; i < count; ++i) {
    int32_t tok = tokens_[offset + i];
    ZERONE_CHECK(tok >= 0 && tok < vocab_size, name_, ": token ", tok, " at position ", offset + i,
                 " is out of range for the model's vocabulary of ", vocab_size);
    out[i] = tok;
  }
}

std::optional<size_t> InMemoryTokens::find_token_outside(int vocab_size, size_t begin, size_t end) const {
  ZERONE_ASSERT(begin <= end && end <= tokens_.size());
  for (size_t i = begin; i < end; ++i)
    if (tokens_[i] < 0 || tokens_[i] >= vocab_size) return i;
  return std::nullopt;
}

std::string InMemoryTokens::describe(size_t position) const {
  return str_cat("token ", tokens_[position], " at position ", position, " of the ", name_);
}

void write_token_shard_body(std::FILE* f, const std::vector<int32_t>& tokens, bool force_u32, const std::string& path) {
  bool u16 = !force_u32;
  for (int32_t t : tokens) {
    ZERONE_CHECK(t >= 0, "write_token_shard: negative token id ", t);
    if (t > 0xffff) u16 = false;
  }
  ZERONE_CHECK(tokens.size() <= 0x7fffffffu, "write_token_shard: ", tokens.size(), " tokens do not fit one shard");
  int32_t header[kShardHeaderInts] = {};
  header[0] = u16 ? kShardMagicU16 : kShardMagicU32;
  header[1] = u16 ? 1 : 7;
  header[2] = static_cast<int32_t>(tokens.size());
  write_all(f, header, sizeof header, path);
  if (u16) {
    std::vector<uint16_t> t16(tokens.begin(), tokens.end());
    write_all(f, t16.data(), t16.size() * 2, path);
  } else {
    write_all(f, tokens.data(), tokens.size() * 4, path);
  }
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, bool force_u32) {
  write_file_atomically(path, [&](std::FILE* f) { write_token_shard_body(f, tokens, force_u32, path); });
}

DataLoader::DataLoader(const TokenSource& data, int B, int T, int vocab_size, bool shuffle, uint64_t seed)
    : data_(data), B_(B), T_(T), vocab_size_(vocab_size), shuffle_(shuffle), seed_(seed) {
  ZERONE_ASSERT(B > 0 && T > 0);
  size_t bt = static_cast<size_t>(B) * T;
  ZERONE_CHECK(data.num_tokens() >= bt + 1, "dataset has ", data.num_tokens(), " tokens, fewer than one batch of ",
               "micro-batch x seq + 1 = ", bt + 1);
  num_samples_ = (data.num_tokens() - 1) / static_cast<uint64_t>(T);
  buffer_.resize(bt + 1);
}

uint64_t DataLoader::sample_start(uint64_t sample) {
  const uint64_t epoch = sample / num_samples_;
  uint64_t index = sample % num_samples_;
  if (shuffle_) {
    if (static_cast<int64_t>(epoch) != perm_epoch_) {
      perm_.resize(num_samples_);
      for (uint64_t i = 0; i < num_samples_; ++i) perm_[i] = i;
      Rng rng(seed_, 0x5eed0000ull + epoch);
      for (uint64_t i = num_samples_; i > 1; --i) std::swap(perm_[i - 1], perm_[rng.below(i)]);
      perm_epoch_ = static_cast<int64_t>(epoch);
    }
    index = perm_[index];
  }
  return index * static_cast<uint64_t>(T_);
}

void DataLoader::load(uint64_t first_sample, int32_t* inputs, int32_t* targets) {
  const size_t T = static_cast<size_t>(T_);
  // In file order within one epoch the B samples are one run of B*T+1 tokens: one read.
  if (!shuffle_ && first_sample % num_samples_ + B_ <= num_samples_) {
    const size_t bt = static_cast<size_t>(B_) * T;
    data_.read(sample_start(first_sample), bt + 1, buffer_.data(), vocab_size_);
    std::memcpy(inputs, buffer_.data(), bt * sizeof(int32_t));
    std::memcpy(targets, buffer_.data() + 1, bt * sizeof(int32_t));
    return;
  }
  for (int b = 0; b < B_; ++b) {
    data_.read(sample_start(first_sample + static_cast<uint64_t>(b)), T + 1, buffer_.data(), vocab_size_);
    std::memcpy(inputs + b * T, buffer_.data(), T * sizeof(int32_t));
    std::memcpy(targets + b * T, buffer_.data() + 1, T * sizeof(int32_t));
  }
}

}  // namespace zerone::io
