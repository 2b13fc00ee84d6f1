#include "zerone/zero/places.h"

#include <vector>

namespace zerone::zero {

kernels::Backend& backend_of(kernels::Backend& device, const void* p) {
  return device.place_of(p) == MemPlace::device ? device : kernels::host_backend();
}

void accumulate_into(kernels::Backend& device, float* acc, const float* in, size_t n) {
  kernels::Backend& backend = backend_of(device, acc);
  if (device.place_of(in) == device.place_of(acc)) return backend.accumulate(acc, in, n);
  // Note [Operands in another place] (optim/optimizer.h): the addend comes over first.
  Buffer local(n * sizeof(float), MemCategory::scratch, device.place_of(acc));
  device.copy_any(local.data(), in, local.bytes());
  backend.accumulate(acc, local.as<float>(), n);
}

PendingSum sum_squares_and_copy(kernels::Backend& device, const float* grad, size_t n, float* copy_to) {
  if (device.place_of(grad) == device.place_of(copy_to)) return backend_of(device, grad).sum_squares(grad, n, copy_to);
  PendingSum sumsq = backend_of(device, grad).sum_squares(grad, n);
  device.copy_any(copy_to, grad, n * sizeof(float));
  return sumsq;
}

void with_host_view(kernels::Backend& device, const void* data, MemPlace place, size_t bytes,
                    const std::function<void(const void* host)>& fn) {
  if (place != MemPlace::device || device.host_addressable()) return fn(data);
  std::vector<char> host(bytes);
  device.copy_to_host(host.data(), data, bytes);
  fn(host.data());
}

void release_to_pool(BufferPool& pool, Buffer&& buffer, kernels::Backend& device) {
  if (buffer.empty()) return;
  pool.release(std::move(buffer), {device.record(kernels::Stream::compute), device.record(kernels::Stream::comm)});
}

}  // namespace zerone::zero
