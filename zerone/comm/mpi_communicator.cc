#include "zerone/comm/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
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

// One rank's word to rank 0: "I enter collective `seq`, `name`, during `phase`".
struct Announcement {
  int64_t seq = 0;
  char name[32] = {};
  char phase[64] = {};
};

struct CollectiveWatch {
  MPI_Comm comm = MPI_COMM_NULL;  // a duplicate of the world: its messages never meet a collective's
  int rank = 0, world = 1;
  int64_t seq = 0;                // world collectives this rank entered
  Announcement mine;
  // Rank 0: the last announcement of every rank, and one receive posted per other rank.
  std::vector<Announcement> last, incoming;
  std::vector<MPI_Request> receives;
  // The others: announcements and answers in flight, and the receive of rank 0's "are you
  // there?" (sent when a collective timed out although every rank entered it).
  std::deque<std::pair<MPI_Request, std::unique_ptr<Announcement>>> sends;
  MPI_Request probe = MPI_REQUEST_NULL;
  int64_t probe_buffer = 0;
  // Rank 0's ping of the others when a collective times out (unanswered_after_ping).
  int64_t ping_out = 0;
  std::vector<Announcement> answers_in;

  // Rank 0, once (the collective that asks then fails, and so does the worker): pings every other
  // rank and returns, in rank order, those that did not answer within `seconds`. An answer updates
  // that rank's last announcement. Unanswered receives are cancelled and unfinished pings freed;
  // their buffers are members, so a late completion writes into live memory. A rank answers from
  // its polling loop, inside a collective (perhaps on a sub-communicator, after its last world
  // one), so an answer means "alive, and waiting on someone".
  std::vector<int> unanswered_after_ping(double seconds) {
    ZERONE_ASSERT(rank == 0 && answers_in.empty(), "pinged twice, or from rank ", rank);
    ping_out = seq;
    answers_in.assign(world, Announcement{});
    std::vector<MPI_Request> pings(world, MPI_REQUEST_NULL), answers(world, MPI_REQUEST_NULL);
    for (int r = 1; r < world; ++r) {
      MPI_Isend(&ping_out, 1, MPI_INT64_T, r, 1, comm, &pings[r]);
      MPI_Irecv(&answers_in[r], sizeof(Announcement), MPI_BYTE, r, 2, comm, &answers[r]);
    }
    std::vector<bool> answered(world, false);
    int answering = 0;
    const auto asked = std::chrono::steady_clock::now();
    while (answering < world - 1 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count() < seconds) {
      for (int r = 1; r < world; ++r)
        if (!answered[r]) {
          int done = 0;
          MPI_Test(&answers[r], &done, MPI_STATUS_IGNORE);
          if (done) answered[r] = true, ++answering;
        }
      poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<int> unanswered;
    for (int r = 1; r < world; ++r) {
      if (answered[r]) {
        if (answers_in[r].seq > last[r].seq) last[r] = answers_in[r];
      } else {
        unanswered.push_back(r);
        MPI_Cancel(&answers[r]);
        MPI_Request_free(&answers[r]);
      }
      int sent = 0;
      MPI_Test(&pings[r], &sent, MPI_STATUS_IGNORE);
      if (!sent) MPI_Request_free(&pings[r]);
    }
    return unanswered;
  }

  void poll() {
    if (rank == 0) {
      for (int r = 1; r < world; ++r)
        for (;;) {
          int done = 0;
          MPI_Test(&receives[r], &done, MPI_STATUS_IGNORE);
          if (!done) break;
          last[r] = incoming[r];
          MPI_Irecv(&incoming[r], sizeof(Announcement), MPI_BYTE, r, 0, comm, &receives[r]);
        }
    }
    if (rank != 0 && probe != MPI_REQUEST_NULL) {
      int asked = 0;
      MPI_Test(&probe, &asked, MPI_STATUS_IGNORE);
      if (asked) {  // answer with where this rank is
        auto message = std::make_unique<Announcement>(mine);
        MPI_Request request;
        MPI_Isend(message.get(), sizeof(Announcement), MPI_BYTE, 0, 2, comm, &request);
        sends.emplace_back(request, std::move(message));
        MPI_Irecv(&probe_buffer, 1, MPI_INT64_T, 0, 1, comm, &probe);
      }
    }
    while (!sends.empty()) {
      int done = 0;
      MPI_Test(&sends.front().first, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      sends.pop_front();
    }
  }
};

namespace {
std::string describe(const Announcement& a) {
  if (a.seq == 0) return "it entered no collective yet";
  return str_cat("its last collective was ", a.name, " #", a.seq, " (", a.phase, ")");
}

}  // namespace

MpiWorker::MpiWorker() : thread_([this] { loop(); }) {}

MpiWorker::~MpiWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (watch_) {  // the worker has stopped: MPI is this thread's now
    watch_->receives.push_back(watch_->probe);
    for (MPI_Request& r : watch_->receives)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      }
    for (auto& [request, message] : watch_->sends) MPI_Wait(&request, MPI_STATUS_IGNORE);
    MPI_Comm_free(&watch_->comm);
  }
}

