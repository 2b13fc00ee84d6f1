// Event: a point in the work of one stream of a device (Note [Streams and events],
// kernels/backend.h), which the host can ask about or wait for. Backends make them
// (kernels::Backend::record); core holds the type so that memory below the backends (BufferPool,
// core/memory.h) can keep a buffer's last uses without knowing any backend.
//
// Thread-safety: an Event is an immutable handle; ready() and wait() may be called from any thread
// as far as the Impl allows (the inline backends' events are always complete).
#pragma once

#include <memory>
#include <utility>

namespace zerone {

// A default Event is complete. A backend whose work is asynchronous supplies an Impl.
class Event {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual bool ready() const = 0;
    virtual void wait() const = 0;
  };
  Event() = default;
  explicit Event(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  // True once the work before the event finished.
  bool ready() const { return !impl_ || impl_->ready(); }
  // The host waits until the work before the event finished.
  void wait() const {
    if (impl_) impl_->wait();
  }
  // The backend's own handle (null for a complete default Event): the backend that made the event
  // reads it back (the CUDA backend's cudaEvent_t, to make a stream wait on it).
  const Impl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace zerone
