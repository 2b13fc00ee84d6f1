// The NCCL communicator (Note [NCCL collectives] in nccl_communicator.h).
#include "zerone/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>

#include "zerone/comm/traffic.h"
#include "zerone/core/error.h"

namespace zerone::comm {

namespace {

// A failing NCCL call is the collective's failure (a peer gone, a bad setup): Error, with NCCL's
// own last message where it has one.
#define ZERONE_NCCL_CHECK(expr)                                                                         \
  do {                                                                                                  \
    ncclResult_t zerone_nccl_status = (expr);                                                           \
    if (zerone_nccl_status != ncclSuccess)                                                              \
      throw Error(str_cat("NCCL call ", #expr, " failed: ", ncclGetErrorString(zerone_nccl_status),     \
                          last_message()));                                                             \
  } while (0)

// Inside the communicator's host code a failing CUDA call is an internal invariant (as in the
// CUDA backend, kernels/cuda/check.h).
#define ZERONE_NCCL_CUDA_CHECK(expr)                                                                    \
  do {                                                                                                  \
    cudaError_t zerone_cuda_status = (expr);                                                            \
    ZERONE_ASSERT(zerone_cuda_status == cudaSuccess, "CUDA call ", #expr, ": ", cudaGetErrorString(zerone_cuda_status)); \
  } while (0)

std::string last_message() {
  const char* last = ncclGetLastError(nullptr);
  return last != nullptr && last[0] != '\0' ? str_cat(" (", last, ")") : std::string();
}

// One NCCL group (ncclGroupStart ... ncclGroupEnd) that is closed on every path: a call inside it
// that fails throws, and the unwinding closes the group (its result ignored: the first error is the
// one reported), so that this thread's next NCCL call is not taken into a group left open.
class NcclGroup {
 public:
  NcclGroup() { ZERONE_NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  // Closes the group, launching what it holds; throws Error when NCCL fails.
  void end() {
    open_ = false;
    ZERONE_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

}  // namespace

struct NcclCommunicator::Handle {
  ncclComm_t comm = nullptr;
};

std::string nccl_library_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "(version unknown)";
  // Since NCCL 2.9 the code is major * 10000 + minor * 100 + patch (NCCL_VERSION in nccl.h).
  return str_cat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

NcclCommunicator::NcclCommunicator(Communicator& host, kernels::Backend& device)
    : host_(host), device_(device), comm_(std::make_unique<Handle>()), rank_(host.rank()), world_(host.world_size()) {
  ZERONE_CHECK(device.native_device() >= 0, "NCCL needs a CUDA device; the device is ", device.description());
  ZERONE_NCCL_CUDA_CHECK(cudaSetDevice(device.native_device()));
  ncclUniqueId id;
  if (rank_ == 0) ZERONE_NCCL_CHECK(ncclGetUniqueId(&id));
  host_.broadcast(&id, sizeof id, 0);  // host memory, over MPI
  ZERONE_NCCL_CHECK(ncclCommInitRank(&comm_->comm, world_, id, rank_));
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> host, kernels::Backend& device,
                                   std::unique_ptr<Handle> comm)
    : owned_host_(std::move(host)), host_(*owned_host_), device_(device), comm_(std::move(comm)),
      rank_(host_.rank()), world_(host_.world_size()) {}

NcclCommunicator::~NcclCommunicator() {
  if (!comm_ || comm_->comm == nullptr) return;
  // The collectives enqueued must finish before NCCL's buffers go; errors here cannot be thrown.
  (void)cudaSetDevice(device_.native_device());
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(device_.native_stream(kernels::Stream::comm)));
  const ncclResult_t finalized = ncclCommFinalize(comm_->comm);
  const ncclResult_t destroyed = ncclCommDestroy(comm_->comm);
  if (finalized != ncclSuccess || destroyed != ncclSuccess)
    std::fprintf(stderr, "zerone: warning: NCCL did not shut down cleanly: %s\n",
                 ncclGetErrorString(finalized != ncclSuccess ? finalized : destroyed));
}

std::string NcclCommunicator::description() const {
  return str_cat("NCCL ", nccl_library_version(), " (bootstrap: ", host_.description(), ")");
}

template <typename F> Work NcclCommunicator::enqueue(F&& enqueue) {
  ZERONE_NCCL_CUDA_CHECK(cudaSetDevice(device_.native_device()));
  // After the compute work submitted so far: it wrote what the collective reads, or still reads
  // what it writes.
  device_.wait(kernels::Stream::comm, device_.record(kernels::Stream::compute));
  enqueue(static_cast<cudaStream_t>(device_.native_stream(kernels::Stream::comm)));
  return Work(device_.record(kernels::Stream::comm));
}

Work NcclCommunicator::all_reduce_sum_async(float* data, size_t n) {
  count_traffic(hosts(), rank_, [&](int) { return 2 * n * sizeof(float) / static_cast<size_t>(world_); });
  return enqueue([&](cudaStream_t s) { ZERONE_NCCL_CHECK(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_->comm, s)); });
}

Work NcclCommunicator::all_reduce_sum_async(double* data, size_t n) {
  count_traffic(hosts(), rank_, [&](int) { return 2 * n * sizeof(double) / static_cast<size_t>(world_); });
  return enqueue([&](cudaStream_t s) { ZERONE_NCCL_CHECK(ncclAllReduce(data, data, n, ncclFloat64, ncclSum, comm_->comm, s)); });
}

Work NcclCommunicator::reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) {
  count_traffic(hosts(), rank_, [&](int) { return shard_n * sizeof(float); });
  // In place (out == in): NCCL's rule puts this rank's result in its own slot.
  float* result = out == in ? out + in_place_shard_offset(shard_n) : out;
  return enqueue([&](cudaStream_t s) {
    ZERONE_NCCL_CHECK(ncclReduceScatter(in, result, shard_n, ncclFloat32, ncclSum, comm_->comm, s));
  });
}

Work NcclCommunicator::all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) {
  ZERONE_ASSERT(stride_bytes >= bytes, "all-gather: stride ", stride_bytes, " below the ", bytes, " bytes per rank");
  count_traffic(hosts(), rank_, [&](int) { return bytes; });
  char* slots = static_cast<char*>(out);
  if (stride_bytes == bytes)  // in place when in == out + rank * bytes, NCCL's rule too
    return enqueue([&](cudaStream_t s) { ZERONE_NCCL_CHECK(ncclAllGather(in, out, bytes, ncclUint8, comm_->comm, s)); });
  return enqueue([&](cudaStream_t s) {
    NcclGroup group;
    for (int r = 0; r < world_; ++r) {
      char* slot = slots + static_cast<size_t>(r) * stride_bytes;
      ZERONE_NCCL_CHECK(ncclBroadcast(r == rank_ ? in : slot, slot, bytes, ncclUint8, r, comm_->comm, s));
    }
    group.end();
  });
}

Work NcclCommunicator::broadcast_async(void* data, size_t bytes, int root) {
  if (rank_ == root) count_traffic(hosts(), rank_, [&](int) { return bytes; });
  return enqueue([&](cudaStream_t s) { ZERONE_NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_->comm, s)); });
}