void MpiWorker::watch_world(void* world_comm, int rank, int world) {
  auto w = std::make_unique<CollectiveWatch>();
  ZERONE_MPI_CHECK(MPI_Comm_dup(*static_cast<MPI_Comm*>(world_comm), &w->comm));
  w->rank = rank;
  w->world = world;
  if (rank == 0) {
    w->last.resize(world);
    w->incoming.resize(world);
    w->receives.assign(world, MPI_REQUEST_NULL);
    for (int r = 1; r < world; ++r)
      ZERONE_MPI_CHECK(MPI_Irecv(&w->incoming[r], sizeof(Announcement), MPI_BYTE, r, 0, w->comm, &w->receives[r]));
  } else {
    ZERONE_MPI_CHECK(MPI_Irecv(&w->probe_buffer, 1, MPI_INT64_T, 0, 1, w->comm, &w->probe));
  }
  watch_ = std::move(w);
}

void MpiWorker::entering(const char* name, const std::string& phase) {
  if (!watch_) return;
  CollectiveWatch& w = *watch_;
  Announcement a;
  a.seq = ++w.seq;
  std::strncpy(a.name, name, sizeof a.name - 1);
  std::strncpy(a.phase, phase.c_str(), sizeof a.phase - 1);
  w.mine = a;
  if (w.rank == 0) {
    w.last[0] = a;
    return;
  }
  auto message = std::make_unique<Announcement>(a);
  MPI_Request request;
  ZERONE_MPI_CHECK(MPI_Isend(message.get(), sizeof(Announcement), MPI_BYTE, 0, 0, w.comm, &request));
  w.sends.emplace_back(request, std::move(message));
  w.poll();
}

