// Communicator: the collectives ZeRO needs, over the data-parallel ranks.
//
// Data layout follows NCCL/MPI: reduce_scatter's input holds world_size equal shards back to back
// and rank r receives the reduction of shard r; all_gather's output holds every rank's shard in rank
// order. Where an in-place reduce-scatter leaves rank r's shard differs between libraries (MPI: at
// the start of the buffer; NCCL: at r * shard_n, its own slot): in_place_shard_offset() says.
//
// Note [Collective endpoints]: a communicator's buffers are memory of one kind. Those made by
// make_communicator take host memory (MPI reads and writes them on the communication thread).
// Device memory reaches a collective only through a communicator made for it: DeviceCommunicator
// (device_communicator.h) hands device buffers on directly where the device's memory is host
// memory (the cpu backend), and otherwise stages them through host buffers with the backend's
// copies, so no host code ever reads device memory implicitly. Reductions are sums over f32 (gradients are f32 in zerone; bf16 tensors are reduced in f32,
// so MPI needs no bf16 type). Gathers and broadcasts move raw bytes of any dtype.
//
// Asynchrony (Note [Communication thread]): every collective runs, in submission order, on the
// communicator's own thread, so the calling thread keeps computing while data moves; *_async returns
// a Work to wait on. OpenMPI does not progress non-blocking collectives in the background, so a
// thread that sits in the blocking call is what makes communication overlap computation.
//
// Thread-safety: submit from one thread (the training thread). Buffers handed to an async call
// must stay valid and untouched until its Work is waited on. Failures (an MPI error, a peer that
// died) throw Error from wait() or from the synchronous call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zerone/kernels/backend.h"

namespace zerone::comm {

// Note [Hosts of ranks]: every communicator knows the host each of its members runs on (the
// hostname each process sees, exchanged once when the world communicator starts; a test host is
// a UTS namespace with a hostname of its own, scripts/test_hosts.sh). Sub-communicators map their
// members through the world's. ZeRO++ builds its host groups from it (zero/zeropp.h), the
// traffic counters (comm/traffic.h) split bytes sent into within a host and across hosts by it,
// and describe_topology() prints it at start-up.
struct Hosts {
  std::vector<std::string> names;  // distinct hostnames, in order of their lowest member rank
  std::vector<int> of_member;      // per member rank: index into names
  int count() const { return static_cast<int>(names.size()); }
};

// A pending collective, event-like (Note [Streams and events] in kernels/backend.h): ready() tells
// whether it finished, wait() makes the host wait for it (rethrowing its error, if any),
// wait_on(stream) orders a device stream's later work after it. An empty Work is complete.
// A Work may carry a completion step (a staged collective's copy back to the device), run once by
// the first wait on the waiting thread. Copies of a Work share that state. A collective enqueued
// on a device stream (NCCL) is a Work over the Event recorded after it: wait_on then orders the
// stream after that event without the host waiting.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_future<void> done, std::function<void()> on_complete = nullptr);
  // Complete when `done_on_device` is (a collective enqueued on a device stream).
  explicit Work(kernels::Event done_on_device);
  // A Work that completes when `before` does and then runs `on_complete` (once, on the waiter).
  static Work then(Work before, std::function<void()> on_complete);
  void wait();
  bool valid() const { return state_ != nullptr; }
  // True when the collective itself finished (wait() then blocks at most for its completion step).
  bool ready() const;
  // Work submitted to `stream` of `backend` after this call runs after the collective. Collectives
  // run by a host thread (MPI) make the host wait; a stream-native library records an event instead.
  void wait_on(kernels::Backend& backend, kernels::Stream stream);

 private:
  struct State {
    std::shared_future<void> done;  // or, when `before` is set, its completion, or when `on_device`, `event`
    bool on_device = false;
    kernels::Event event;
    std::shared_ptr<State> before;
    std::function<void()> on_complete;
    std::once_flag completed;
  };
  std::shared_ptr<State> state_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "single process", "Open MPI v4.1.4", ...
  virtual std::string description() const = 0;
  // Where an in-place reduce_scatter leaves this rank's shard, in elements from the buffer's start
  // (0 for MPI and the single process; rank * shard_n for NCCL).
  virtual size_t in_place_shard_offset(size_t shard_n) const { return 0; }
  // The host of each member (Note [Hosts of ranks]).
  virtual const Hosts& hosts() const = 0;

  // Sub-communicators (hierarchical ZeRO, NCCL bootstrap). split(color, key): the ranks that pass
  // the same color form one communicator, ordered by key (ties by rank). split_by_host(): the
  // ranks of this machine. Collective over this communicator: every rank calls it. The result uses
  // the same communication thread and must not outlive this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  virtual std::unique_ptr<Communicator> split_by_host() = 0;