Work NcclCommunicator::barrier_async() {
  device_.synchronize(kernels::Stream::comm);
  return host_.barrier_async();
}

Work NcclCommunicator::all_to_all_async(const void* in, void* out, size_t bytes) {
  count_traffic(hosts(), rank_, [&](int) { return bytes; });
  return enqueue([&](cudaStream_t s) {
    NcclGroup group;
    for (int r = 0; r < world_; ++r) {
      ZERONE_NCCL_CHECK(ncclSend(static_cast<const char*>(in) + static_cast<size_t>(r) * bytes, bytes, ncclUint8, r,
                                 comm_->comm, s));
      ZERONE_NCCL_CHECK(ncclRecv(static_cast<char*>(out) + static_cast<size_t>(r) * bytes, bytes, ncclUint8, r,
                                 comm_->comm, s));
    }
    group.end();
  });
}

std::unique_ptr<Communicator> NcclCommunicator::split_nccl(std::unique_ptr<Communicator> host, int color, int key) {
  ZERONE_CHECK(color >= 0, "NCCL split: color ", color, " is negative");
  ZERONE_NCCL_CUDA_CHECK(cudaSetDevice(device_.native_device()));
  // Pending collectives of the parent first: ncclCommSplit is itself collective over the parent.
  device_.synchronize(kernels::Stream::comm);
  auto child = std::make_unique<Handle>();
  ZERONE_NCCL_CHECK(ncclCommSplit(comm_->comm, color, key, &child->comm, nullptr));
  ZERONE_ASSERT(child->comm != nullptr, "ncclCommSplit gave no communicator for color ", color);
  // Private constructor: make_unique cannot reach it.
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(host), device_, std::move(child)));
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  return split_nccl(host_.split(color, key), color, key);
}

std::unique_ptr<Communicator> NcclCommunicator::split_by_host() {
  // The host communicator orders a host's ranks by rank; the NCCL split keys by rank too.
  return split_nccl(host_.split_by_host(), hosts().of_member[static_cast<size_t>(rank_)], rank_);
}

}  // namespace zerone::comm
