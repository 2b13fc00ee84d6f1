#include "zerone/kernels/backend.h"

#include "zerone/kernels/cpu/quantize.h"

#include <memory>
#include <mutex>

#include "zerone/core/error.h"
#include "zerone/kernels/cpu/cpu_backend.h"
#include "zerone/kernels/sim/sim_backend.h"
#ifdef ZERONE_HAVE_CUDA
#include "zerone/kernels/cuda/cuda_backend.h"
#include "zerone/kernels/cuda/device.h"
#endif

namespace zerone::kernels {

size_t quantized_bytes(size_t n, int bits, size_t block) { return cpu::quantized_bytes(n, bits, block); }

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::sim: return "sim";
    case DeviceKind::cuda: return "cuda";
  }
  return "?";
}

DeviceKind parse_device_kind(const std::string& name) {
  if (name == "cpu") return DeviceKind::cpu;
  if (name == "sim") return DeviceKind::sim;
  if (name == "cuda") return DeviceKind::cuda;
  throw Error(str_cat("--device '", name, "': expected cpu, sim or cuda"));
}

namespace {

int cuda_devices() {
#ifdef ZERONE_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

// The CUDA backend is offered when it is built (nvcc found) and a GPU is present.
#ifdef ZERONE_HAVE_CUDA
constexpr bool kCudaBackendBuilt = true;
#else
constexpr bool kCudaBackendBuilt = false;
#endif

std::mutex g_mutex;
std::unique_ptr<cpu::CpuBackend> g_cpu;
std::unique_ptr<sim::SimBackend> g_sim;
#ifdef ZERONE_HAVE_CUDA
// Never destroyed: at exit the CUDA runtime may already be gone (its atexit handler runs before
// this namespace's destructors), and tearing down streams, cuBLASLt and device memory then can
// fault. The process's exit releases the GPU.
Backend* g_cuda = nullptr;
#endif
Backend* g_device = nullptr;

}  // namespace

std::vector<DeviceKind> available_devices() {
  std::vector<DeviceKind> out;
  if (kCudaBackendBuilt && cuda_devices() > 0) out.push_back(DeviceKind::cuda);
  out.push_back(DeviceKind::cpu);
  out.push_back(DeviceKind::sim);
  return out;
}

DeviceKind default_device() { return available_devices().front(); }

Backend& backend(DeviceKind kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
  switch (kind) {
    case DeviceKind::cpu:
      if (!g_cpu) g_cpu = std::make_unique<cpu::CpuBackend>();
      return *g_cpu;
    case DeviceKind::sim:
      if (!g_sim) g_sim = std::make_unique<sim::SimBackend>();
      return *g_sim;
    case DeviceKind::cuda:
#ifdef ZERONE_HAVE_CUDA
      if (!g_cuda) g_cuda = cuda::make_cuda_backend().release();  // throws without a GPU
      return *g_cuda;
#else
      break;
#endif
  }
  throw Error("--device cuda: this build has no CUDA backend (nvcc was not found when it was built); "
              "use --device cpu or --device sim");
}

Backend& host_backend() {
  static Backend& cpu = backend(DeviceKind::cpu);  // once: optimizer updates ask for it per shard
  return cpu;
}

Backend& use_device(DeviceKind kind) {
  Backend& b = backend(kind);
  set_arena(MemPlace::device, &b.device_arena());
  set_arena(MemPlace::host, b.host_arena());  // Note [Pinned host memory]; null: the default
  g_device = &b;
  return b;
}

Backend& device_backend() { return g_device ? *g_device : host_backend(); }

}  // namespace zerone::kernels
