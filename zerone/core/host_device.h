// ZERONE_HOST_DEVICE marks a small pure function that the CUDA kernels call too: __host__
// __device__ when nvcc compiles the file, nothing otherwise (Note [Rng on the GPU], core/rng.h).
// Thread-safety: a macro.
#pragma once

#ifdef __CUDACC__
#define ZERONE_HOST_DEVICE __host__ __device__
#else
#define ZERONE_HOST_DEVICE
#endif
