// The CUDA device layer: discovery and checked calls. Compiled only when nvcc is found; every
// function is safe to call on a machine without a GPU (device_count() returns 0 and the rest
// throw Error saying no device is present).
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <string>
#include <vector>

namespace zerone::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  long long total_memory_bytes = 0;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
};

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int device_count();
// Facts about every device (empty without a GPU).
std::vector<DeviceInfo> devices();
// GPU `device`'s memory now (cudaMemGetInfo): its total and what is free with this process's
// context resident, which this call makes if it did not exist (Note [Device memory the ledger
// cannot see], kernels/backend.h). Throws Error without a GPU.
struct MemoryInfo {
  long long total_bytes = 0, free_bytes = 0;
};
MemoryInfo memory_info(int device);
// CUDA runtime and driver versions as "runtime X.Y, driver X.Y" (driver "none" without one).
std::string version_string();
// The CUDA libraries' versions, "cuBLASLt 13.0.0". Loads cuBLASLt if no backend has (Note
// [cuBLASLt loaded on first use], cublaslt.h); never throws: a library that cannot be loaded is
// reported in the text.
std::string library_versions();

}  // namespace zerone::cuda
