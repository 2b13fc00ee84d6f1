#include "zerone/comm/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "zerone/comm/traffic.h"
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

MpiWorker::MpiWorker() : thread_([this] { loop(); }) {}

MpiWorker::~MpiWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MpiWorker::loop() {
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

Work MpiWorker::submit(std::function<void()> op) {
  std::packaged_task<void()> task(std::move(op));
  Work work(task.get_future().share());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return work;
}

namespace {
MPI_Comm& handle(void* comm) { return *static_cast<MPI_Comm*>(comm); }
}  // namespace

MpiCommunicator::MpiCommunicator() : owns_mpi_(true), comm_(new MPI_Comm(MPI_COMM_WORLD)) {
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
  // Note [Hosts of ranks]: every rank's hostname, once.
  constexpr size_t kName = 256;
  std::vector<char> names(kName * static_cast<size_t>(world_), '\0');
  const std::string mine = this_hostname().substr(0, kName - 1);
  std::copy(mine.begin(), mine.end(), names.begin() + static_cast<ptrdiff_t>(kName * rank_));
  ZERONE_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, names.data(), kName, MPI_BYTE, MPI_COMM_WORLD));
  for (int r = 0; r < world_; ++r) {
    const std::string name(names.data() + kName * static_cast<size_t>(r));
    auto it = std::find(hosts_.names.begin(), hosts_.names.end(), name);
    if (it == hosts_.names.end()) it = hosts_.names.insert(hosts_.names.end(), name);
    hosts_.of_member.push_back(static_cast<int>(it - hosts_.names.begin()));
  }
  worker_ = std::make_shared<MpiWorker>();
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<MpiWorker> worker, void* comm, std::string library, int rank, int world,
                                 Hosts hosts)
    : rank_(rank), world_(world), library_(std::move(library)), comm_(comm), worker_(std::move(worker)),
      hosts_(std::move(hosts)) {}

template <typename F> void MpiCommunicator::count(F to_peer) const {
  Traffic& traffic = Traffic::global();
  const int mine = hosts_.of_member[rank_];
  for (int p = 0; p < world_; ++p)
    if (p != rank_) traffic.add(hosts_.of_member[p] == mine, static_cast<uint64_t>(to_peer(p)));
}

MpiCommunicator::~MpiCommunicator() {
  if (owns_mpi_) {
    worker_.reset();  // joined: the last MPI call of the worker has returned
    MPI_Finalize();
  } else {
    void* comm = comm_;
    try {
      submit([comm] { MPI_Comm_free(&handle(comm)); }).wait();
    } catch (...) {  // a failed free at the end of a run loses nothing
    }
  }
  delete static_cast<MPI_Comm*>(comm_);
}

std::unique_ptr<Communicator> MpiCommunicator::split_with(const std::function<void(void* new_comm)>& make) {
  auto* fresh = new MPI_Comm(MPI_COMM_NULL);
  int rank = 0, world = 1;
  std::vector<int> parent_ranks;  // of the new communicator's members
  MPI_Comm parent = handle(comm_);
  try {
    submit([&] {  // every MPI call on the worker (MPI_THREAD_SERIALIZED)
      make(fresh);
      MPI_Comm_set_errhandler(*fresh, MPI_ERRORS_RETURN);
      MPI_Comm_rank(*fresh, &rank);
      MPI_Comm_size(*fresh, &world);
      MPI_Group mine, theirs;
      MPI_Comm_group(*fresh, &mine);
      MPI_Comm_group(parent, &theirs);
      std::vector<int> members(static_cast<size_t>(world));
      for (int i = 0; i < world; ++i) members[i] = i;
      parent_ranks.resize(static_cast<size_t>(world));
      MPI_Group_translate_ranks(mine, world, members.data(), theirs, parent_ranks.data());
      MPI_Group_free(&mine);
      MPI_Group_free(&theirs);
    }).wait();
  } catch (...) {
    delete fresh;
    throw;
  }
  // Note [Hosts of ranks]: the members' hosts, through the parent's; names in first-member order.
  Hosts hosts;
  for (int p : parent_ranks) {
    const std::string& name = hosts_.names[hosts_.of_member[p]];
    auto it = std::find(hosts.names.begin(), hosts.names.end(), name);
    if (it == hosts.names.end()) it = hosts.names.insert(hosts.names.end(), name);
    hosts.of_member.push_back(static_cast<int>(it - hosts.names.begin()));
  }
  return std::unique_ptr<Communicator>(new MpiCommunicator(worker_, fresh, library_, rank, world, std::move(hosts)));
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  ZERONE_ASSERT(color >= 0, "split: color ", color, " must not be negative");
  MPI_Comm parent = handle(comm_);
  return split_with([=](void* fresh) { ZERONE_MPI_CHECK(MPI_Comm_split(parent, color, key, &handle(fresh))); });
}

