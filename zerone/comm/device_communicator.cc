#include "zerone/comm/device_communicator.h"

#include "zerone/core/error.h"
#include "zerone/core/memory.h"

namespace zerone::comm {

namespace {
// A host staging buffer shared by the submitting call and the Work's completion step.
std::shared_ptr<Buffer> staging(size_t bytes) {
  return std::make_shared<Buffer>(bytes, MemCategory::comm, MemPlace::host);
}
// A finished collective.
Work done() { return Work(); }
}  // namespace

DeviceCommunicator::DeviceCommunicator(Communicator& host, kernels::Backend& device) : host_(host), device_(device) {}

DeviceCommunicator::DeviceCommunicator(std::unique_ptr<Communicator> host, kernels::Backend& device)
    : owned_(std::move(host)), host_(*owned_), device_(device) {}

std::string DeviceCommunicator::description() const {
  return staged() ? str_cat(host_.description(), ", staged through host memory") : host_.description();
}

std::unique_ptr<Communicator> DeviceCommunicator::split(int color, int key) {
  return std::make_unique<DeviceCommunicator>(host_.split(color, key), device_);
}

std::unique_ptr<Communicator> DeviceCommunicator::split_by_host() {
  return std::make_unique<DeviceCommunicator>(host_.split_by_host(), device_);
}

template <typename T> Work DeviceCommunicator::all_reduce_staged(T* data, size_t n) {
  if (!staged()) return device_.host_addressable() ? host_.all_reduce_sum_async(data, n) : done();
  auto host = staging(n * sizeof(T));
  device_.copy_any(host->data(), data, n * sizeof(T));
  Work work = host_.all_reduce_sum_async(host->as<T>(), n);
  return Work::then(std::move(work), [this, host, data, n] { device_.copy_any(data, host->data(), n * sizeof(T)); });
}

Work DeviceCommunicator::all_reduce_sum_async(float* data, size_t n) { return all_reduce_staged(data, n); }
Work DeviceCommunicator::all_reduce_sum_async(double* data, size_t n) { return all_reduce_staged(data, n); }

Work DeviceCommunicator::reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) {
  if (!staged() && device_.host_addressable()) return host_.reduce_scatter_sum_async(in, out, shard_n);
  if (!staged()) {  // alone: this rank's shard is the whole input
    if (in != out) device_.copy_any(out, in, shard_n * sizeof(float));
    return done();
  }
  const size_t world = static_cast<size_t>(world_size()), bytes = shard_n * sizeof(float);
  auto host = staging(world * bytes);
  device_.copy_any(host->data(), in, world * bytes);
  Work work = host_.reduce_scatter_sum_async(host->as<float>(), host->as<float>(), shard_n);
  // In place the shard stays where the host communicator leaves it; otherwise it goes to `out`.
  const size_t offset = in == out ? host_.in_place_shard_offset(shard_n) : 0;
  const size_t from = host_.in_place_shard_offset(shard_n);
  return Work::then(std::move(work), [this, host, out, offset, from, shard_n, bytes] {
    device_.copy_any(out + offset, host->as<float>() + from, bytes);
  });
}

Work DeviceCommunicator::all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) {
  if (!staged() && device_.host_addressable()) return host_.all_gather_strided_async(in, out, bytes, stride_bytes);
  if (!staged()) {  // alone: slot 0 is this rank's
    if (in != out) device_.copy_any(out, in, bytes);
    return done();
  }
  const int world = world_size(), rank = this->rank();
  auto host = staging(static_cast<size_t>(world - 1) * stride_bytes + bytes);
  char* slots = host->as<char>();
  device_.copy_any(slots + static_cast<size_t>(rank) * stride_bytes, in, bytes);
  Work work = host_.all_gather_strided_async(slots + static_cast<size_t>(rank) * stride_bytes, slots, bytes, stride_bytes);
  return Work::then(std::move(work), [this, host, out, bytes, stride_bytes, world] {
    // Only the slots: the bytes between them belong to the caller.
    for (int r = 0; r < world; ++r)
      device_.copy_any(static_cast<char*>(out) + static_cast<size_t>(r) * stride_bytes,
                             host->as<char>() + static_cast<size_t>(r) * stride_bytes, bytes);
  });
}

Work DeviceCommunicator::all_to_all_async(const void* in, void* out, size_t bytes) {
  if (!staged() && device_.host_addressable()) return host_.all_to_all_async(in, out, bytes);
  if (!staged()) {  // alone: its own block
    device_.copy_any(out, in, bytes);
    return done();
  }
  const size_t total = static_cast<size_t>(world_size()) * bytes;
  auto send = staging(total), recv = staging(total);
  device_.copy_any(send->data(), in, total);
  Work work = host_.all_to_all_async(send->data(), recv->data(), total / static_cast<size_t>(world_size()));
  return Work::then(std::move(work), [this, send, recv, out, total] { device_.copy_any(out, recv->data(), total); });
}

Work DeviceCommunicator::broadcast_async(void* data, size_t bytes, int root) {
  if (!staged()) return device_.host_addressable() ? host_.broadcast_async(data, bytes, root) : done();
  auto host = staging(bytes);
  device_.copy_any(host->data(), data, bytes);
  Work work = host_.broadcast_async(host->data(), bytes, root);
  return Work::then(std::move(work), [this, host, data, bytes] { device_.copy_any(data, host->data(), bytes); });
}

}  // namespace zerone::comm
