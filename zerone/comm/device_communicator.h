// DeviceCommunicator: the collectives of a host Communicator over buffers in device memory (Note
// [Collective endpoints] in communicator.h).
//
// Where the device's memory is host memory (the cpu backend) every call goes straight to the host
// communicator. A rank alone needs no staging either: its collectives are copies on the device, or
// nothing. Otherwise each collective is staged: the training thread copies the device operand
// into a host staging buffer with the backend (category comm, place host), the host communicator
// runs on the staging buffer, and the Work's completion step copies the result back to the device
// when it is first waited on. Staging buffers live until then. Either operand may also be host
// memory (an offloaded shard): the copies take each side's place from the backend (Note [Places of
// pointers] in kernels/backend.h). A lone rank's reduce-scatter, all-gather and all-to-all are a
// copy, asynchronous where it crosses places (the Work is its end: do not read `out`, nor write or
// free `in`, before waiting for it). Reduce-scatter's result lands in
// `out` as given; in place (out == in) it lands at in_place_shard_offset(shard_n), the convention
// of the library underneath (the native one where there is one), so callers need no case for it.
//
// With a native communicator (NCCL, comm_choice.h: Note [Choosing NCCL]) every collective whose
// operands are all device memory goes to it directly, at any world size; those with a host operand
// (an offloaded shard, a host scalar) are staged through the host communicator as above.
//
// Thread-safety: as Communicator (submit from the training thread).
#pragma once

#include <initializer_list>
#include <memory>

#include "zerone/comm/communicator.h"
#include "zerone/kernels/backend.h"

namespace zerone::comm {

class DeviceCommunicator final : public Communicator {
 public:
  // `host`, `device` and `native` (null: none) must outlive this object; `native` spans the same
  // ranks as `host`, in the same order.
  DeviceCommunicator(Communicator& host, kernels::Backend& device, Communicator* native = nullptr);
  // Owns `host` and `native` (sub-communicators; `native` may be null).
  DeviceCommunicator(std::unique_ptr<Communicator> host, kernels::Backend& device,
                     std::unique_ptr<Communicator> native = nullptr);

  int rank() const override { return host_.rank(); }
  int world_size() const override { return host_.world_size(); }
  std::string description() const override;
  size_t in_place_shard_offset(size_t shard_n) const override {
    return native_ ? native_->in_place_shard_offset(shard_n) : host_.in_place_shard_offset(shard_n);
  }
  const Hosts& hosts() const override { return host_.hosts(); }
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> split_by_host() override;
  // True when collectives over device buffers go through host staging buffers: the device's memory
  // is not host memory, there is no native communicator and there are peers (alone, a collective
  // is at most a copy on the device).
  bool staged() const { return !device_.host_addressable() && native_ == nullptr && host_.world_size() > 1; }
  bool native() const { return native_ != nullptr; }

  Work all_reduce_sum_async(float* data, size_t n) override;
  Work all_reduce_sum_async(double* data, size_t n) override;
  Work reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) override;
  Work all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) override;
  Work broadcast_async(void* data, size_t bytes, int root) override;
  Work barrier_async() override { return host_.barrier_async(); }
  Work all_to_all_async(const void* in, void* out, size_t bytes) override;
  void abort_job(int exit_code) override { host_.abort_job(exit_code); }

 private:
  template <typename T> Work all_reduce_staged(T* data, size_t n);
  // True when the native communicator takes this collective: there is one and every operand is
  // device memory.
  bool on_native(std::initializer_list<const void*> operands) const;
  // A lone rank's collective: out = in (bytes). Across places asynchronously, the Work being the
  // copy's end (Note [Asynchronous copies] in kernels/backend.h); within one place at once.
  Work copy_alone(void* out, const void* in, size_t bytes);
  // True when a collective over non-native operands must go through host staging buffers.
  bool must_stage() const { return !device_.host_addressable() && host_.world_size() > 1; }
  std::unique_ptr<Communicator> owned_, owned_native_;
  Communicator& host_;
  kernels::Backend& device_;
  Communicator* native_ = nullptr;
};

}  // namespace zerone::comm
