// Memory operations of the ZeRO engine's parts on buffers that may live in either of two places:
// the device (the model's backend) or the host (offloaded state, staging buffers). Each picks the
// backend that runs on the memory at hand (Note [Places of pointers] in kernels/backend.h) and
// stages an operand that lives in the other place (Note [Operands in another place] in
// optim/optimizer.h), so the arithmetic, and the bits, are those of one place.
//
// Thread-safety: as the backends they call (one thread at a time per buffer).
#pragma once

#include <cstddef>
#include <functional>

#include "zerone/core/memory.h"
#include "zerone/kernels/backend.h"

namespace zerone::zero {

// The backend that runs on the memory at p: `device`'s, or the host's for host memory.
kernels::Backend& backend_of(kernels::Backend& device, const void* p);
// acc (n) += in (n), wherever each lives.
void accumulate_into(kernels::Backend& device, float* acc, const float* in, size_t n);
// The sum of squares of grad (n) (Note [Deterministic gradient norm] in kernels/cpu/reduce.h),
// copying it to copy_to (n) on the way.
PendingSum sum_squares_and_copy(kernels::Backend& device, const float* grad, size_t n, float* copy_to);
// Hands fn `bytes` at `data` (memory of `place`) as host memory: itself where the host can read
// it, else a host copy valid during the call (checkpoints read device memory this way).
void with_host_view(kernels::Backend& device, const void* data, MemPlace place, size_t bytes,
                    const std::function<void(const void* host)>& fn);

// Gives a working-set buffer (full gradients, gathered parameters, landing shards) back to `pool`
// with the events of its last use on the streams that touch such buffers: compute (kernels) and
// comm (collectives). The pool reuses or frees it only after both completed (Note [Pooled reuse
// after last use], core/memory.h); on the inline backends at once.
void release_to_pool(BufferPool& pool, Buffer&& buffer, kernels::Backend& device);

}  // namespace zerone::zero
