// The CUDA backend: host code (C++, no kernels); Note [CUDA backend design] in cuda_backend.h.
#include "zerone/kernels/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <tuple>
#include <utility>
#include <mutex>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"
#include "zerone/kernels/cpu/quantize.h"
#include "zerone/kernels/cuda/check.h"
#include "zerone/kernels/cuda/cublaslt.h"
#include "zerone/kernels/cuda/device.h"
#include "zerone/kernels/cuda/kernels.h"
#include "zerone/kernels/scratch.h"

#define ZERONE_CUBLAS_CHECK(expr)                                                                     \
  do {                                                                                               \
    cublasStatus_t zerone_cublas_status = (expr);                                                    \
    ZERONE_ASSERT(zerone_cublas_status == CUBLAS_STATUS_SUCCESS, "cuBLASLt call ", #expr, ": status ", \
                  static_cast<int>(zerone_cublas_status));                                           \
  } while (0)

namespace zerone::cuda {
namespace {

using kernels::ActLayout;
using kernels::AdamWHyper;
using kernels::Conv2dShape;
using kernels::DeviceKind;
using kernels::DropoutKey;
using kernels::Pool2dShape;
using kernels::SGDHyper;
using kernels::Stream;

// Note [CUDA at exit]: static Buffers and Events may be destroyed after the CUDA runtime has torn
// itself down (its atexit handler). An atexit handler registered once the runtime is up runs
// before the runtime's, and from then on frees and event destructions do nothing: the process's
// exit releases the GPU. The statuses CUDA returns after its teardown are tolerated too.
std::atomic<bool> g_exiting{false};
bool exiting(cudaError_t e) { return e == cudaErrorCudartUnloading || e == cudaErrorContextIsDestroyed; }

// ---------------------------------------------------------------- memory

// Note [CUDA backend design]: the device's memory, stream-ordered on the compute stream.
class CudaArena final : public MemoryArena {
 public:
  CudaArena(int device, cudaStream_t stream) : device_(device), stream_(stream) {
    cudaMemPool_t pool;
    ZERONE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = UINT64_MAX;  // cache freed memory in the pool instead of returning it
    ZERONE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }

  // Zero-filled (on the stream); null when the device is out of memory.
  void* allocate(size_t bytes, size_t alignment) override {
    ZERONE_CUDA_CHECK(cudaSetDevice(device_));
    const size_t extra = alignment > kPoolAlignment ? alignment : 0;
    bytes = bytes == 0 ? 1 : bytes;  // a distinct address for an empty Buffer too
    void* raw = nullptr;
    const cudaError_t e = cudaMallocAsync(&raw, bytes + extra, stream_);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it: out of memory is the caller's Error, not a sticky fault
      return nullptr;
    }
    ZERONE_CUDA_CHECK(e);
    ZERONE_CUDA_CHECK(cudaMemsetAsync(raw, 0, bytes + extra, stream_));
    if (extra == 0) return raw;
    const uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + alignment - 1) / alignment * alignment;
    std::lock_guard<std::mutex> lock(mutex_);
    over_aligned_.emplace(reinterpret_cast<void*>(aligned), raw);
    return reinterpret_cast<void*>(aligned);
  }

  // The pool's cached memory back to the device, once the frees queued so far have run.
  void trim() {
    ZERONE_CUDA_CHECK(cudaSetDevice(device_));
    ZERONE_CUDA_CHECK(cudaDeviceSynchronize());
    cudaMemPool_t pool;
    ZERONE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    ZERONE_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  }

  void deallocate(void* data, size_t, size_t alignment) noexcept override {
    if (data == nullptr || g_exiting.load()) return;  // Note [CUDA at exit]
    if (alignment > kPoolAlignment) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = over_aligned_.find(data);
      if (it != over_aligned_.end()) data = it->second, over_aligned_.erase(it);
    }
    cudaError_t e = cudaSetDevice(device_);
    if (e == cudaSuccess) e = cudaFreeAsync(data, stream_);
    if (e != cudaSuccess && !exiting(e)) {
      std::fprintf(stderr, "zerone: internal error: cudaFreeAsync: %s\n", cudaGetErrorString(e));
      std::abort();
    }
  }

  void zero(void* data, size_t bytes) override {
    ZERONE_CUDA_CHECK(cudaSetDevice(device_));
    ZERONE_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream_));
  }

 private:
  static constexpr size_t kPoolAlignment = 256;  // what cudaMallocAsync guarantees
  const int device_;
  const cudaStream_t stream_;
  std::mutex mutex_;
  std::map<void*, void*> over_aligned_;  // aligned address -> the allocation holding it
};

// Note [Pinned host memory] (kernels/backend.h): MemPlace::host Buffers under the CUDA backend are
// page-locked (cudaHostAlloc, portable to every device of the process), zero-filled as the default
// arena's; not the optimizer's master and moments, which only host code touches (Note [Host state
// in pageable memory], core/memory.h). Pinning costs a system call and cudaFreeHost synchronizes the device, so freed blocks of
// at most kCachedBlockBytes are kept for reuse by exact size, up to kCachedTotalBytes in all (the
// staging buffers of collectives come and go every step; big one-time buffers are returned, so
// that RSS follows the ledger, Note [Returning memory] in core/memory.cc). Where the driver cannot
// pin more, the block is pageable memory instead (copies from it still work, only slower) and a
// notice says so once.
class PinnedHostArena final : public MemoryArena {
 public:
  void* allocate(size_t bytes, size_t alignment) override {
    const size_t extra = alignment > kPinnedAlignment ? alignment : 0;
    const size_t raw_bytes = (bytes == 0 ? 1 : bytes) + extra;
    void* raw = take_cached(raw_bytes);
    if (raw == nullptr) {
      const cudaError_t e = cudaHostAlloc(&raw, raw_bytes, cudaHostAllocPortable);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: fall back to pageable memory
        raw = std::aligned_alloc(kPinnedAlignment, (raw_bytes + kPinnedAlignment - 1) / kPinnedAlignment * kPinnedAlignment);
        if (raw == nullptr) return nullptr;  // Buffer throws its out-of-memory Error
        static std::once_flag told;
        std::call_once(told, [&] {
          std::fprintf(stderr, "zerone: notice: cudaHostAlloc of %zu bytes failed (%s); host buffers that cannot be "
                       "pinned are pageable (slower copies to and from the GPU)\n", raw_bytes, cudaGetErrorString(e));
        });
        std::lock_guard<std::mutex> lock(mutex_);
        pageable_.insert(raw);
      }
    }
    zero_fill(raw, raw_bytes);  // on every thread when large (core/memory.h)
    std::lock_guard<std::mutex> lock(mutex_);
    sizes_[raw] = raw_bytes;
    if (extra == 0) return raw;
    void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(raw) + alignment - 1) / alignment * alignment);
    over_aligned_.emplace(aligned, raw);
    return aligned;
  }

  void deallocate(void* data, size_t, size_t) noexcept override {
    if (data == nullptr || g_exiting.load()) return;  // Note [CUDA at exit]
    std::unique_lock<std::mutex> lock(mutex_);
    if (auto it = over_aligned_.find(data); it != over_aligned_.end()) data = it->second, over_aligned_.erase(it);
    auto size = sizes_.find(data);
    if (size == sizes_.end()) {
      std::fprintf(stderr, "zerone: internal error: a pinned host block not from this arena\n");
      std::abort();
    }
    const size_t raw_bytes = size->second;
    sizes_.erase(size);
    if (pageable_.erase(data) > 0) {
      std::free(data);
      return;
    }
    if (raw_bytes <= kCachedBlockBytes && cached_bytes_ + raw_bytes <= kCachedTotalBytes) {
      cache_.emplace(raw_bytes, data);
      cached_bytes_ += raw_bytes;
      return;
    }
    lock.unlock();
    const cudaError_t e = cudaFreeHost(data);
    if (e != cudaSuccess && !exiting(e)) {
      std::fprintf(stderr, "zerone: internal error: cudaFreeHost: %s\n", cudaGetErrorString(e));
      std::abort();
    }
  }

 private:
  static constexpr size_t kPinnedAlignment = 256;  // what cudaHostAlloc guarantees at least (it gives pages)
  static constexpr size_t kCachedBlockBytes = size_t{256} << 20, kCachedTotalBytes = size_t{1} << 30;
  void* take_cached(size_t raw_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(raw_bytes);
    if (it == cache_.end()) return nullptr;
    void* raw = it->second;
    cache_.erase(it);
    cached_bytes_ -= raw_bytes;
    return raw;
  }
  std::mutex mutex_;
  std::map<void*, size_t> sizes_;          // allocation -> its bytes
  std::map<void*, void*> over_aligned_;    // aligned address -> the allocation holding it
  std::set<void*> pageable_;               // allocations that could not be pinned
  std::multimap<size_t, void*> cache_;     // freed pinned blocks by bytes
  size_t cached_bytes_ = 0;
};