void MpiWorker::wait(void* request_ptr, const char* name, const std::string& phase, bool world, int comm_size) {
  MPI_Request& request = *static_cast<MPI_Request*>(request_ptr);
  const auto t0 = std::chrono::steady_clock::now();
  const double timeout = timeout_s_.load();
  // Ranks other than 0 give rank 0 time to end the job with the message that names the missing ranks.
  const bool reporter = !world || !watch_ || watch_->rank == 0;
  const double limit = reporter ? timeout : timeout + std::max(2.0, 0.2 * timeout);
  for (int polls = 0;; ++polls) {
    int done = 0;
    ZERONE_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (watch_) watch_->poll();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited > limit) {
      const std::string what = str_cat(name, world && watch_ ? str_cat(" #", watch_->seq) : "", " (", phase, ")");
      if (!world || !watch_)
        throw Error(str_cat("collective ", what, " on a sub-communicator of ", comm_size,
                            " ranks did not complete within --comm-timeout ", timeout, " s"));
      if (!reporter)
        throw Error(str_cat("collective ", what, " did not complete within --comm-timeout ", timeout,
                            " s, and rank 0, which knows which ranks arrived, did not end the job first: rank 0 ",
                            "itself may be stopped, stuck or cut off"));
      // Who is unreachable: every other rank is pinged, and the ones that do not answer within a
      // second are named: those that never entered this collective ("did not arrive") and those
      // that entered but no longer answer ("stopped answering"); a cut link takes down ranks in
      // both groups at once. A live rank answers from its own polling loop within milliseconds, so
      // a rank that did not arrive but answers is alive and waits in an earlier collective, most
      // likely on the silent ones: it is mentioned, not blamed.
      CollectiveWatch& w = *watch_;
      std::vector<int> absent, silent, behind;
      for (int r : w.unanswered_after_ping(1.0)) (w.last[r].seq < w.seq ? absent : silent).push_back(r);
      for (int r = 1; r < w.world; ++r)
        if (w.last[r].seq < w.seq && std::find(absent.begin(), absent.end(), r) == absent.end()) behind.push_back(r);
      auto list = [](const std::vector<int>& ranks) {
        std::string out;
        for (size_t i = 0; i < ranks.size(); ++i) out += str_cat(i ? ", " : "", ranks[i]);
        return out;
      };
      std::string waiting;
      for (int r : behind) waiting += str_cat("; rank ", r, " answers but has not arrived: ", describe(w.last[r]));
      if (absent.empty() && silent.empty())
        throw Error(str_cat("collective ", what, " did not complete within --comm-timeout ", timeout,
                            " s although every rank answers", waiting,
                            " (a failing network link, or ranks that issued different collectives?)"));
      std::vector<int> named = absent;
      named.insert(named.end(), silent.begin(), silent.end());
      std::sort(named.begin(), named.end());
      std::string where;
      for (int r : named) where += str_cat("; rank ", r, ": ", describe(w.last[r]));
      const std::string how = silent.empty()  ? std::string(" did not arrive")
                              : absent.empty() ? std::string(" stopped answering")
                                               : str_cat(" did not arrive (", list(absent), ") or stopped answering (",
                                                         list(silent), ")");
      throw Error(str_cat(named.size() == 1 ? "rank " : "ranks ", list(named), how, " in ", what,
                          " within --comm-timeout ", timeout, " s", where,
                          " (a stopped, deadlocked or stuck rank, or one cut off from the network)",
                          behind.empty() ? "" : str_cat(waiting, ", waiting on ", named.size() == 1 ? "it" : "them")));
    }
    // Spin briefly (a collective usually completes in microseconds), then poll gently.
    if (polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(polls > 20000 ? 1000 : 100));
  }
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
  // Note [A failed worker fails fast]: once one operation on this thread has failed (a collective
  // timed out, MPI returned an error), the ranks no longer agree on which collective comes next, so
  // nothing queued behind it is started: each fails at once with the first failure itself, which is
  // what the user must read whichever Work the training thread waits on first. Were they started,
  // each would wait out its own --comm-timeout, and a rank unwinding from the first error
  // (destructors wait on their outstanding Works) would print it only after all of them: a stage-3
  // step has several gathers queued, so a 20 s timeout became 60 s and more.
  std::packaged_task<void()> task([this, op = std::move(op)] {
    if (failure_) std::rethrow_exception(failure_);
    try {
      op();
    } catch (...) {
      failure_ = std::current_exception();
      throw;
    }
  });
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
  if (world_ > 1) worker_->watch_world(comm_, rank_, world_);
}

Work MpiCommunicator::collective(const char* name, std::function<int(void* request)> start) {
  MpiWorker* worker = worker_.get();
  const bool world = owns_mpi_;
  const int size = world_;
  std::string phase = worker_->phase();
  return submit([=, start = std::move(start), phase = std::move(phase)] {
    if (world) worker->entering(name, phase);
    MPI_Request request = MPI_REQUEST_NULL;
    ZERONE_MPI_CHECK(start(&request));
    worker->wait(&request, name, phase, world, size);
  });
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<MpiWorker> worker, void* comm, std::string library, int rank, int world,
                                 Hosts hosts)
    : rank_(rank), world_(world), library_(std::move(library)), comm_(comm), worker_(std::move(worker)),
      hosts_(std::move(hosts)) {}

