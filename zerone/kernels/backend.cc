#include "zerone/kernels/backend.h"

#include "zerone/kernels/cpu/quantize.h"

#include <algorithm>
#include <cctype>
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

std::optional<GpuPeak> known_gpu_peak(const std::string& gpu_name, DType dtype) {
  if (dtype != DType::bf16 && dtype != DType::f16) return std::nullopt;
  // The first entry whose every word is in the name wins: the more specific parts come first.
  struct Entry {
    std::vector<const char*> words;
    GpuPeak peak;
  };
  static const Entry kTable[] = {
      {{"H100", "PCIe"}, {"NVIDIA H100 PCIe", 756.0}},
      {{"H100", "NVL"}, {"NVIDIA H100 NVL", 835.0}},
      {{"H100"}, {"NVIDIA H100 SXM", 989.4}},
      {{"H200", "NVL"}, {"NVIDIA H200 NVL", 835.0}},
      {{"GH200"}, {"NVIDIA GH200", 989.4}},
      {{"H200"}, {"NVIDIA H200 SXM", 989.4}},
      {{"B200"}, {"NVIDIA B200", 2250.0}},
      {{"A100"}, {"NVIDIA A100", 312.0}},
      {{"L40S"}, {"NVIDIA L40S", 362.05}},
      {{"L4"}, {"NVIDIA L4", 121.0}},
      {{"A10"}, {"NVIDIA A10", 125.0}},
  };
  // Words are matched whole (delimited by anything but a letter or digit), so that "L4" is not
  // found in "L40S" nor "A10" in "A100".
  auto has_word = [&](const char* word) {
    const std::string w(word);
    for (size_t at = gpu_name.find(w); at != std::string::npos; at = gpu_name.find(w, at + 1)) {
      const bool start = at == 0 || !std::isalnum(static_cast<unsigned char>(gpu_name[at - 1]));
      const size_t end = at + w.size();
      const bool stop = end == gpu_name.size() || !std::isalnum(static_cast<unsigned char>(gpu_name[end]));
      if (start && stop) return true;
    }
    return false;
  };
  for (const Entry& e : kTable)
    if (std::all_of(e.words.begin(), e.words.end(), has_word)) return e.peak;
  return std::nullopt;
}

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