// ---------------------------------------------------------------- events

// A copy's event also holds the point of the compute stream the copy waited for (`inputs`,
// recorded where the copy joined it): waiting on the event waits for that compute first, unscoped,
// and then for the copy under ProfileCategory::transfer, so that a summary counts the copy's
// exposed time as a transfer and the kernels before it as compute (Note [Exposed time]).
class CudaEvent final : public Event::Impl {
 public:
  // Records on `stream`; takes `inputs` (a copy's join point, or null) to destroy it.
  explicit CudaEvent(cudaStream_t stream, cudaEvent_t inputs = nullptr) : inputs_(inputs) {
    ZERONE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    ZERONE_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~CudaEvent() override {
    if (g_exiting.load()) return;  // Note [CUDA at exit]
    (void)cudaEventDestroy(event_);
    if (inputs_ != nullptr) (void)cudaEventDestroy(inputs_);
  }
  bool ready() const override {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) {
      // The runtime records "not ready" as this thread's last error: clear it, or the next
      // launch's cudaGetLastError (ZERONE_CUDA_LAUNCHED) would report it as a launch failure.
      (void)cudaGetLastError();
      return false;
    }
    ZERONE_CUDA_CHECK(e);
    return true;
  }
  void wait() const override {
    if (inputs_ == nullptr) {
      ZERONE_CUDA_CHECK(cudaEventSynchronize(event_));
      return;
    }
    ZERONE_CUDA_CHECK(cudaEventSynchronize(inputs_));
    ProfileScope profile(ProfileCategory::transfer);
    ZERONE_CUDA_CHECK(cudaEventSynchronize(event_));
  }
  cudaEvent_t handle() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  cudaEvent_t inputs_ = nullptr;  // a copy's: the compute it waited for
};

int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

size_t sz(int n) { return static_cast<size_t>(n); }

// The largest power of two (at most 256) dividing the address.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t bytes = 256;
  while (bytes > 1 && a % bytes != 0) bytes /= 2;
  return bytes;
}

cudaDataType cuda_type(DType d) {
  switch (d) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// ---------------------------------------------------------------- the backend

// Note [Exposed time] (core/profiler.h): points on the compute stream, timing events recorded
// there and reused after each clear(). The driver thread's alone, like the profiler's scopes.
class CudaTimeline final : public DeviceTimeline {
 public:
  explicit CudaTimeline(int device) : device_(device) {}
  ~CudaTimeline() override {
    if (g_exiting.load()) return;  // Note [CUDA at exit]
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }
  CudaTimeline(const CudaTimeline&) = delete;
  CudaTimeline& operator=(const CudaTimeline&) = delete;
  void set_stream(cudaStream_t compute) { stream_ = compute; }

  uint32_t mark() override {
    ZERONE_CUDA_CHECK(cudaSetDevice(device_));
    if (used_ == events_.size()) {
      cudaEvent_t e;
      ZERONE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));  // timed
      events_.push_back(e);
    }
    ZERONE_CUDA_CHECK(cudaEventRecord(events_[used_], stream_));
    return static_cast<uint32_t>(used_++);
  }
  double seconds_between(uint32_t earlier, uint32_t later) override {
    ZERONE_ASSERT(earlier < used_ && later < used_ && earlier <= later, "cuda timeline: no such points");
    ZERONE_CUDA_CHECK(cudaEventSynchronize(events_[later]));
    float ms = 0.0f;
    ZERONE_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[earlier], events_[later]));
    return static_cast<double>(ms) / 1000.0;
  }
  void wait_for(uint32_t point) override {
    ZERONE_ASSERT(point < used_, "cuda timeline: no such point");
    ZERONE_CUDA_CHECK(cudaEventSynchronize(events_[point]));
  }
  void clear() override { used_ = 0; }

 private:
  const int device_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;  // points 0..used_-1 recorded since clear()
  size_t used_ = 0;
};

