// The MPI communicator (OpenMPI or MPICH): one communication thread runs every collective in
// submission order (Note [Communication thread] in communicator.h). MPI is initialized with
// MPI_THREAD_SERIALIZED: the training thread initializes and finalizes, the communication thread
// makes every call in between. Errors return codes (MPI_ERRORS_RETURN) that become Error naming the
// call, file and line.
// Sub-communicators (split, split_by_host) share the world communicator's thread, so every MPI call
// stays on that one thread.
// Thread-safety: as Communicator.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <memory>
#include <thread>

#include "zerone/comm/communicator.h"

namespace zerone::comm {

// The thread that makes every MPI call (Note [Communication thread] in communicator.h).
class MpiWorker {
 public:
  MpiWorker();
  ~MpiWorker();  // drains the queue, joins
  Work submit(std::function<void()> op);

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator();  // MPI_Init_thread on MPI_COMM_WORLD; throws Error if MPI cannot start
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string description() const override { return library_; }
  Work all_reduce_sum_async(float* data, size_t n) override;
  Work all_reduce_sum_async(double* data, size_t n) override;
  Work reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) override;
  Work all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) override;
  Work broadcast_async(void* data, size_t bytes, int root) override;
  Work barrier_async() override;
  Work all_to_all_async(const void* in, void* out, size_t bytes) override;
  void abort_job(int exit_code) override;
  const Hosts& hosts() const override { return hosts_; }
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> split_by_host() override;

 private:
  // A sub-communicator over `comm` (owned: freed on destruction), on the parent's worker.
  MpiCommunicator(std::shared_ptr<MpiWorker> worker, void* comm, std::string library, int rank, int world, Hosts hosts);
  Work submit(std::function<void()> op) { return worker_->submit(std::move(op)); }
  std::unique_ptr<Communicator> split_with(const std::function<void(void* new_comm)>& make);
  // Note [Counting traffic] (traffic.h): `to_peer(p)` bytes go to each member p != rank.
  template <typename F> void count(F to_peer) const;

  int rank_ = 0, world_ = 1;
  std::string library_;
  bool owns_mpi_ = false;  // the world communicator initializes and finalizes MPI
  void* comm_ = nullptr;   // the MPI_Comm (a handle type that differs between libraries), heap-held
  std::shared_ptr<MpiWorker> worker_;
  Hosts hosts_;  // Note [Hosts of ranks]
};

}  // namespace zerone::comm
