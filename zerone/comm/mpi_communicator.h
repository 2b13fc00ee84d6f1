// The MPI communicator (OpenMPI or MPICH): one communication thread runs every collective in
// submission order (Note [Communication thread] in communicator.h). MPI is initialized with
// MPI_THREAD_SERIALIZED: the training thread initializes and finalizes, the communication thread
// makes every call in between. Errors return codes (MPI_ERRORS_RETURN) that become Error naming the
// call, file and line.
// Sub-communicators (split, split_by_host) share the world communicator's thread, so every MPI call
// stays on that one thread.
// Thread-safety: as Communicator.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <memory>
#include <thread>

#include "zerone/comm/communicator.h"

namespace zerone::comm {

// The thread that makes every MPI call (Note [Communication thread] in communicator.h).
// Note [Collective timeout] (communicator.h): collectives are started non-blocking and the worker
// polls them; on the world communicator each rank first tells rank 0 which collective it enters
// (its sequence number, name and phase, one small message), so that rank 0 knows, when one times
// out, which ranks never arrived and where each of them was last.
struct CollectiveWatch;

class MpiWorker {
 public:
  MpiWorker();
  ~MpiWorker();  // drains the queue, joins
  // Queues `op` (run on the worker thread, in submission order); its exception lands in the Work.
  // Once one operation has failed, every later one fails at once with that same exception, without
  // running.
  Work submit(std::function<void()> op);

  // Set up the rank-0 channel over a duplicate of the world communicator (on the calling thread,
  // before any collective is submitted).
  void watch_world(void* world_comm, int rank, int world);
  void set_timeout(double seconds) { timeout_s_.store(seconds); }
  void set_phase(const std::string& phase) {
    std::lock_guard<std::mutex> lock(mutex_);
    phase_ = phase;
  }
  std::string phase() {
    std::lock_guard<std::mutex> lock(mutex_);
    return phase_;
  }
  // On the worker thread: waits for `request` (an MPI_Request*) of collective `name` submitted
  // during `phase`, polling; `world` says whether it runs on the world communicator (tracked).
  // Throws Error on an MPI failure or the timeout.
  void wait(void* request, const char* name, const std::string& phase, bool world, int comm_size);
  // On the worker thread, before starting a world collective: records and announces it.
  void entering(const char* name, const std::string& phase);

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::string phase_ = "start-up";
  std::atomic<double> timeout_s_{600.0};
  std::unique_ptr<CollectiveWatch> watch_;  // worker thread only, after watch_world
  // The first failure of an operation on this thread (Note [A failed worker fails fast] in the
  // .cc); worker thread only.
  std::exception_ptr failure_;
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
  void set_timeout(double seconds) override { worker_->set_timeout(seconds); }
  void set_phase(const std::string& phase) override { worker_->set_phase(phase); }

 private:
  // A sub-communicator over `comm` (owned: freed on destruction), on the parent's worker.
  MpiCommunicator(std::shared_ptr<MpiWorker> worker, void* comm, std::string library, int rank, int world, Hosts hosts);
  Work submit(std::function<void()> op) { return worker_->submit(std::move(op)); }
  // A collective started by `start` (it fills the MPI_Request* it is given and returns an MPI
  // error code), announced and polled under Note [Collective timeout].
  Work collective(const char* name, std::function<int(void* request)> start);
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
