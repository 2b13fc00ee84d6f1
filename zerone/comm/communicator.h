// Communicator: the collectives ZeRO needs, over the data-parallel ranks.
//
// Data layout follows NCCL/MPI: reduce_scatter's input holds world_size equal shards back to back
// and rank r receives the reduction of shard r; all_gather's output holds every rank's shard in rank
// order. Reductions are sums over f32 (gradients are f32 in zerone; bf16 tensors are reduced in f32,
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
#include <string>
#include <vector>

namespace zerone::comm {

// A pending collective. wait() blocks until it finished and rethrows its error, if any.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait();
  bool valid() const { return done_.valid(); }
  // True when wait() would not block (an empty Work is ready).
  bool ready() const;

 private:
  std::shared_future<void> done_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "single process", "Open MPI v4.1.4", ...
  virtual std::string description() const = 0;

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
};

// The world-1 communicator: collectives are copies (or nothing).
class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string description() const override { return "single process"; }
  Work all_reduce_sum_async(float* data, size_t n) override;
  Work all_reduce_sum_async(double* data, size_t n) override;
  Work reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) override;
  Work all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) override;
  Work broadcast_async(void* data, size_t bytes, int root) override;
  Work barrier_async() override;
};

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
