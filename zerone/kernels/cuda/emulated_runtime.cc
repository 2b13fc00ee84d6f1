// The CUDA runtime calls of the CUDA backend, for its host build on emulated warps
// (zerone_kernels_cuda_emulated; Note [Emulated warps] in emulated_gpu.h): one emulated GPU,
// device 0, whose memory is host memory that this file tells apart from other host memory
// (cudaPointerGetAttributes), streams on which everything is already done when enqueued (the
// kernels run at their launch), and events that record the host's clock. Only the calls the
// backend makes are defined; a program that links this has no libcudart.
// zerone_emulated_host_waits() counts the calls after which a real GPU's host would have waited
// for the device (Note [Norms read once a step], core/pending_sum.h: a test's evidence of how
// often a training step stalls the queue).
// Note [Late copies to pinned memory]: one thing is not done at once. An asynchronous copy from
// the device into page-locked host memory lands only when the host waits for it (a stream or
// device synchronization, or an event recorded after it) or a stream is made to wait for such an
// event; until then its destination holds NaN bytes (0xff), and events recorded after it are not
// complete (cudaEventQuery). On a GPU such a copy lands
// whenever the copy engine gets to it, so host code that reads it without waiting for its event
// reads garbage there and NaN here, where the tests see it. The source is read at the call, as
// the GPU's stream order reads it before any later kernel writes it.
// Thread-safety: the allocation tables take a mutex; the wait count is atomic; the rest keeps no
// state.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace {

constexpr size_t kEmulatedGpuBytes = size_t{16} << 30;  // what cudaMemGetInfo reports as total
constexpr int kSharedBytesPerBlockOptin = 227 * 1024;   // an sm_90's
constexpr size_t kAlignment = 256;                       // cudaMalloc's

std::mutex g_mutex;
std::map<const char*, size_t> g_device;  // start -> bytes of each live device allocation
std::map<const char*, size_t> g_pinned;  // the same for page-locked host memory
size_t g_device_bytes = 0;
std::atomic<uint64_t> g_host_waits{0};

struct EmulatedEvent {
  double ms = 0.0;
  uint64_t late_copies = 0;  // the late copies issued before it (Note [Late copies to pinned memory])
};

// Note [Late copies to pinned memory]: the copies not landed yet, with their sources' bytes.
struct LateCopy {
  uint64_t number;  // 1, 2, ... in issue order
  void* dst;
  std::vector<unsigned char> bytes;
};
std::vector<LateCopy> g_late;      // under g_mutex, in issue order
uint64_t g_late_issued = 0;        // under g_mutex
uint64_t g_late_landed = 0;        // under g_mutex: every copy numbered up to it has landed

// The late copies numbered up to `last` land (in issue order). Under g_mutex.
void land_until(uint64_t last) {
  size_t landed = 0;
  for (; landed < g_late.size() && g_late[landed].number <= last; ++landed)
    std::memcpy(g_late[landed].dst, g_late[landed].bytes.data(), g_late[landed].bytes.size());
  g_late.erase(g_late.begin(), g_late.begin() + static_cast<std::ptrdiff_t>(landed));
  g_late_landed = std::max(g_late_landed, last);
}

// The host waits for the device: everything issued so far lands. Takes g_mutex.
void host_waits() {
  ++g_host_waits;
  std::lock_guard<std::mutex> lock(g_mutex);
  land_until(g_late_issued);
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void* allocate(std::map<const char*, size_t>& table, size_t bytes) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (p == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  table[static_cast<const char*>(p)] = bytes;
  return p;
}

// Whether p lies in one of table's allocations.
bool contains(const std::map<const char*, size_t>& table, const void* p) {
  const char* c = static_cast<const char*>(p);
  auto it = table.upper_bound(c);
  if (it == table.begin()) return false;
  --it;
  return c < it->first + std::max<size_t>(it->second, 1);
}

}  // namespace

