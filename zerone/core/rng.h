// Deterministic random numbers.
//
// A counter-based generator: value i of stream (seed, stream_id) is a pure function of its inputs,
// so initialisation and data shuffling give the same numbers whatever the thread count, world size
// or order of calls. Thread-safety: Rng objects are not shared; the free functions are pure.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "zerone/core/host_device.h"

// Note [Rng on the GPU]: the generator's pure functions are also device functions when nvcc
// compiles a file, so that the CUDA dropout draws the cpu kernel's bits (kernels/cuda/classifier.cu).

namespace zerone {

// SplitMix64 finalizer: a strong 64-bit mixing function.
ZERONE_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Value `index` of stream (seed, stream) as a uniform in [0, 1): what the index-th call of
// Rng(seed, stream).uniform() returns, computed directly (no state; any order, any thread).
inline double uniform_at(uint64_t seed, uint64_t stream, uint64_t index);

class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0) : key_(key(seed, stream)) {}
  ZERONE_HOST_DEVICE static uint64_t key(uint64_t seed, uint64_t stream) { return mix64(seed ^ mix64(stream + 0x632be59bd9b4e019ull)); }
  ZERONE_HOST_DEVICE static uint64_t at(uint64_t key, uint64_t counter) { return mix64(key + counter * 0xd1b54a32d192ed03ull); }
  ZERONE_HOST_DEVICE static double to_uniform(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }
  uint64_t next_u64() { return at(key_, counter_++); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return to_uniform(next_u64()); }
  // Uniform integer in [0, n). n > 0.
  uint64_t below(uint64_t n) { return static_cast<uint64_t>(uniform() * static_cast<double>(n)) % n; }
  // Standard normal (Box-Muller, one value per call).
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return box_muller(u1, u2);
  }
  // What the index-th normal() of a fresh Rng with this key returns (when it is asked for nothing
  // else): the uniforms of counters 2 index and 2 index + 1, computed directly.
  static double normal_at(uint64_t key, uint64_t index) {
    return box_muller(to_uniform(at(key, 2 * index)), to_uniform(at(key, 2 * index + 1)));
  }
  static double box_muller(double u1, double u2) {
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

inline double uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return Rng::to_uniform(Rng::at(Rng::key(seed, stream), index));
}

// Note [Parallel initialization] (rng.cc): out[i] = float(Rng(seed, stream)'s i-th normal() * scale),
// on every OpenMP thread, the bits of the sequential loop.
void fill_normal(float* out, size_t n, uint64_t seed, uint64_t stream, double scale);
// out[i] = float((2 uniform_i - 1) * bound), the i-th uniform() of Rng(seed, stream): PyTorch's
// default Linear/Conv2d initialization, likewise on every thread.
void fill_symmetric_uniform(float* out, size_t n, uint64_t seed, uint64_t stream, double bound);

}  // namespace zerone
