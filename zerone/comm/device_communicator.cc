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

DeviceCommunicator::DeviceCommunicator(Communicator& host, kernels::Backend& device, Communicator* native)
    : host_(host), device_(device), native_(native) {}

DeviceCommunicator::DeviceCommunicator(std::unique_ptr<Communicator> host, kernels::Backend& device,
                                       std::unique_ptr<Communicator> native)
    : owned_(std::move(host)), owned_native_(std::move(native)), host_(*owned_), device_(device),
      native_(owned_native_.get()) {}

std::string DeviceCommunicator::description() const {
  if (native_) return native_->description();
  return staged() ? str_cat(host_.description(), ", staged through host memory") : host_.description();
}

// Split both, in the same order on every rank (each split is collective over its library).
std::unique_ptr<Communicator> DeviceCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> host = host_.split(color, key);
  return std::make_unique<DeviceCommunicator>(std::move(host), device_, native_ ? native_->split(color, key) : nullptr);
}

std::unique_ptr<Communicator> DeviceCommunicator::split_by_host() {
  std::unique_ptr<Communicator> host = host_.split_by_host();
  return std::make_unique<DeviceCommunicator>(std::move(host), device_, native_ ? native_->split_by_host() : nullptr);
}

Work DeviceCommunicator::copy_alone(void* out, const void* in, size_t bytes) {
  if (in == out) return done();
  const MemPlace out_place = device_.place_of(out), in_place = device_.place_of(in);
  if (out_place == in_place) {  // on the device: ordered on compute like the kernels around it
    device_.copy(out, out_place, in, in_place, bytes);
    return done();
  }
  // Note [Asynchronous copies] (kernels/backend.h): an offloaded operand (a gradient accumulator
  // in host memory, a parameter shard gathered from it) moves on the copy stream, overlapping the
  // compute after it; the Work is its end, which the engine waits for before it reads the result
  // or touches either side.
  return Work(device_.copy_async(out, out_place, in, in_place, bytes));
}

bool DeviceCommunicator::on_native(std::initializer_list<const void*> operands) const {
  if (native_ == nullptr) return false;
  for (const void* p : operands)
    if (device_.place_of(p) != MemPlace::device) return false;
  return true;
}

template <typename T> Work DeviceCommunicator::all_reduce_staged(T* data, size_t n) {
  if (on_native({data})) return native_->all_reduce_sum_async(data, n);
  if (!must_stage()) return device_.host_addressable() ? host_.all_reduce_sum_async(data, n) : done();
  auto host = staging(n * sizeof(T));
  device_.copy_any(host->data(), data, n * sizeof(T));
  Work work = host_.all_reduce_sum_async(host->as<T>(), n);
  return Work::then(std::move(work), [this, host, data, n] { device_.copy_any(data, host->data(), n * sizeof(T)); });
}

Work DeviceCommunicator::all_reduce_sum_async(float* data, size_t n) { return all_reduce_staged(data, n); }
Work DeviceCommunicator::all_reduce_sum_async(double* data, size_t n) { return all_reduce_staged(data, n); }

Work DeviceCommunicator::reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) {
  if (on_native({in, out})) return native_->reduce_scatter_sum_async(in, out, shard_n);
  if (!must_stage() && device_.host_addressable()) return host_.reduce_scatter_sum_async(in, out, shard_n);
  if (!must_stage()) return copy_alone(out, in, shard_n * sizeof(float));  // alone: the shard is the whole input
  const size_t world = static_cast<size_t>(world_size()), bytes = shard_n * sizeof(float);
  auto host = staging(world * bytes);
  device_.copy_any(host->data(), in, world * bytes);
  Work work = host_.reduce_scatter_sum_async(host->as<float>(), host->as<float>(), shard_n);
  // In place the shard goes where this communicator's convention says; otherwise to `out`.
  const size_t offset = in == out ? in_place_shard_offset(shard_n) : 0;
  const size_t from = host_.in_place_shard_offset(shard_n);
  return Work::then(std::move(work), [this, host, out, offset, from, shard_n, bytes] {
    device_.copy_any(out + offset, host->as<float>() + from, bytes);
  });
}

Work DeviceCommunicator::all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) {
  if (on_native({in, out})) return native_->all_gather_strided_async(in, out, bytes, stride_bytes);
  if (!must_stage() && device_.host_addressable()) return host_.all_gather_strided_async(in, out, bytes, stride_bytes);
  if (!must_stage()) return copy_alone(out, in, bytes);  // alone: slot 0 is this rank's
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
  if (on_native({in, out})) return native_->all_to_all_async(in, out, bytes);
  if (!must_stage() && device_.host_addressable()) return host_.all_to_all_async(in, out, bytes);
  if (!must_stage()) return copy_alone(out, in, bytes);  // alone: its own block
  const size_t total = static_cast<size_t>(world_size()) * bytes;
  auto send = staging(total), recv = staging(total);
  device_.copy_any(send->data(), in, total);
  Work work = host_.all_to_all_async(send->data(), recv->data(), total / static_cast<size_t>(world_size()));
  return Work::then(std::move(work), [this, send, recv, out, total] { device_.copy_any(out, recv->data(), total); });
}

Work DeviceCommunicator::broadcast_async(void* data, size_t bytes, int root) {
  if (on_native({data})) return native_->broadcast_async(data, bytes, root);
  if (!must_stage()) return device_.host_addressable() ? host_.broadcast_async(data, bytes, root) : done();
  auto host = staging(bytes);
  device_.copy_any(host->data(), data, bytes);
  Work work = host_.broadcast_async(host->data(), bytes, root);
  return Work::then(std::move(work), [this, host, data, bytes] { device_.copy_any(data, host->data(), bytes); });
}

}  // namespace zerone::comm
