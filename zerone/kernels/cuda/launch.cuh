// How every CUDA kernel is launched: ZERONE_LAUNCH(grid, block, shared_bytes, stream, kernel)(args...)
// is kernel<<<grid, block, shared_bytes, stream>>>(args...) under nvcc; under a host compiler it is
// the same launch run on emulated_gpu.h's fibers, at once (Note [Emulated warps]), so that the
// kernels and their launchers compile for the host too (zerone_kernels_cuda_emulated).
// Thread-safety: a launch is enqueued (nvcc) or run (host) on the calling thread.
#pragma once

// ZERONE_DYNAMIC_SHARED(type, name): inside a kernel, its dynamic shared memory (the launch's
// shared_bytes) as `type name[]`, 16-byte aligned.
#if defined(__CUDACC__)
#define ZERONE_LAUNCH(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#define ZERONE_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#else
#include "zerone/kernels/cuda/emulated_gpu.h"
#define ZERONE_LAUNCH(grid, block, shared_bytes, stream, ...) \
  ::zerone::cuda::emulated::launcher(grid, block, shared_bytes, __VA_ARGS__)
#define ZERONE_DYNAMIC_SHARED(type, name) \
  type* const name = static_cast<type*>(::zerone::cuda::emulated::dynamic_shared_memory())
#endif
