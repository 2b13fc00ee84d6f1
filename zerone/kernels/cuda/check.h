// Checked CUDA calls. A failing CUDA runtime or cuBLASLt call inside the backend is an internal
// invariant (a bad launch, a wrong pointer, a lost device): it aborts with the expression, file,
// line and CUDA's own message. The one user-facing CUDA failure, out of device memory, never goes
// through these macros: the arena returns nullptr and Buffer throws Error (core/memory.h).
// Include from the CUDA backend's sources only (it pulls in cuda_runtime.h).
// Thread-safety: the macros have no state.
#pragma once

#include <cuda_runtime.h>

#include "zerone/core/error.h"

#define ZERONE_CUDA_CHECK(expr)                                                                              \
  do {                                                                                                       \
    cudaError_t zerone_cuda_status = (expr);                                                                 \
    ZERONE_ASSERT(zerone_cuda_status == cudaSuccess, "CUDA call ", #expr, ": ", cudaGetErrorString(zerone_cuda_status)); \
  } while (0)

// After a kernel launch: the launch itself succeeded (a bad configuration aborts here; a fault
// inside the kernel surfaces at the next synchronizing call's check).
#define ZERONE_CUDA_LAUNCHED() ZERONE_CUDA_CHECK(cudaGetLastError())