class CudaBackend final : public kernels::Backend {
 public:
  CudaBackend(int device, kernels::CudaAttention attention)
      : device_(device), attention_(attention), timeline_(device) {
    ZERONE_CUDA_CHECK(cudaSetDevice(device_));
    for (cudaStream_t& s : streams_) ZERONE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    timeline_.set_stream(compute());
    arena_ = std::make_unique<CudaArena>(device_, compute());
    ZERONE_CUBLAS_CHECK(lib_.create(&lt_));
    cudaDeviceProp prop;
    ZERONE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    static const char* kHex = "0123456789abcdef";
    for (char byte : prop.uuid.bytes) {
      uuid_ += kHex[static_cast<unsigned char>(byte) >> 4];
      uuid_ += kHex[static_cast<unsigned char>(byte) & 15];
    }
    name_ = prop.name;
    description_ = str_cat("cuda:", device_, " ", prop.name, " (sm_", prop.major, prop.minor, ", ",
                           prop.multiProcessorCount, " SMs, ", version_string(), ", cuBLASLt ", lib_.get_version(),
                           ", ", kernels::cuda_attention_name(attention_), " attention)");
  }
  ~CudaBackend() override {
    for (Buffer& b : scratch_) b.reset();
    destroy_gemm_plans();
    if (lt_) (void)lib_.destroy(lt_);
    for (cudaStream_t s : streams_) (void)cudaStreamDestroy(s);
  }

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string description() const override { return description_; }
  std::optional<kernels::GpuPeak> peak(DType dtype) const override { return kernels::known_gpu_peak(name_, dtype); }
  bool host_addressable() const override { return false; }
  DeviceTimeline* device_timeline() override { return &timeline_; }
  MemoryArena& device_arena() override { return *arena_; }
  // Note [Attention's saved state] (kernels/backend.h): flash keeps the rows' logsumexp in att.
  kernels::DeviceOptions device_options() const override { return {.cuda_attention = attention_}; }
  // Note [Device memory the ledger cannot see] (kernels/backend.h): free with the context resident.
  std::optional<kernels::DeviceMemory> device_memory() const override {
    const MemoryInfo m = memory_info(device_);
    return kernels::DeviceMemory{m.total_bytes, m.free_bytes};
  }
  bool tensor_core_attention(DType operands, int hs) const override {
    return operands != DType::f32 && attention_ == kernels::CudaAttention::flash &&
           cuda::flash_attention_takes_16bit(operands, hs);
  }
  MemoryArena* host_arena() override { return &pinned_; }
  void release_cached_memory() override {
    for (Buffer& b : scratch_) b.reset();
    arena_->trim();
  }
  std::string device_identity() const override { return uuid_; }
  int native_device() const override { return device_; }
  void* native_stream(Stream stream) const override { return stream_of(stream); }
  MemPlace place_of(const void* p) const override {
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return MemPlace::host;
    }
    return attr.type == cudaMemoryTypeDevice && attr.device == device_ ? MemPlace::device : MemPlace::host;
  }

  // record and wait may come from any thread (the communication thread records staged copies):
  // an event is created on the calling thread's current device, which must be this backend's.
  Event record(Stream stream) override {
    ZERONE_CUDA_CHECK(cudaSetDevice(device_));
    if (stream != Stream::compute) join(stream_of(stream), compute());
    return Event(std::make_shared<const CudaEvent>(stream_of(stream)));
  }
  void wait(Stream stream, const Event& event) override {
    const auto* e = dynamic_cast<const CudaEvent*>(event.impl());
    if (e == nullptr) return;  // a default (complete) event
    ZERONE_CUDA_CHECK(cudaSetDevice(device_));
    ZERONE_CUDA_CHECK(cudaStreamWaitEvent(stream_of(stream), e->handle(), 0));
  }
  void synchronize(Stream stream) override {
    ZERONE_CUDA_CHECK(cudaSetDevice(device_));
    ZERONE_CUDA_CHECK(cudaStreamSynchronize(compute()));  // other streams' work may wait for compute's
    if (stream != Stream::compute) ZERONE_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream)));
  }

  // A copy with a host side returns when it is done, so later work of any stream sees it. The
  // host waits for the compute the copy joined first, then for the copy as a transfer (Note
  // [Exposed time]): the same end, the wait told apart.
  void copy(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) override {
    cudaEvent_t inputs = nullptr;
    const cudaStream_t s = enqueue_copy(dst, dst_place, src, src_place, bytes, &inputs);
    if (inputs == nullptr) return;  // none, or on the compute stream: ordered like a kernel
    const cudaError_t waited = cudaEventSynchronize(inputs);
    (void)cudaEventDestroy(inputs);
    ZERONE_CUDA_CHECK(waited);
    ProfileScope profile(ProfileCategory::transfer);
    ZERONE_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  // Note [Asynchronous copies] (kernels/backend.h): the event recorded after the copy on its stream.
  Event copy_async(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) override {
    cudaEvent_t inputs = nullptr;
    const cudaStream_t s = enqueue_copy(dst, dst_place, src, src_place, bytes, &inputs);
    return s == nullptr ? Event() : Event(std::make_shared<const CudaEvent>(s, inputs));
  }
  // Each operation below opens a DeviceWorkScope of its category, which times it on the device
  // timeline under --profile (Note [Device compute itemized], core/profiler.h): gemm() its GEMMs,
  // the attention forms attention, AdamW and SGD optimizer, the rest elementwise.
  void fill_zero(void* dst, size_t bytes) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    if (bytes > 0) ZERONE_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, compute()));
  }
  void accumulate(float* dst, const float* src, size_t n) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::accumulate(dst, src, n, compute());
  }
  PendingSum sum_squares(const float* x, size_t n, float* copy_to) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    return pending_partials({norm_blocks(n)}, [&](double* dev) { sum_squares_partials(x, n, copy_to, dev, compute()); });
  }
  double sum(const float* x, size_t n) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    return in_order(n, [&](double* dev) { sum_partials(x, n, dev, compute()); });
  }
  void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::convert(dst, dst_dtype, src, src_dtype, n, compute());
  }
  bool all_finite(const float* x, size_t n) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    if (n == 0) return true;
    int* flag = static_cast<int*>(scratch(Slot::flag, sizeof(int)));
    ZERONE_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), compute()));
    mark_not_finite(x, n, flag, compute());
    int bad = 0;
    ZERONE_CUDA_CHECK(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, compute()));
    ZERONE_CUDA_CHECK(cudaStreamSynchronize(compute()));
    return bad == 0;
  }
  void quantize_blockwise(const void* src, DType src_dtype, size_t n, int bits, size_t block, void* out) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    (void)kernels::cpu::quantized_bytes(n, bits, block);  // checks bits and block
    cuda::quantize_blockwise(src, src_dtype, n, bits, block, out, compute());
  }
  void dequantize_blockwise(const void* in, size_t n, int bits, size_t block, void* dst, DType dst_dtype,
                            bool accumulate) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    (void)kernels::cpu::quantized_bytes(n, bits, block);
    cuda::dequantize_blockwise(in, n, bits, block, dst, dst_dtype, accumulate, compute());
  }

  PendingSum adamw_update(float* master, float* m, float* v, const float* grad, void* param, DType param_dtype,
                          size_t n, const AdamWHyper& hyper) override {
    // Note [Updates that measure the norm]: the same sum as sum_squares(grad, n).
    return adamw_update_ranges({{master, m, v, grad, param, n, hyper}}, param_dtype);
  }
  PendingSum adamw_update_ranges(const std::vector<AdamWRange>& ranges, DType param_dtype) override {
    const DeviceWorkScope work(ProfileCategory::optimizer);
    // Every range's partials side by side, one copy for all; each range's partials then added as
    // sum_squares adds them, the ranges in order (the groups).
    std::vector<size_t> groups;
    for (const AdamWRange& r : ranges) groups.push_back(norm_blocks(r.n));
    return pending_partials(std::move(groups), [&](double* dev) {
      cuda::adamw_update_ranges(ranges.data(), ranges.size(), param_dtype, dev, compute());  // partials side by side
    });
  }
  PendingSum sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n,
                        const SGDHyper& hyper) override {
    const DeviceWorkScope work(ProfileCategory::optimizer);
    return pending_partials({norm_blocks(n)}, [&](double* dev) {
      cuda::sgd_update(master, momentum, grad, param, param_dtype, n, hyper, dev, compute());
    });
  }

  void embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype, int B,
                         int T, int C, int V) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::embedding_forward(out, tokens, wte, wpe, param_dtype, B, T, C, compute());
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                          int V) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, compute());
  }
  void layernorm_forward(void* out, DType out_dtype, float* mean, float* rstd, const float* inp, const void* weight,
                         const void* bias, DType param_dtype, int N, int C) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::layernorm_forward(out, out_dtype, mean, rstd, inp, weight, bias, param_dtype, N, C, compute());
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const void* weight, DType param_dtype, const float* mean, const float* rstd, int N,
                          int C) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, param_dtype, mean, rstd, N, C,
                             column_partials(N, C), compute());
  }

  // Note [CUDA linear]: the cpu kernel's arithmetic (kernels/cpu/ops.cc): with bf16 or f16 weights
  // the activation (and gradient) operands are rounded to the weights' dtype and the GEMM
  // multiplies those in f32 (products of two 16-bit values are exact in f32) with f32 accumulation
  // and an f32 result; f32 weights give an f32 GEMM (no TF32). Row-major (N, C) is column-major
  // (C, N), so each product below is the transposed one in cuBLASLt's column-major terms. An
  // operand already in the weights' dtype goes to the GEMM as it is (Note [GEMM operands in the
  // compute dtype], kernels/backend.h).
  void linear_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, const void* weight,
                      const void* bias, DType param_dtype, int N, int C, int OC) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    ZERONE_ASSERT(out_dtype == DType::f32 || out_dtype == param_dtype, "a ", dtype_name(out_dtype), " output for ",
                  dtype_name(param_dtype), " weights");
    if (N == 0 || OC == 0) return;
    const void* x = operand(inp, inp_dtype, sz(N) * C, param_dtype, Slot::operand_a);
    if (out_dtype != DType::f32) {
      // Note [Logits in the compute dtype]: cuBLASLt rounds its f32 accumulators into the 16-bit
      // out as it stores them, after its epilogue added the bias (in D's dtype, copied into
      // 256-byte aligned scratch; GPT-2's qkv: Note [Attention's inputs and output in the compute
      // dtype]).
      const void* bias16 = nullptr;
      if (bias) {
        void* aligned_bias = scratch(Slot::bias, sz(OC) * dtype_size(param_dtype));
        ZERONE_CUDA_CHECK(cudaMemcpyAsync(aligned_bias, bias, sz(OC) * dtype_size(param_dtype), cudaMemcpyDefault,
                                          compute()));
        bias16 = aligned_bias;
      }
      if (gemm(true, false, OC, N, C, weight, param_dtype, C, x, C, out, OC, 0.0f, bias16, out_dtype) || !bias) return;
      // No algorithm with the bias epilogue for this 16-bit GEMM: the f32 form (bias included) in
      // bands of rows, as gemm()'s fallback bands its columns (kWideBandBytes of scratch at most).
      const int band_rows = static_cast<int>(std::max<size_t>(1, kWideBandBytes / (sz(OC) * sizeof(float))));
      float* wide = static_cast<float*>(scratch(Slot::wide_d, sz(std::min(band_rows, N)) * OC * sizeof(float)));
      const size_t elem = dtype_size(param_dtype);
      for (int r0 = 0; r0 < N; r0 += band_rows) {
        const int rows = std::min(band_rows, N - r0);
        linear_forward(wide, DType::f32, static_cast<const uint8_t*>(x) + sz(r0) * C * elem, param_dtype, weight, bias,
                       param_dtype, rows, C, OC);
        cuda::convert(static_cast<uint8_t*>(out) + sz(r0) * OC * elem, out_dtype, wide, DType::f32, sz(rows) * OC,
                      compute());
      }
      return;
    }
    // Note [Bias in the GEMM's epilogue]: the bias widened to f32 (exactly) and added by cuBLASLt
    // as it writes out, in f32 as add_bias would: one pass over out fewer.
    float* bias_f32 = nullptr;
    if (bias) {
      bias_f32 = static_cast<float*>(scratch(Slot::bias, sz(OC) * sizeof(float)));
      cuda::convert(bias_f32, DType::f32, bias, param_dtype, sz(OC), compute());
    }
    // out^T (OC, N) = W (C, OC)^T x^T (C, N) (+ bias on every column)
    const bool bias_added = gemm(true, false, OC, N, C, weight, param_dtype, C, x, C, out, OC, 0.0f, bias_f32);
    if (bias && !bias_added) add_bias(static_cast<float*>(out), bias, param_dtype, N, OC, compute());
  }
  void linear_backward(float* dinp, float* dweight, float* dbias, const void* dout, DType dout_dtype, const void* inp,
                       DType inp_dtype, const void* weight, DType param_dtype, int N, int C, int OC,
                       bool accumulate_param_grads) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    ZERONE_ASSERT(dbias == nullptr || dout_dtype == DType::f32, "the bias gradient sums dout in f32");
    if (N == 0) {
      if (!accumulate_param_grads) {
        fill_zero(dweight, sz(OC) * C * sizeof(float));
        if (dbias) fill_zero(dbias, sz(OC) * sizeof(float));
      }
      return;
    }
    // With a bias and 16-bit weights the bias's pass over dout also stores the GEMMs' rounded
    // operand (Note [Rounded on the way], kernels.h); otherwise operand() rounds it, if need be.
    const void* dy = nullptr;
    if (dbias != nullptr && param_dtype != DType::f32) {
      void* rounded = scratch(Slot::operand_a, sz(N) * OC * 2);
      bias_backward(dbias, static_cast<const float*>(dout), N, OC, accumulate_param_grads, rounded, param_dtype,
                    column_partials(N, OC), compute());
      dy = rounded;
    } else {
      dy = operand(dout, dout_dtype, sz(N) * OC, param_dtype, Slot::operand_a);
    }
    linear_backward_gemms(dinp, dweight, dy, inp, inp_dtype, weight, param_dtype, N, C, OC, accumulate_param_grads);
    if (dbias != nullptr && param_dtype == DType::f32)
      bias_backward(dbias, static_cast<const float*>(dout), N, OC, accumulate_param_grads, nullptr, DType::f32,
                    column_partials(N, OC), compute());
  }
  // Note [GELU's backward in the linear's] (kernels/backend.h): with 16-bit weights and a bias, one
  // pass forms dout from dgelu, sums the bias and stores the GEMMs' rounded operand; elsewhere (and
  // where that pass cannot run) the two calls.
  void linear_backward_through_gelu(float* dinp, float* dweight, float* dbias, float* dgelu, const void* pre,
                                    DType pre_dtype, const void* inp, DType inp_dtype, const void* weight,
                                    DType param_dtype, int N, int C, int OC, bool accumulate_param_grads) override {
    if (N > 0 && dbias != nullptr && param_dtype != DType::f32 && pre_dtype == param_dtype) {
      const DeviceWorkScope work(ProfileCategory::elementwise);
      void* rounded = scratch(Slot::operand_a, sz(N) * OC * 2);  // linear_backward's sizes
      if (cuda::gelu_bias_backward(dbias, dgelu, pre, pre_dtype, N, OC, accumulate_param_grads, rounded,
                                   column_partials(N, OC), compute())) {
        linear_backward_gemms(dinp, dweight, rounded, inp, inp_dtype, weight, param_dtype, N, C, OC,
                              accumulate_param_grads);
        return;
      }
    }
    Backend::linear_backward_through_gelu(dinp, dweight, dbias, dgelu, pre, pre_dtype, inp, inp_dtype, weight,
                                          param_dtype, N, C, OC, accumulate_param_grads);
  }
  // A linear's backward GEMMs on dy (N, OC), already in param_dtype: dinp (if wanted) and dweight.
  void linear_backward_gemms(float* dinp, float* dweight, const void* dy, const void* inp, DType inp_dtype,
                             const void* weight, DType param_dtype, int N, int C, int OC, bool accumulate_param_grads) {
    // dinp^T (C, N) = W (C, OC) dy^T (OC, N)
    if (dinp) gemm(false, false, C, N, OC, weight, param_dtype, C, dy, OC, dinp, C, 0.0f);
    const void* x = operand(inp, inp_dtype, sz(N) * C, param_dtype, Slot::operand_b);
    // dW^T (C, OC) (+)= x^T (C, N) dy (N, OC)
    gemm(false, true, C, OC, N, x, param_dtype, C, dy, OC, dweight, C, accumulate_param_grads ? 1.0f : 0.0f);
  }

  void attention_forward(void* out, float* att, const void* qkv, int B, int T, int C, int NH,
                         DType operands) override {
    gqa_attention_forward(out, att, qkv, B, T, NH, NH, C / NH, operands);
  }
  void attention_backward(float* dqkv, const float* dout, const void* qkv, const void* out, const float* att, int B,
                          int T, int C, int NH, DType operands) override {
    gqa_attention_backward(dqkv, dout, qkv, out, att, B, T, NH, NH, C / NH, operands);
  }
  // Note [Attention's inputs and output in the compute dtype]: qkv and out in `operands`. The
  // tensor-core flash form reads and writes them so; the f32 flash form (a head size it is not
  // built for) and the plain form run on qkv widened into scratch, their out rounded after.
  // (The tensor-core kernels also need 16-byte aligned qkv, 4-byte aligned out and 8-byte aligned
  // dqkv: the models' buffers are; anything else widens. Forward and backward may take different
  // forms: both save the same lse.)
  bool attention_in_16_bits(DType operands, int hs, const void* qkv, const void* out_or_dqkv,
                            uint32_t out_alignment) const {
    return tensor_core_attention(operands, hs) && alignment_of(qkv) >= 16 && alignment_of(out_or_dqkv) >= out_alignment;
  }
  const float* widened_qkv(const void* qkv, DType operands, size_t n) {
    if (operands == DType::f32) return static_cast<const float*>(qkv);
    float* wide = static_cast<float*>(scratch(Slot::attention_qkv, n * sizeof(float)));
    cuda::convert(wide, DType::f32, qkv, operands, n, compute());
    return wide;
  }
  void gqa_attention_forward(void* out, float* att, const void* qkv, int B, int T, int NH, int NKV, int hs,
                             DType operands) override {
    const DeviceWorkScope work(ProfileCategory::attention);
    const size_t BT = sz(B) * T, qkv_n = BT * (NH + 2 * NKV) * hs, out_n = BT * NH * hs;
    const bool flash = attention_ == kernels::CudaAttention::flash;
    if (attention_in_16_bits(operands, hs, qkv, out, 4)) {  // att: lse (B, NH, T)
      cuda::flash_attention_forward(
          out, att, qkv, B, T, NH, NKV, hs, operands,
          scratch(Slot::operand_a, cuda::flash_attention_scratch_bytes(B, T, NH, NKV, hs, operands, false)), compute());
      return;
    }
    const float* q32 = widened_qkv(qkv, operands, qkv_n);
    float* o32 = operands == DType::f32 ? static_cast<float*>(out)
                                        : static_cast<float*>(scratch(Slot::attention_out, out_n * sizeof(float)));
    if (flash)
      cuda::flash_attention_forward(o32, att, q32, B, T, NH, NKV, hs, DType::f32, nullptr, compute());
    else
      cuda::gqa_attention_forward(o32, att, q32, B, T, NH, NKV, hs, compute());
    if (operands != DType::f32) cuda::convert(out, operands, o32, DType::f32, out_n, compute());
  }
  void gqa_attention_backward(float* dqkv, const float* dout, const void* qkv, const void* out, const float* att,
                              int B, int T, int NH, int NKV, int hs, DType operands) override {
    const DeviceWorkScope work(ProfileCategory::attention);
    const size_t qkv_n = sz(B) * T * (NH + 2 * NKV) * hs;
    if (attention_ == kernels::CudaAttention::flash) {
      float* dsum = static_cast<float*>(scratch(Slot::scores, sizeof(float) * sz(B) * NH * T));  // (B, NH, T)
      if (attention_in_16_bits(operands, hs, qkv, dqkv, 8)) {
        cuda::flash_attention_backward(
            dqkv, dsum, dout, qkv, out, att, B, T, NH, NKV, hs, operands,
            scratch(Slot::operand_a, cuda::flash_attention_scratch_bytes(B, T, NH, NKV, hs, operands, true)), compute());
      } else {  // the f32 form forms D from P and dP: out unread
        cuda::flash_attention_backward(dqkv, dsum, dout, widened_qkv(qkv, operands, qkv_n), nullptr, att, B, T, NH,
                                       NKV, hs, DType::f32, nullptr, compute());
      }
      return;
    }
    const float* q32 = widened_qkv(qkv, operands, qkv_n);
    float* datt = static_cast<float*>(scratch(Slot::scores, sizeof(float) * sz(B) * NH * T * T));  // (B, NH, T, T)
    cuda::gqa_attention_backward(dqkv, dout, q32, att, datt, B, T, NH, NKV, hs, compute());
  }
  void rmsnorm_forward(void* out, DType out_dtype, float* rstd, const float* inp, const void* weight,
                       DType param_dtype, int N, int C, float eps) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::rmsnorm_forward(out, out_dtype, rstd, inp, weight, param_dtype, N, C, eps, compute());
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight,
                        DType param_dtype, const float* rstd, int N, int C, void* dinp_rounded,
                        DType rounded_dtype) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::rmsnorm_backward(dinp, dweight, dout, inp, weight, param_dtype, rstd, N, C, dinp_rounded, rounded_dtype,
                           column_partials(N, C), compute());
  }
  void rope_forward(void* x, DType x_dtype, const float* inv_freq, int B, int T, int stride, int heads,
                    int hs) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    rope_rotate(x, x_dtype, inv_freq, B, T, stride, heads, hs, 1.0f, compute());
  }
  void rope_backward(float* dx, const float* inv_freq, int B, int T, int stride, int heads, int hs, void* dx_rounded,
                     DType rounded_dtype) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    // The rotation is orthogonal: its transpose (the gradient map) is the rotation by -angle.
    if (dx_rounded)
      cuda::rope_backward_rounded(dx_rounded, rounded_dtype, dx, inv_freq, B, T, stride, heads, hs, compute());
    else
      rope_rotate(dx, DType::f32, inv_freq, B, T, stride, heads, hs, -1.0f, compute());
  }
  void swiglu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, int N, int F) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::swiglu_forward(out, out_dtype, inp, inp_dtype, N, F, compute());
  }
  void swiglu_backward(void* dinp, DType dinp_dtype, const float* dout, const void* inp, DType inp_dtype, int N,
                       int F) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::swiglu_backward(dinp, dinp_dtype, dout, inp, inp_dtype, N, F, compute());
  }
  void gelu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, size_t n) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::gelu_forward(out, out_dtype, inp, inp_dtype, n, compute());
  }
  void gelu_backward(float* dinp, const void* inp, DType inp_dtype, const float* dout, size_t n) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::gelu_backward(dinp, inp, inp_dtype, dout, n, compute());
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::residual_forward(out, a, b, n, compute());
  }
  void crossentropy_forward(float* losses, float* lse, const void* logits, DType logits_dtype, const int32_t* targets,
                            int N, int V, int Vp) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::crossentropy_forward(losses, lse, logits, logits_dtype, targets, N, V, Vp, compute());
  }
  void crossentropy_backward(void* dlogits, DType dlogits_dtype, const void* logits, DType logits_dtype,
                             const float* lse, const int32_t* targets, float dloss, int N, int V, int Vp) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::crossentropy_backward(dlogits, dlogits_dtype, logits, logits_dtype, lse, targets, dloss, N, V, Vp, compute());
  }

  void relu_forward(float* out, const float* inp, size_t n) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::relu_forward(out, inp, n, compute());
  }
  void relu_backward(float* dinp, const float* dout, const float* out, size_t n) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::relu_backward(dinp, dout, out, n, compute());
  }
  void dropout_forward(float* out, const float* inp, int N, size_t per_sample, float p,
                       const DropoutKey& key) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    dropout(out, inp, N, per_sample, p, key, compute());
  }
  void dropout_backward(float* dinp, const float* dout, int N, size_t per_sample, float p,
                        const DropoutKey& key) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    dropout(dinp, dout, N, per_sample, p, key, compute());  // the same mask and scale
  }
  float softmax_cross_entropy_forward(float* probs, float* losses, const float* logits, const int32_t* labels, int N,
                                      int K, int64_t* correct) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    if (N == 0) {
      if (correct) *correct = 0;
      return 0.0f;
    }
    int32_t* hits = static_cast<int32_t*>(scratch(Slot::hits, sizeof(int32_t) * sz(N)));
    cuda::softmax_cross_entropy_forward(probs, losses, hits, logits, labels, N, K, compute());
    std::vector<float> host_losses(sz(N));
    std::vector<int32_t> host_hits(sz(N));
    ZERONE_CUDA_CHECK(cudaMemcpyAsync(host_losses.data(), losses, sizeof(float) * sz(N), cudaMemcpyDeviceToHost, compute()));
    ZERONE_CUDA_CHECK(cudaMemcpyAsync(host_hits.data(), hits, sizeof(int32_t) * sz(N), cudaMemcpyDeviceToHost, compute()));
    ZERONE_CUDA_CHECK(cudaStreamSynchronize(compute()));
    double total = 0.0;
    int64_t hit_count = 0;
    for (int n = 0; n < N; ++n) total += host_losses[n], hit_count += host_hits[n];
    if (correct) *correct = hit_count;
    return static_cast<float>(total / N);
  }
  void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K,
                                      float scale) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::softmax_cross_entropy_backward(dlogits, probs, labels, N, K, scale, compute());
  }
  // Plain layouts only: nothing is ever held blocked on the GPU.
  int activation_channel_block() override { return 0; }
  size_t activation_numel(int C, int H, int W, ActLayout layout) override {
    ZERONE_ASSERT(layout == ActLayout::plain, "cuda: activations are held plain (activation_channel_block() is 0)");
    return sz(C) * H * W;
  }
  void activation_to_plain(float*, const float*, int, int, int, int) override {
    ZERONE_ASSERT(false, "cuda: activations are held plain (activation_channel_block() is 0)");
  }
  void activation_to_blocked(float*, const float*, int, int, int, int) override {
    ZERONE_ASSERT(false, "cuda: activations are held plain (activation_channel_block() is 0)");
  }
  void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                      const Conv2dShape& s) override {
    const DeviceWorkScope work(ProfileCategory::gemm);
    cuda::conv2d_forward(out, inp, weight, bias, s, compute());
  }
  void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const Conv2dShape& s, bool accumulate_param_grads) override {
    const DeviceWorkScope work(ProfileCategory::gemm);
    cuda::conv2d_backward(dinp, dweight, dbias, dout, inp, weight, s, accumulate_param_grads, compute());
  }
  size_t maxpool2d_workspace_bytes(const Pool2dShape& s) override { return cuda::maxpool2d_workspace_bytes(s); }
  void maxpool2d_forward(float* out, void* workspace, const float* inp, const Pool2dShape& s) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::maxpool2d_forward(out, static_cast<int32_t*>(workspace), inp, s, compute());
  }
  void maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s) override {
    const DeviceWorkScope work(ProfileCategory::elementwise);
    cuda::maxpool2d_backward(dinp, dout, static_cast<const int32_t*>(workspace), s, compute());
  }

 private:
  // Note [Backend scratch] (kernels/scratch.h): device buffers that only grow (the cpu kernels'
  // Note [Scratch arena]), one per kernels::ScratchSlot; the training thread alone uses them.
  // A slot grows by freeing its old memory first, in stream order (the kernels that read it were
  // enqueued before on the same stream), so that the ledger's peak is the slots' sizes and not
  // the old and the new side by side.
  using Slot = kernels::ScratchSlot;
  // The f32 scratch of a 16-bit output's fallback forms, at most (gemm, linear_forward).
  static constexpr size_t kWideBandBytes = cuda::kGemmWideBandBytes;
  void* scratch(Slot slot, size_t bytes) {
    Buffer& b = scratch_[static_cast<size_t>(slot)];
    if (b.bytes() < bytes) {
      b.reset();
      b = Buffer(bytes, MemCategory::scratch, MemPlace::device, 256, *arena_);
    }
    return b.data();
  }

  cudaStream_t compute() const { return streams_[0]; }
  float* column_partials(int N, int C) {
    return static_cast<float*>(scratch(Slot::column_partials, cuda::column_sum_partials_numel(N, C) * sizeof(float)));
  }
  // Enqueues dst = src and returns the stream it runs on, or null when it is done already (nothing
  // to copy, or host to host: memcpy). Device to device runs on compute; a copy with a host side
  // on its direction's copy stream after the compute work submitted so far (which may write its
  // source or still read its destination; Note [CUDA backend design]).
  // The stream the copy runs on (null: none ran, or a memcpy between host buffers); for a copy
  // with a host side, *inputs gets the event of the compute it waits for (the caller destroys it).
  cudaStream_t enqueue_copy(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes,
                            cudaEvent_t* inputs) {
    ZERONE_ASSERT(dst_place != MemPlace::nvme && src_place != MemPlace::nvme, "copy: NVMe is not memory");
    if (bytes == 0 || dst == src) return nullptr;
    if (dst_place == MemPlace::host && src_place == MemPlace::host) {
      std::memcpy(dst, src, bytes);
      return nullptr;
    }
    ZERONE_CUDA_CHECK(cudaSetDevice(device_));
    const cudaMemcpyKind kind = dst_place == MemPlace::device
                                    ? (src_place == MemPlace::device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                    : cudaMemcpyDeviceToHost;
    if (kind == cudaMemcpyDeviceToDevice) {  // on the compute stream: the GPU's work, as a kernel's
      const DeviceWorkScope work(ProfileCategory::elementwise);
      ZERONE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, compute()));
      return compute();
    }
    const cudaStream_t s = stream_of(kind == cudaMemcpyHostToDevice ? Stream::host_to_device : Stream::device_to_host);
    *inputs = join(s, compute(), /*keep=*/true);
    ZERONE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
    return s;
  }
  cudaStream_t stream_of(Stream s) const { return streams_[static_cast<int>(s)]; }
  // `later` waits for everything submitted to `earlier` so far. With `keep`, returns the event of
  // that point (the caller destroys it); else releases it (once the wait is done) and returns null.
  cudaEvent_t join(cudaStream_t later, cudaStream_t earlier, bool keep = false) {
    cudaEvent_t e;
    ZERONE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ZERONE_CUDA_CHECK(cudaEventRecord(e, earlier));
    ZERONE_CUDA_CHECK(cudaStreamWaitEvent(later, e, 0));
    if (keep) return e;
    ZERONE_CUDA_CHECK(cudaEventDestroy(e));
    return nullptr;
  }

  // Note [Deterministic gradient norm]: per-chunk double partials summed on the host in chunk order;
  // `fill` leaves them in device scratch. The host waits for them here.
  template <typename Fill>
  double in_order(size_t n, Fill&& fill) {
    const size_t blocks = norm_blocks(n);
    if (blocks == 0) return 0.0;
    std::vector<double> host(blocks);
    double* dev = static_cast<double*>(scratch(Slot::norm_partials, blocks * sizeof(double)));
    fill(dev);
    partials_to_host(dev, host.data(), blocks, compute());
    double total = 0.0;
    for (double p : host) total += p;
    return total;
  }

  // Note [Norms read once a step] (core/pending_sum.h): the partials `fill` leaves in device scratch
  // (the groups' total, in order) are copied to pinned host memory on the compute stream, after
  // which the next use of the scratch is queued, and are added when the value is read: the host
  // does not wait here. Note [Partial sums' host blocks]: a PendingSum may be dropped unread (the
  // updates' sums where the norm was measured first) while its copy is still queued, so its block
  // must not go back to the pinned arena, whose next user could be any host buffer that the late
  // copy would then overwrite. The blocks are the backend's own instead (from the arena, never
  // returned): a dropped one is kept for the next partials, whose copy is queued on the same
  // stream after the late one. Sizes are powers of two from 4 KiB, so a step's updates reuse a
  // few; a few kilobytes a unit in all, outside the ledger, as the events are.
  template <typename Fill>
  PendingSum pending_partials(std::vector<size_t> groups, Fill&& fill) {
    size_t blocks = 0;
    for (size_t g : groups) blocks += g;
    if (blocks == 0) return PendingSum(0.0);
    double* dev = static_cast<double*>(scratch(Slot::norm_partials, blocks * sizeof(double)));
    fill(dev);
    const size_t bytes = std::bit_ceil(std::max<size_t>(blocks * sizeof(double), 4096));
    double* host = take_partials_block(bytes);
    std::shared_ptr<const double> partials(host, [this, bytes](const double* p) {
      std::lock_guard<std::mutex> lock(partials_mutex_);
      partials_blocks_.emplace(bytes, const_cast<double*>(p));
    });
    ZERONE_CUDA_CHECK(cudaMemcpyAsync(host, dev, blocks * sizeof(double), cudaMemcpyDeviceToHost, compute()));
    return PendingSum::of_partials(std::move(partials), std::move(groups), record(Stream::compute));
  }
  // A kept partials block of `bytes`, or a new one (Note [Partial sums' host blocks]).
  double* take_partials_block(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(partials_mutex_);
      if (auto it = partials_blocks_.find(bytes); it != partials_blocks_.end()) {
        double* block = it->second;
        partials_blocks_.erase(it);
        return block;
      }
    }
    void* block = pinned_.allocate(bytes, alignof(double));
    if (block == nullptr) throw std::bad_alloc();
    return static_cast<double*>(block);
  }

  // `src` (n values of src_dtype: f32, or already `dtype`) as a GEMM operand for weights of `dtype`
  // (Note [CUDA linear]).
  const void* operand(const void* src, DType src_dtype, size_t n, DType dtype, Slot slot) {
    ZERONE_ASSERT(src_dtype == DType::f32 || src_dtype == dtype, "a ", dtype_name(src_dtype), " GEMM operand for ",
                  dtype_name(dtype), " weights");
    if (src_dtype == dtype) return src;
    void* dst = scratch(slot, n * 2);
    cuda::convert(dst, dtype, src, DType::f32, n, compute());
    return dst;
  }

  // Note [GEMM plans]: a cuBLASLt GEMM needs a matmul descriptor, three matrix layouts and an
  // algorithm from the heuristic, which depends on the shape, the transposes, the dtype, the
  // leading dimensions and the operands' alignments. A training step repeats the same few dozen
  // GEMMs, so each is planned once (descriptors and algorithm kept in `gemm_plans_`, destroyed
  // with the backend) instead of on every call. Where the heuristic has no algorithm for 16-bit
  // operands (leading dimensions whose rows are not 16-byte aligned, as in the op harness's C = 7
  // and 11 rows), the GEMM runs in f32 on the operands widened exactly (wide_a / wide_b slots): the same
  // products, f32 accumulation as cuBLASLt's 16-bit path (CUBLAS_COMPUTE_32F), like the cpu
  // kernels' Note [oneDNN 2.6 AMX column tails]. Only an f32 GEMM without an algorithm aborts.
  struct GemmKey {
    bool trans_a, trans_b;
    int m, n, k, lda, ldb, ldd;
    DType dtype;
    uint32_t align_a, align_b, align_d;
    bool bias;  // the epilogue adds an f32 bias of m elements to every column (Note [Bias in the GEMM's epilogue])
    DType d_dtype;  // D's: f32, or `dtype` (Note [Logits in the compute dtype])
    auto tie() const {
      return std::tie(trans_a, trans_b, m, n, k, lda, ldb, ldd, dtype, align_a, align_b, align_d, bias, d_dtype);
    }
    bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
  };
  struct GemmPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool found = false;  // false: no algorithm for this dtype (the f32 fallback runs instead)
  };

  const GemmPlan& plan_gemm(const GemmKey& key) {
    auto it = gemm_plans_.find(key);
    if (it != gemm_plans_.end()) return it->second;
    constexpr size_t kWorkspaceBytes = kernels::kCudaGemmWorkspaceBytes;
    const cudaDataType t = cuda_type(key.dtype);
    GemmPlan plan;
    ZERONE_CUBLAS_CHECK(lib_.desc_create(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    ZERONE_CUBLAS_CHECK(lib_.desc_set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    ZERONE_CUBLAS_CHECK(lib_.desc_set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    if (key.bias) {  // the bias's dtype is D's by default (f32, or the 16-bit d_dtype)
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      ZERONE_CUBLAS_CHECK(lib_.desc_set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    }
    ZERONE_CUBLAS_CHECK(lib_.layout_create(&plan.la, t, key.trans_a ? key.k : key.m, key.trans_a ? key.m : key.k, key.lda));
    ZERONE_CUBLAS_CHECK(lib_.layout_create(&plan.lb, t, key.trans_b ? key.n : key.k, key.trans_b ? key.k : key.n, key.ldb));
    ZERONE_CUBLAS_CHECK(lib_.layout_create(&plan.ld, cuda_type(key.d_dtype), key.m, key.n, key.ldd));
    cublasLtMatmulPreference_t pref = nullptr;
    ZERONE_CUBLAS_CHECK(lib_.preference_create(&pref));
    ZERONE_CUBLAS_CHECK(lib_.preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &kWorkspaceBytes, sizeof kWorkspaceBytes));
    // cuBLASLt assumes 256-byte aligned operands unless told: the models pass views into larger
    // buffers, so each operand's true alignment is stated.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligned[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
    for (const auto& [attribute, bytes] : aligned)
      ZERONE_CUBLAS_CHECK(lib_.preference_set_attribute(pref, attribute, &bytes, sizeof bytes));
    if (key.d_dtype != DType::f32) {
      // A 16-bit D gets f32 sums rounded once: no split-K reduced in D's own dtype (in place, or
      // through output-type workspace), only one sequence or partials in the compute type.
      const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      ZERONE_CUBLAS_CHECK(lib_.preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                        sizeof schemes));
    }
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t status =
        lib_.algo_get_heuristic(lt_, plan.desc, plan.la, plan.lb, plan.ld, plan.ld, pref, 1, &heuristic, &found);
    lib_.preference_destroy(pref);
    // "Not supported" is the heuristic's way of saying none, as found == 0 is.
    ZERONE_ASSERT(status == CUBLAS_STATUS_SUCCESS || status == CUBLAS_STATUS_NOT_SUPPORTED,
                  "cuBLASLt heuristic: status ", static_cast<int>(status));
    plan.found = status == CUBLAS_STATUS_SUCCESS && found > 0;
    plan.algo = heuristic.algo;
    ZERONE_ASSERT(plan.found || key.dtype != DType::f32 || key.bias, "cuBLASLt has no algorithm for ", key.m, "x",
                  key.n, "x", key.k, " in f32");
    return gemm_plans_.emplace(key, plan).first->second;
  }

  // D (m, n; column-major, ld ldd, in d_dtype) = op(A) op(B) + beta D, where A and B are in `dtype`
  // with leading dimensions lda and ldb; op(X) = X^T when its flag is set. f32 compute and scale;
  // a 16-bit D (d_dtype == dtype, beta 0) gets the f32 sums rounded to nearest even.
  // bias (m elements of D's dtype, 256-byte aligned, or null): added to every column of D by the
  // epilogue before any rounding (Note [Bias in the GEMM's epilogue]); returns whether it was
  // (false: no algorithm has that epilogue for this GEMM; an f32 D is then made without it and the
  // caller adds it, a 16-bit D is not made at all and the caller takes an f32 form).
  bool gemm(bool trans_a, bool trans_b, int m, int n, int k, const void* a, DType dtype, int lda, const void* b,
            int ldb, void* d, int ldd, float beta, const void* bias = nullptr, DType d_dtype = DType::f32) {
    constexpr size_t kWorkspaceBytes = kernels::kCudaGemmWorkspaceBytes;  // Note [Backend scratch]
    ZERONE_ASSERT(d_dtype == DType::f32 || (d_dtype == dtype && beta == 0.0f && ldd == m),
                  "a 16-bit GEMM output is a fresh, plain matrix of the operands' dtype");
    const GemmPlan& plan = plan_gemm(GemmKey{trans_a, trans_b, m, n, k, lda, ldb, ldd, dtype, alignment_of(a),
                                             alignment_of(b), alignment_of(d), bias != nullptr, d_dtype});
    if (!plan.found && bias && d_dtype != DType::f32) return false;
    if (!plan.found && d_dtype != DType::f32) {
      // The f32 form (below, if need be) into scratch, then rounded: a band of D's columns at a
      // time, so that the scratch stays at most kWideBandBytes (an (N, Vp) logits matrix in f32
      // is what this dtype exists to avoid). D is column-major: a band is contiguous, and so is
      // the band of op(B)'s columns it needs (B's columns, or its rows when transposed).
      const size_t band_columns = std::max<size_t>(1, kWideBandBytes / (static_cast<size_t>(m) * sizeof(float)));
      float* wide = static_cast<float*>(scratch(Slot::wide_d, static_cast<size_t>(m) * std::min<size_t>(band_columns, n) *
                                                           sizeof(float)));
      for (size_t j0 = 0; j0 < static_cast<size_t>(n); j0 += band_columns) {
        const int cols = static_cast<int>(std::min<size_t>(band_columns, n - j0));
        const size_t b_offset = j0 * (trans_b ? 1 : static_cast<size_t>(ldb)) * dtype_size(dtype);
        gemm(trans_a, trans_b, m, cols, k, a, dtype, lda, static_cast<const uint8_t*>(b) + b_offset, ldb, wide, m, 0.0f);
        cuda::convert(static_cast<uint8_t*>(d) + j0 * m * dtype_size(d_dtype), d_dtype, wide, DType::f32,
                      static_cast<size_t>(m) * cols, compute());
      }
      return false;
    }
    if (!plan.found && bias) {
      gemm(trans_a, trans_b, m, n, k, a, dtype, lda, b, ldb, d, ldd, beta);
      return false;
    }
    if (!plan.found) {  // Note [GEMM plans]: f32 on the operands widened exactly
      // A column-major operand of `rows` x `cols` stored with leading dimension `ld` spans
      // (cols - 1) * ld + rows elements.
      auto widen = [&](const void* src, int rows, int cols, int ld, Slot slot) {
        const size_t span = static_cast<size_t>(cols - 1) * ld + rows;
        void* wide = scratch(slot, span * sizeof(float));
        cuda::convert(wide, DType::f32, src, dtype, span, compute());
        return static_cast<const void*>(wide);
      };
      const void* wide_a = widen(a, trans_a ? k : m, trans_a ? m : k, lda, Slot::wide_a);
      const void* wide_b = widen(b, trans_b ? n : k, trans_b ? k : n, ldb, Slot::wide_b);
      gemm(trans_a, trans_b, m, n, k, wide_a, DType::f32, lda, wide_b, ldb, d, ldd, beta);
      return false;
    }
    if (bias)  // read when the GEMM is enqueued: the kept descriptor may point at another bias next time
      ZERONE_CUBLAS_CHECK(lib_.desc_set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    void* workspace = scratch(Slot::gemm_workspace, kWorkspaceBytes);
    const float alpha = 1.0f;
    const DeviceWorkScope work(ProfileCategory::gemm);
    ZERONE_CUBLAS_CHECK(lib_.matmul(lt_, plan.desc, &alpha, a, plan.la, b, plan.lb, &beta, d, plan.ld, d, plan.ld,
                                    &plan.algo, workspace, kWorkspaceBytes, compute()));
    return bias != nullptr;
  }

  void destroy_gemm_plans() {
    for (auto& [key, plan] : gemm_plans_) {
      lib_.layout_destroy(plan.ld);
      lib_.layout_destroy(plan.lb);
      lib_.layout_destroy(plan.la);
      lib_.desc_destroy(plan.desc);
    }
    gemm_plans_.clear();
  }

  const int device_;
  const kernels::CudaAttention attention_;
  cudaStream_t streams_[4] = {};  // compute, comm, host_to_device, device_to_host (kernels::Stream's order)
  CudaTimeline timeline_;          // on streams_[0]
  std::string uuid_;               // device_identity()
  PinnedHostArena pinned_;
  std::mutex partials_mutex_;
  std::multimap<size_t, double*> partials_blocks_;  // bytes -> kept block (Note [Partial sums' host blocks])
  std::unique_ptr<CudaArena> arena_;
  const CublasLtLibrary& lib_ = cublaslt();  // loaded here (Note [cuBLASLt loaded on first use])
  cublasLtHandle_t lt_ = nullptr;
  std::map<GemmKey, GemmPlan> gemm_plans_;  // Note [GEMM plans]; the training thread's, like scratch_
  std::string description_;
  std::string name_;  // the driver's name of the GPU (Note [Known GPU peaks])
  Buffer scratch_[kernels::kScratchSlots];
};

}  // namespace

std::unique_ptr<kernels::Backend> make_cuda_backend(const kernels::DeviceOptions& options) {
  const int count = device_count();
  ZERONE_CHECK(count > 0, "--device cuda: no CUDA GPU found on this machine; use --device cpu or --device sim");
  auto backend = std::make_unique<CudaBackend>(local_rank() % count, options.cuda_attention);
  static const bool registered = [] { return std::atexit([] { g_exiting.store(true); }) == 0; }();  // Note [CUDA at exit]
  (void)registered;
  return backend;
}

}  // namespace zerone::cuda