std::unique_ptr<Communicator> MpiCommunicator::split_by_host() {
  MPI_Comm parent = handle(comm_);
  const int rank = rank_;
  return split_with([=](void* fresh) {
    ZERONE_MPI_CHECK(MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &handle(fresh)));
  });
}

Work MpiCommunicator::all_reduce_sum_async(float* data, size_t n) {
  MPI_Comm comm = handle(comm_);
  int count = checked_count(n, "all-reduce");
  this->count([&](int) { return 2 * n * sizeof(float) / static_cast<size_t>(world_); });
  return submit([=] { ZERONE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, comm)); });
}

Work MpiCommunicator::all_reduce_sum_async(double* data, size_t n) {
  MPI_Comm comm = handle(comm_);
  int count = checked_count(n, "all-reduce");
  this->count([&](int) { return 2 * n * sizeof(double) / static_cast<size_t>(world_); });
  return submit([=] { ZERONE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_DOUBLE, MPI_SUM, comm)); });
}

Work MpiCommunicator::reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) {
  MPI_Comm comm = handle(comm_);
  int count = checked_count(shard_n, "reduce-scatter");
  const void* send = in == out ? MPI_IN_PLACE : in;
  this->count([&](int) { return shard_n * sizeof(float); });
  return submit([=] {
    ZERONE_MPI_CHECK(MPI_Reduce_scatter_block(send, out, count, MPI_FLOAT, MPI_SUM, comm));
  });
}

Work MpiCommunicator::all_gather_strided_async(const void* in, void* out, size_t bytes, size_t stride_bytes) {
  MPI_Comm comm = handle(comm_);
  ZERONE_ASSERT(stride_bytes >= bytes, "all-gather slots of ", stride_bytes, " bytes cannot hold ", bytes);
  int count = checked_count(bytes, "all-gather");
  const bool in_place = in == static_cast<const char*>(out) + static_cast<size_t>(rank_) * stride_bytes;
  const void* send = in_place ? MPI_IN_PLACE : in;
  this->count([&](int) { return bytes; });
  if (stride_bytes == bytes) {
    return submit([=] {
      ZERONE_MPI_CHECK(MPI_Allgather(send, in_place ? 0 : count, MPI_BYTE, out, count, MPI_BYTE, comm));
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
                                    comm));
  });
}

Work MpiCommunicator::broadcast_async(void* data, size_t bytes, int root) {
  MPI_Comm comm = handle(comm_);
  int count = checked_count(bytes, "broadcast");
  if (rank_ == root) this->count([&](int) { return bytes; });
  return submit([=] { ZERONE_MPI_CHECK(MPI_Bcast(data, count, MPI_BYTE, root, comm)); });
}

Work MpiCommunicator::barrier_async() {
  MPI_Comm comm = handle(comm_);
  return submit([=] { ZERONE_MPI_CHECK(MPI_Barrier(comm)); });
}

Work MpiCommunicator::all_to_all_async(const void* in, void* out, size_t bytes) {
  MPI_Comm comm = handle(comm_);
  ZERONE_ASSERT(in != out, "all-to-all is not in place");
  int count = checked_count(bytes, "all-to-all");
  this->count([&](int) { return bytes; });
  return submit([=] { ZERONE_MPI_CHECK(MPI_Alltoall(in, count, MPI_BYTE, out, count, MPI_BYTE, comm)); });
}

void MpiCommunicator::abort_job(int exit_code) { MPI_Abort(MPI_COMM_WORLD, exit_code); }  // the whole job

std::unique_ptr<Communicator> make_communicator() {
  if (!launched_by_mpi()) return std::make_unique<SingleProcessCommunicator>();
  return std::make_unique<MpiCommunicator>();
}

}  // namespace zerone::comm
