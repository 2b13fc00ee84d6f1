#include "zerone/kernels/cuda/check.h"
#include "zerone/kernels/cuda/cublaslt.h"
#include "zerone/kernels/cuda/device.h"

namespace zerone::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" / "no driver" status
    return 0;
  }
  return count;
}

MemoryInfo memory_info(int device) {
  ZERONE_CHECK(device >= 0 && device < device_count(), "no CUDA GPU ", device, " on this machine");
  int current = 0;
  ZERONE_CUDA_CHECK(cudaGetDevice(&current));
  ZERONE_CUDA_CHECK(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  ZERONE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  ZERONE_CUDA_CHECK(cudaSetDevice(current));
  return MemoryInfo{static_cast<long long>(total_bytes), static_cast<long long>(free_bytes)};
}

std::vector<DeviceInfo> devices() {
  std::vector<DeviceInfo> out;
  for (int i = 0, n = device_count(); i < n; ++i) {
    cudaDeviceProp prop;
    ZERONE_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    out.push_back(DeviceInfo{i, prop.name, static_cast<long long>(prop.totalGlobalMem), prop.major, prop.minor,
                             prop.multiProcessorCount});
  }
  return out;
}

std::string version_string() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  return str_cat("runtime ", runtime / 1000, ".", runtime % 1000 / 10, ", driver ",
                 have_driver ? str_cat(driver / 1000, ".", driver % 1000 / 10) : std::string("none"));
}

std::string library_versions() {
  try {
    const size_t v = cublaslt().get_version();  // major * 10000 + minor * 100 + patch
    return str_cat("cuBLASLt ", v / 10000, ".", v / 100 % 100, ".", v % 100);
  } catch (const Error& e) {
    return str_cat("cuBLASLt not loadable (", e.what(), ")");
  }
}

}  // namespace zerone::cuda
