// Helpers shared by the tests: a temporary directory (removed at scope exit) and raw file writers
// for building malformed inputs.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/kernels/backend.h"

namespace zerone::testing {

// Makes `kind` the process's device while it lives (kernels::use_device; models built meanwhile
// compute on it, Note [Models and their device]) and the device before it again after (also when
// the scope's code switched devices itself, as run_training does). Buffers keep the arena they came
// from, so a model built in one scope stays usable after it, through its own backend().
class DeviceScope {
 public:
  explicit DeviceScope(kernels::DeviceKind kind) : before_(kernels::device_backend().kind()) { kernels::use_device(kind); }
  ~DeviceScope() { kernels::use_device(before_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  kernels::DeviceKind before_;
};

// The devices every suite that builds models and engines runs on: cpu, and the simulated device
// that proves no host code touches device memory (kernels/sim), with the cpu device's bits.
inline auto every_device() { return ::testing::Values(kernels::DeviceKind::cpu, kernels::DeviceKind::sim); }
inline std::string device_test_name(const ::testing::TestParamInfo<kernels::DeviceKind>& info) {
  return kernels::device_kind_name(info.param);
}

// `n` elements of device memory at `p` (memory of `backend`'s device), copied to the host through
// the backend: the only way a test may read a model's parameters, gradients or logits.
template <typename T>
std::vector<T> to_host(kernels::Backend& backend, const T* p, size_t n) {
  std::vector<T> out(n);
  backend.copy_to_host(out.data(), p, n * sizeof(T));
  return out;
}

// A new device buffer (of the current device) of `n` floats, each `value`, written through the
// backend; the caller owns it.
inline Buffer device_floats(size_t n, float value, MemCategory category) {
  Buffer out(n * sizeof(float), category);
  const std::vector<float> host(n, value);
  kernels::device_backend().copy_to_device(out.data(), host.data(), n * sizeof(float));
  return out;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/zerone_test_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const void* data, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(data, 1, n, f), n);
  std::fclose(f);
}

inline void write_text(const std::string& path, const std::string& text) { write_bytes(path, text.data(), text.size()); }

inline std::vector<char> read_bytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  std::vector<char> out;
  if (!f) return out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  return out;
}

// Expects `fn` to throw zerone::Error whose message contains `needle`.
template <typename Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

}  // namespace zerone::testing
