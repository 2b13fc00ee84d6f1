// ZERONE_CUDA_CHECK(expr): every CUDA runtime call is checked; failure throws zerone::Error with
// the expression, file, line and CUDA's own message. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include "zerone/core/error.h"

#define ZERONE_CUDA_CHECK(expr)                                                                       \
  do {                                                                                                \
    cudaError_t zerone_cuda_status = (expr);                                                          \
    if (zerone_cuda_status != cudaSuccess)                                                            \
      throw ::zerone::Error(::zerone::str_cat("CUDA call ", #expr, " failed at ", __FILE__, ":", __LINE__, \
                                              ": ", cudaGetErrorString(zerone_cuda_status)));          \
  } while (0)