template <typename F> void MpiCommunicator::count(F to_peer) const { count_traffic(hosts_, rank_, to_peer); }

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
  return collective("all-reduce", [=](void* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, comm, static_cast<MPI_Request*>(r));
  });
}

Work MpiCommunicator::all_reduce_sum_async(double* data, size_t n) {
  MPI_Comm comm = handle(comm_);
  int count = checked_count(n, "all-reduce");
  this->count([&](int) { return 2 * n * sizeof(double) / static_cast<size_t>(world_); });
  return collective("all-reduce", [=](void* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_DOUBLE, MPI_SUM, comm, static_cast<MPI_Request*>(r));
  });
}

Work MpiCommunicator::reduce_scatter_sum_async(const float* in, float* out, size_t shard_n) {
  MPI_Comm comm = handle(comm_);
  int count = checked_count(shard_n, "reduce-scatter");
  const void* send = in == out ? MPI_IN_PLACE : in;
  this->count([&](int) { return shard_n * sizeof(float); });
  return collective("reduce-scatter", [=](void* r) {
    return MPI_Ireduce_scatter_block(send, out, count, MPI_FLOAT, MPI_SUM, comm, static_cast<MPI_Request*>(r));
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
    return collective("all-gather", [=](void* r) {
      return MPI_Iallgather(send, in_place ? 0 : count, MPI_BYTE, out, count, MPI_BYTE, comm, static_cast<MPI_Request*>(r));
    });
  }
  // Slots apart: MPI_Allgatherv places rank r's bytes at displacement r*stride.
  const size_t span = static_cast<size_t>(world_ - 1) * stride_bytes + bytes;
  ZERONE_CHECK(span <= static_cast<size_t>(INT_MAX), "a sliced all-gather spans ", span,
               " bytes, beyond MPI's int displacements; raise allgather_bucket_size to gather whole units");
  std::vector<int> counts(world_, count), displs(world_);
  for (int r = 0; r < world_; ++r) displs[r] = static_cast<int>(static_cast<size_t>(r) * stride_bytes);
  auto shared_counts = std::make_shared<std::vector<int>>(std::move(counts));
  auto shared_displs = std::make_shared<std::vector<int>>(std::move(displs));
  return collective("all-gather", [=](void* r) {
    return MPI_Iallgatherv(send, in_place ? 0 : count, MPI_BYTE, out, shared_counts->data(), shared_displs->data(),
                           MPI_BYTE, comm, static_cast<MPI_Request*>(r));
  });
}

Work MpiCommunicator::broadcast_async(void* data, size_t bytes, int root) {
  MPI_Comm comm = handle(comm_);
  int count = checked_count(bytes, "broadcast");
  if (rank_ == root) this->count([&](int) { return bytes; });
  return collective("broadcast", [=](void* r) {
    return MPI_Ibcast(data, count, MPI_BYTE, root, comm, static_cast<MPI_Request*>(r));
  });
}

Work MpiCommunicator::barrier_async() {
  MPI_Comm comm = handle(comm_);
  return collective("barrier", [=](void* r) { return MPI_Ibarrier(comm, static_cast<MPI_Request*>(r)); });
}

Work MpiCommunicator::all_to_all_async(const void* in, void* out, size_t bytes) {
  MPI_Comm comm = handle(comm_);
  ZERONE_ASSERT(in != out, "all-to-all is not in place");
  int count = checked_count(bytes, "all-to-all");
  this->count([&](int) { return bytes; });
  return collective("all-to-all", [=](void* r) {
    return MPI_Ialltoall(in, count, MPI_BYTE, out, count, MPI_BYTE, comm, static_cast<MPI_Request*>(r));
  });
}

void MpiCommunicator::abort_job(int exit_code) { MPI_Abort(MPI_COMM_WORLD, exit_code); }  // the whole job

std::unique_ptr<Communicator> make_communicator() {
  if (!launched_by_mpi()) return std::make_unique<SingleProcessCommunicator>();
  return std::make_unique<MpiCommunicator>();
}

}  // namespace zerone::comm
