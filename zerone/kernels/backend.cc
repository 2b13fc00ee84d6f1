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

size_t attention_saved_numel(AttentionSaved saved, int B, int NH, int T) {
  const size_t rows = static_cast<size_t>(B) * NH * T;  // (B, NH, T)
  return saved == AttentionSaved::logsumexp ? rows : rows * T;
}

AttentionSaved attention_saved(DeviceKind kind, const DeviceOptions& options) {
  return kind == DeviceKind::cuda && options.cuda_attention == CudaAttention::flash ? AttentionSaved::logsumexp
                                                                                   : AttentionSaved::probabilities;
}

const char* cuda_attention_name(CudaAttention kind) { return kind == CudaAttention::flash ? "flash" : "plain"; }

CudaAttention parse_cuda_attention(const std::string& name) {
  if (name == "flash") return CudaAttention::flash;
  if (name == "plain") return CudaAttention::plain;
  throw Error(str_cat("--cuda-attention '", name, "': expected flash or plain"));
}

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

DeviceKind device_or_default(const std::string& name) { return name.empty() ? default_device() : parse_device_kind(name); }

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
DeviceOptions g_cuda_options;  // what g_cuda was made with
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

namespace {

Backend& backend_locked(DeviceKind kind, const DeviceOptions& options) {
  (void)options;  // only the cuda backend has choices
  switch (kind) {
    case DeviceKind::cpu:
      if (!g_cpu) g_cpu = std::make_unique<cpu::CpuBackend>();
      return *g_cpu;
    case DeviceKind::sim:
      if (!g_sim) g_sim = std::make_unique<sim::SimBackend>();
      return *g_sim;
    case DeviceKind::cuda:
#ifdef ZERONE_HAVE_CUDA
      if (!g_cuda) {
        g_cuda = cuda::make_cuda_backend(options).release();  // throws without a GPU
        g_cuda_options = options;
      }
      ZERONE_ASSERT(g_cuda_options.cuda_attention == options.cuda_attention, "the cuda backend exists with --cuda-attention ",
                    cuda_attention_name(g_cuda_options.cuda_attention), ", asked for ",
                    cuda_attention_name(options.cuda_attention));
      return *g_cuda;
#else
      break;
#endif
  }
  throw Error("--device cuda: this build has no CUDA backend (nvcc was not found when it was built); "
              "use --device cpu or --device sim");
}

}  // namespace

Backend& backend(DeviceKind kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
#ifdef ZERONE_HAVE_CUDA
  if (kind == DeviceKind::cuda && g_cuda) return *g_cuda;  // whatever options use_device made it with
#endif
  return backend_locked(kind, DeviceOptions{});
}

Backend& host_backend() {
  static Backend& cpu = backend(DeviceKind::cpu);  // once: optimizer updates ask for it per shard
  return cpu;
}

Backend& use_device(DeviceKind kind, const DeviceOptions& options) {
  Backend& b = [&]() -> Backend& {
    std::lock_guard<std::mutex> lock(g_mutex);
    return backend_locked(kind, options);
  }();
  set_arena(MemPlace::device, &b.device_arena());
  set_arena(MemPlace::host, b.host_arena());  // Note [Pinned host memory]; null: the default
  g_device = &b;
  return b;
}

Backend& device_backend() { return g_device ? *g_device : host_backend(); }

std::optional<DeviceMemory> device_memory(DeviceKind kind) {
  if (kind != DeviceKind::cuda) return std::nullopt;
#ifdef ZERONE_HAVE_CUDA
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_cuda) return g_cuda->device_memory();
  }
  const std::vector<cuda::DeviceInfo> gpus = cuda::devices();
  if (!gpus.empty()) return DeviceMemory::before_context(gpus.front().total_memory_bytes);
#endif
  return std::nullopt;
}

}  // namespace zerone::kernels
