// NcclCommunicator: the collectives of Communicator over GPU memory with NCCL, one rank per GPU
// (Note [Choosing NCCL] in comm_choice.h says when the trainer uses it). Built only where CMake
// found NCCL (ZERONE_HAVE_NCCL); made through comm_choice.h's make_nccl_communicator.
//
// Note [NCCL collectives]:
//  - Bootstrap: rank 0 of the host communicator (MPI) makes the ncclUniqueId and broadcasts it;
//    every rank then joins with ncclCommInitRank on the backend's GPU.
//  - Every buffer is memory of the backend's device (no host memory: DeviceCommunicator keeps host
//    operands on the host communicator). Each collective is enqueued on the backend's comm stream
//    after the compute work submitted so far (an event), and returns a Work over the event
//    recorded after it: wait() makes the host wait, wait_on(compute) only orders the stream. The
//    calling thread never blocks on the network.
//  - Layout as Communicator's: reduce-scatter's in-place result lands at rank * shard_n (NCCL's
//    in-place rule, in_place_shard_offset); the strided all-gather (the engine's slices of shards,
//    which NCCL has no call for) is one broadcast per rank in one NCCL group; all-to-all is
//    grouped send/receive pairs. Reductions are sums in f32 (or f64); gathers move bytes.
//  - Determinism: NCCL's sums for the same world size, the same GPUs and topology, the same NCCL
//    version and the same environment (NCCL_ALGO, NCCL_PROTO, channels) are reproducible run to
//    run (its algorithm and reduction order depend only on those); they may differ in the last
//    bits from MPI's order, and between world sizes, as MPI's do.
//  - Not covered: --comm-timeout (a peer that dies leaves the stream waiting; the job's other
//    ranks end through abort_job's MPI_Abort) and the collective-watch messages of the MPI
//    communicator. Every NCCL call is checked: a failure throws Error naming the call and NCCL's
//    message (ncclGetLastError), as a failed collective of MPI does.
// Run on an H200 at world 1 (2026-11-27; docs/GPU.md): two GPUs have not been tried.
// Thread-safety: as Communicator (submit from the training thread).
#pragma once

#include <memory>
#include <string>

#include "zerone/comm/communicator.h"
#include "zerone/kernels/backend.h"

namespace zerone::comm {

// "2.28.9": the version of the NCCL library loaded (ncclGetVersion).
std::string nccl_library_version();

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `host` (every rank calls it). `host` and `device` (a backend with a native
  // stream: cuda) must outlive this object. Throws Error when NCCL cannot start.
  NcclCommunicator(Communicator& host, kernels::Backend& device);
  ~NcclCommunicator() override;  // waits for this communicator's collectives, then frees NCCL's state
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string description() const override;
  size_t in_place_shard_offset(size_t shard_n) const override { return static_cast<size_t>(rank_) * shard_n; }
  const Hosts& hosts() const override { return host_.hosts(); }
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> split_by_host() override;

  Work all_reduce_sum_async(float* data, size_t n) override;
  Work all_reduce_sum_async(double* data, size_t n) override;
  Work reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) override;
  Work all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) override;
  Work broadcast_async(void* data, size_t bytes, int root) override;
  // The host communicator's barrier, after this communicator's collectives submitted so far.
  Work barrier_async() override;
  Work all_to_all_async(const void* in, void* out, size_t bytes) override;
  void abort_job(int exit_code) override { host_.abort_job(exit_code); }

 private:
  struct Handle;  // the ncclComm_t (nccl.h stays out of this header)
  // A sub-communicator: `comm` split from a parent, over `host` (owned).
  NcclCommunicator(std::unique_ptr<Communicator> host, kernels::Backend& device, std::unique_ptr<Handle> comm);
  // Runs `enqueue` (which makes NCCL calls on the given cudaStream_t) on the comm stream after the
  // compute work so far; the Work completes with it.
  template <typename F> Work enqueue(F&& enqueue);
  std::unique_ptr<Communicator> split_nccl(std::unique_ptr<Communicator> host, int color, int key);

  std::unique_ptr<Communicator> owned_host_;
  Communicator& host_;
  kernels::Backend& device_;
  std::unique_ptr<Handle> comm_;
  int rank_ = 0, world_ = 1;
};

}  // namespace zerone::comm