extern "C" {

// The host waits so far: stream, event and device synchronizations, synchronous copies between
// host and device, and asynchronous copies from the device into pageable host memory (which
// return only once the copy is done, on a GPU).
uint64_t zerone_emulated_host_waits(void) { return g_host_waits.load(); }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->name, "zerone emulated GPU", sizeof prop->name - 1);
  prop->totalGlobalMem = kEmulatedGpuBytes;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->sharedMemPerBlockOptin = kSharedBytesPerBlockOptin;
  for (size_t i = 0; i < sizeof prop->uuid.bytes; ++i) prop->uuid.bytes[i] = static_cast<char>(0xe0 + i);
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = kSharedBytesPerBlockOptin; break;
    case cudaDevAttrMultiProcessorCount: *value = 1; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t error) { return error == cudaSuccess ? "no error" : "emulated GPU error"; }
cudaError_t cudaDeviceSynchronize(void) {
  host_waits();
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  *total_bytes = kEmulatedGpuBytes;
  *free_bytes = kEmulatedGpuBytes - std::min(g_device_bytes, kEmulatedGpuBytes);
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) {
  *p = allocate(g_device, bytes);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_device_bytes += bytes;
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_device.find(static_cast<const char*>(p));
    if (it == g_device.end()) return cudaErrorInvalidValue;
    g_device_bytes -= it->second;
    g_device.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  *p = allocate(g_pinned, bytes);
  return *p == nullptr ? cudaErrorMemoryAllocation : cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  host_waits();  // it synchronizes the device, on a GPU
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_pinned.erase(static_cast<const char*>(p)) == 0) return cudaErrorInvalidValue;
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostGetFlags(unsigned int* flags, void* p) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!contains(g_pinned, p)) return cudaErrorInvalidValue;
  *flags = cudaHostAllocPortable;
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  std::memset(attributes, 0, sizeof *attributes);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (contains(g_device, p)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = 0;
    attributes->devicePointer = const_cast<void*>(p);
  } else if (contains(g_pinned, p)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = 0;
    attributes->hostPointer = const_cast<void*>(p);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  static int the_pool;
  *pool = reinterpret_cast<cudaMemPool_t>(&the_pool);
  return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return cudaSuccess; }
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) { return cudaSuccess; }

// Every stream's work is done when it is enqueued: copies and fills happen now.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  if (bytes == 0) return cudaSuccess;
  bool pageable_destination = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const bool from_device = contains(g_device, src) && !contains(g_device, dst);
    if (from_device && contains(g_pinned, dst)) {  // Note [Late copies to pinned memory]
      const auto* from = static_cast<const unsigned char*>(src);
      g_late.push_back({++g_late_issued, dst, std::vector<unsigned char>(from, from + bytes)});
      std::memset(dst, 0xff, bytes);
      return cudaSuccess;
    }
    pageable_destination = from_device;
  }
  if (pageable_destination) {
    host_waits();  // returns once the copy is done, on a GPU
  }
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  bool with_device;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    with_device = contains(g_device, src) || contains(g_device, dst);
  }
  if (with_device) host_waits();
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) {
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = reinterpret_cast<cudaStream_t>(new int(0));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<int*>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  host_waits();
  return cudaSuccess;
}
// Work queued after this runs now, so what the event covers lands first (the host does not wait).
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned int) {
  std::lock_guard<std::mutex> lock(g_mutex);
  land_until(reinterpret_cast<EmulatedEvent*>(event)->late_copies);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = reinterpret_cast<cudaEvent_t>(new EmulatedEvent);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<EmulatedEvent*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  auto* e = reinterpret_cast<EmulatedEvent*>(event);
  e->ms = now_ms();
  std::lock_guard<std::mutex> lock(g_mutex);
  e->late_copies = g_late_issued;
  return cudaSuccess;
}
// Only what the event covers lands: a later copy read after this wait alone reads NaN.
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  ++g_host_waits;
  std::lock_guard<std::mutex> lock(g_mutex);
  land_until(reinterpret_cast<EmulatedEvent*>(event)->late_copies);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return reinterpret_cast<EmulatedEvent*>(event)->late_copies <= g_late_landed ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = static_cast<float>(reinterpret_cast<EmulatedEvent*>(end)->ms - reinterpret_cast<EmulatedEvent*>(start)->ms);
  return cudaSuccess;
}

}  // extern "C"
