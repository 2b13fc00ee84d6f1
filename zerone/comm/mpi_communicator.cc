#include "zerone/comm/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <vector>

#include "zerone/core/error.h"

#define ZERONE_MPI_CHECK(expr)                                                                         \
  do {                                                                                                 \
    int zerone_mpi_rc = (expr);                                                                        \
    if (zerone_mpi_rc != MPI_SUCCESS) {                                                                \
      char zerone_mpi_msg[MPI_MAX_ERROR_STRING];                                                       \
      int zerone_mpi_len = 0;                                                                          \
      MPI_Error_string(zerone_mpi_rc, zerone_mpi_msg, &zerone_mpi_len);                                \
      throw ::zerone::Error(::zerone::str_cat("MPI call ", #expr, " failed at ", __FILE__, ":", __LINE__, \
                                              ": ", std::string(zerone_mpi_msg, zerone_mpi_len)));     \
    }                                                                                                  \
  } while (0)

namespace zerone::comm {
namespace {

int checked_count(size_t n, const char* what) {
  ZERONE_CHECK(n <= static_cast<size_t>(INT_MAX), what, ": ", n,
               " elements in one collective exceed MPI's int count; use a smaller bucket or more ranks");
  return static_cast<int>(n);
}

}  // namespace

std::string mpi_library_version() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  // The first line, up to a comma: "Open MPI v4.1.4", "MPICH Version:\t4.0.2" (tabs as spaces).
  std::string first(version, static_cast<size_t>(len));
  first = first.substr(0, first.find_first_of("\n,"));
  std::string out;
  for (char c : first) {
    if (c == '\t') c = ' ';
    if (c != ' ' || (!out.empty() && out.back() != ' ')) out += c;
  }
  return out;
}

MpiCommunicator::MpiCommunicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  ZERONE_ASSERT(!initialized, "MPI initialized twice");
  int provided = 0;
  ZERONE_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
  ZERONE_CHECK(provided >= MPI_THREAD_SERIALIZED, "this MPI library provides thread level ", provided,
               ", zerone needs MPI_THREAD_SERIALIZED (its collectives run on a communication thread)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  library_ = mpi_library_version();
  thread_ = std::thread([this] { loop(); });
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  MPI_Finalize();
}

void MpiCommunicator::loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // exceptions land in the task's future
  }
}

Work MpiCommunicator::submit(std::function<void()> op) {
  std::packaged_task<void()> task(std::move(op));
  Work work(task.get_future().share());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return work;
}

Work MpiCommunicator::all_reduce_sum_async(float* data, size_t n) {
  int count = checked_count(n, "all-reduce");
  return submit([=] { ZERONE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)); });
}

Work MpiCommunicator::all_reduce_sum_async(double* data, size_t n) {
  int count = checked_count(n, "all-reduce");
  return submit([=] { ZERONE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD)); });
}

Work MpiCommunicator::reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) {
  int count = checked_count(shard_n, "reduce-scatter");
  const void* send = in == out ? MPI_IN_PLACE : in;
  return submit([=] {
    ZERONE_MPI_CHECK(MPI_Reduce_scatter_block(send, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  });
}

Work MpiCommunicator::all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) {
  ZERONE_ASSERT(stride_bytes >= bytes, "all-gather slots of ", stride_bytes, " bytes cannot hold ", bytes);
  int count = checked_count(bytes, "all-gather");
  const bool in_place = in == static_cast<const char*>(out) + static_cast<size_t>(rank_) * stride_bytes;
  const void* send = in_place ? MPI_IN_PLACE : in;
  if (stride_bytes == bytes) {
    return submit([=] {
      ZERONE_MPI_CHECK(MPI_Allgather(send, in_place ? 0 : count, MPI_BYTE, out, count, MPI_BYTE, MPI_COMM_WORLD));
    });
  }
  // Slots apart: MPI_Allgatherv places rank r's bytes at displacement r*stride.
  const size_t span = static_cast<size_t>(world_ - 1) * stride_bytes + bytes;
  ZERONE_CHECK(span <= static_cast<size_t>(INT_MAX), "a sliced all-gather spans ", span,
               " bytes, beyond MPI's int displacements; raise allgather_bucket_size to gather whole units");
  std::vector<int> counts(world_, count), displs(world_);
  for (int r = 0; r < world_; ++r) displs[r] = static_cast<int>(static_cast<size_t>(r) * stride_bytes);
  return submit([=, counts = std::move(counts), displs = std::move(displs)] {
    ZERONE_MPI_CHECK(MPI_Allgatherv(send, in_place ? 0 : count, MPI_BYTE, out, counts.data(), displs.data(), MPI_BYTE,
                                    MPI_COMM_WORLD));
  });
}

Work MpiCommunicator::broadcast_async(void* data, size_t bytes, int root) {
  int count = checked_count(bytes, "broadcast");
  return submit([=] { ZERONE_MPI_CHECK(MPI_Bcast(data, count, MPI_BYTE, root, MPI_COMM_WORLD)); });
}

Work MpiCommunicator::barrier_async() {
  return submit([] { ZERONE_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); });
}

void MpiCommunicator::abort_job(int exit_code) { MPI_Abort(MPI_COMM_WORLD, exit_code); }

std::unique_ptr<Communicator> make_communicator() {
  if (!launched_by_mpi()) return std::make_unique<SingleProcessCommunicator>();
  return std::make_unique<MpiCommunicator>();
}

}  // namespace zerone::comm