  // data (n) = sum over ranks of data.
  virtual Work all_reduce_sum_async(float* data, size_t n) = 0;
  virtual Work all_reduce_sum_async(double* data, size_t n) = 0;
  // out (shard_n) = sum over ranks of in[rank*shard_n, (rank+1)*shard_n); in holds world*shard_n.
  // In place when out == in: the reduced shard lands at the start of the buffer.
  virtual Work reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) = 0;
  // out + r*stride_bytes receives rank r's `in` (bytes), for every rank r. With stride_bytes equal
  // to bytes this is the plain all-gather of shards; with stride_bytes the shard size and `in`,
  // `out` offset into the shard, it gathers one slice of every rank's shard (the engine gathers a
  // unit in allgather_bucket_size slices). In place when in == out + rank*stride_bytes (this
  // rank's part already sits in its slot).
  virtual Work all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) = 0;
  // out (world*shard_bytes) = every rank's `in` (shard_bytes) in rank order.
  Work all_gather_async(const void* in, void* out, size_t shard_bytes) {
    return all_gather_strided_async(in, out, shard_bytes, shard_bytes);
  }
  virtual Work broadcast_async(void* data, size_t bytes, int root) = 0;
  virtual Work barrier_async() = 0;
  // out + r*bytes receives member r's block for this rank: block `rank` of r's `in`; `in` holds
  // world blocks of `bytes`, block r for member r (MPI_Alltoall over bytes). Not in place.
  virtual Work all_to_all_async(const void* in, void* out, size_t bytes) = 0;

  void all_reduce_sum(float* data, size_t n) { all_reduce_sum_async(data, n).wait(); }
  void reduce_scatter_sum(const float* in, float* out, size_t shard_n) { reduce_scatter_sum_async(in, out, shard_n).wait(); }
  void all_gather(const void* in, void* out, size_t shard_bytes) { all_gather_async(in, out, shard_bytes).wait(); }
  void broadcast(void* data, size_t bytes, int root) { broadcast_async(data, bytes, root).wait(); }
  void barrier() { barrier_async().wait(); }
  double all_reduce_sum(double value) {
    all_reduce_sum_async(&value, 1).wait();
    return value;
  }

  // Ends every rank of the job after an unrecoverable error on this one (MPI_Abort), so that no
  // peer waits forever in a collective. A no-op at world size 1.
  virtual void abort_job(int exit_code) {}

  // Note [Collective timeout]: a collective that has not completed after `seconds` fails its Work
  // with an Error naming the ranks that do not answer a ping, those that did not arrive and those
  // that arrived but no longer answer (a cut link takes down ranks in both groups), and the
  // collective and phase each was last in (rank 0 collects who entered which collective; the
  // others wait a little longer, so that rank 0's message is the one the job ends with). A rank
  // that did not arrive but answers waits in an earlier collective and is mentioned, not named.
  // Every collective queued behind a failed one fails at once with its message, so the error
  // surfaces `seconds` after the stall, however many collectives were in flight. The phase is a
  // label for messages ("step 17"), captured when a collective is submitted. No-ops at world size
  // 1. Call from the submitting thread.
  virtual void set_timeout(double seconds) {}
  virtual void set_phase(const std::string& phase) {}
};

// The world-1 communicator: collectives are copies (or nothing).
class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string description() const override { return "single process"; }
  const Hosts& hosts() const override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> split_by_host() override;
  Work all_reduce_sum_async(float* data, size_t n) override;
  Work all_reduce_sum_async(double* data, size_t n) override;
  Work reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) override;
  Work all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) override;
  Work broadcast_async(void* data, size_t bytes, int root) override;
  Work barrier_async() override;
  Work all_to_all_async(const void* in, void* out, size_t bytes) override;

 private:
  mutable Hosts hosts_;
};

// This process's hostname (gethostname).
std::string this_hostname();

// "2 hosts x 2 ranks (host1: ranks 0-1, host2: ranks 2-3)", or "1 host, 4 ranks (vm: ranks 0-3)",
// or with uneven hosts "3 hosts, 1-2 ranks each (...)": the world's hosts and their ranks.
std::string describe_topology(const Hosts& hosts);

// True when every host has the same number of ranks and each host's ranks are consecutive
// (rank = host * ranks_per_host + local rank), the layout a launcher's by-slot mapping gives and the
// hierarchical collectives assume.
bool uniform_hosts(const Hosts& hosts);

// True when this process was started by an MPI launcher (mpiexec/mpirun/srun): OpenMPI, MPICH and
// PMIx each leave an environment variable behind.
bool launched_by_mpi();

// The MPI library this build is linked with, one line: "Open MPI v4.1.4", "MPICH Version: 4.0.2".
// Callable whether or not MPI is initialized.
std::string mpi_library_version();

// The communicator for this process: MPI when launched by mpiexec, else single-process. The MPI
// one initializes MPI (MPI_THREAD_SERIALIZED) and finalizes it when destroyed.
std::unique_ptr<Communicator> make_communicator();

}  // namespace zerone::comm
