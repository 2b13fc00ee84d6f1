#include "zerone/core/rng.h"

#include <cstdint>

namespace zerone {

// Note [Parallel initialization]: value i of a stream is a pure function of (key, i), so the
// threads fill their parts of `out` with the bits one thread would: what makes initializing a
// model of billions of parameters take seconds, not minutes, at the same values.
void fill_normal(float* out, size_t n, uint64_t seed, uint64_t stream, double scale) {
  const uint64_t key = Rng::key(seed, stream);
#pragma omp parallel for schedule(static) if (n >= (size_t{1} << 16))
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i)
    out[i] = static_cast<float>(Rng::normal_at(key, static_cast<uint64_t>(i)) * scale);
}

void fill_symmetric_uniform(float* out, size_t n, uint64_t seed, uint64_t stream, double bound) {
  const uint64_t key = Rng::key(seed, stream);
#pragma omp parallel for schedule(static) if (n >= (size_t{1} << 16))
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i)
    out[i] = static_cast<float>((2.0 * Rng::to_uniform(Rng::at(key, static_cast<uint64_t>(i))) - 1.0) * bound);
}

}  // namespace zerone
